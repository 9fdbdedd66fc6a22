//! A lake whose SQL catalog is a PostgreSQL database (a database of the
//! harness's server), as other engines share it: runs load, stream and
//! restart against it, pyiceberg's `SqlCatalog` (psycopg2) and DuckDB
//! (the metadata location read from the catalog's table) read what it
//! wrote under the catalog name it was given, the writer lock is an
//! advisory lock in that database, and its password is never shown.

use tokio::process::Command;

use crate::support::readers::{
    RemoteLake, change_customers, create_customers, customers_run, id_plan_pairs, loaded_customers,
};
use crate::support::*;

#[tokio::test]
async fn a_catalog_in_postgresql_is_written_read_by_other_engines_and_locked_in_the_database() {
    let db = TestDb::new().await;
    create_customers(&db).await;
    // The catalog's database: empty; the catalog makes its tables. The
    // harness's server trusts every login, so the password is only shown
    // (or not).
    let catalog_db = TestDb::new().await;
    let secret = "n0t-t0-be-sh0wn";
    let catalog_uri =
        catalog_db
            .config_url()
            .replacen("postgres@", &format!("postgres:{secret}@"), 1);
    let dir = tempfile::tempdir().unwrap();
    let lake_dir = dir.path().join("lake");
    let lake_arg = lake_dir.display().to_string();
    let slot = unique("pgcat");
    let place = [
        "--lake",
        &lake_arg,
        "--catalog-uri",
        &catalog_uri,
        "--catalog-name",
        "lakehouse",
        "--namespace",
        "shop",
    ];
    let run = customers_run(&db, &slot, &place);
    let idle = |args: &[String]| [args, &["--exit-when-idle".into(), "1s".into()]].concat();
    let out = logged(&idle(&run)).await;
    assert_success(&out);
    assert!(
        !lake_dir.join("catalog.db").exists(),
        "no SQLite catalog beside the warehouse"
    );
    let read = RemoteLake::with_catalog(&lake_dir, catalog_db.config_url()).named("lakehouse");
    assert_eq!(
        id_plan_pairs(&read.pyiceberg("shop.customers", "rows").await),
        loaded_customers()
    );
    // Every table is the named catalog's, none the default's.
    let names: Vec<String> = catalog_db
        .client
        .query("SELECT DISTINCT catalog_name FROM iceberg_tables", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(names, ["lakehouse"]);

    change_customers(&db).await;
    let restarted = logged(&idle(&run)).await;
    assert_success(&restarted);
    read.assert_customers_changed().await;

    // A running run holds the namespace's lock in the catalog's database:
    // a compaction (from anywhere that reaches the catalog) is refused,
    // and takes it once the run is gone, however it went.
    let compact: Vec<&str> = ["compact"].iter().chain(&place).copied().collect();
    let mut running = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(&run)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    db.wait_until_active(&slot).await;
    let refused = cli(&compact).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains("another wal2iceberg process")
            && stderr.contains("advisory lock"),
        "{stderr}"
    );
    assert!(!stderr.contains(secret), "{stderr}");
    running.kill().await.unwrap();
    running.wait().await.unwrap();
    let compacted = cli(&compact).await;
    assert_success(&compacted);
    // The lake commands read the config file a run reads, its catalog
    // table included.
    let config = dir.path().join("wal2iceberg.toml");
    std::fs::write(
        &config,
        format!(
            "lake = {lake_arg:?}\nnamespace = \"shop\"\n[catalog]\ntype = \"sql\"\nuri = {catalog_uri:?}\nname = \"lakehouse\"\n"
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let from_file = cli(&["compact", "--config", &config]).await;
    assert_success(&from_file);
    let from_file = cli(&["show", "customers", "--config", &config, "--format", "csv"]).await;
    assert_success(&from_file);
    assert!(String::from_utf8_lossy(&from_file.stdout).contains("Barbara"));
    // The wrong catalog name: the error names the ones the database holds.
    for table in ["customers", "shop.customers"] {
        let wrong = cli(&[
            "show",
            table,
            "--config",
            &config,
            "--catalog-name",
            "local",
        ])
        .await;
        let stderr = String::from_utf8_lossy(&wrong.stderr);
        assert_eq!(wrong.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("catalog name \"local\"")
                && stderr.contains("the catalogs lakehouse: choose one with --catalog-name"),
            "{stderr}"
        );
    }

    // The commands that read the lake take the same setting.
    let out = cli(&[
        "show",
        "customers",
        "--lake",
        &lake_arg,
        "--catalog-uri",
        &catalog_uri,
        "--catalog-name",
        "lakehouse",
        "--format",
        "json",
    ])
    .await;
    assert_success(&out);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("Barbara") && !shown.contains("Linus"),
        "{shown}"
    );
    for out in [&out, &restarted, &compacted, &from_file] {
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!all.contains(secret), "the password is shown: {all}");
    }
}

#[tokio::test]
async fn a_postgresql_catalogs_transaction_shows_a_batch_in_both_tables_at_once() {
    let catalog_db = TestDb::new().await;
    let uri = catalog_db.config_url();
    crate::atomic_commits::two_tables_are_seen_together(
        &["--catalog-uri", &uri],
        vec![("READ_LAKE_CATALOG_URI", uri.clone())],
    )
    .await;
}

/// The writer lock in a PostgreSQL catalog is its connection's: once that
/// connection is gone (here terminated, as a restart of the catalog's
/// server ends it) the lock says it no longer holds, and another process
/// can take it; a run then takes it again before its next start.
#[tokio::test]
async fn a_catalog_lock_whose_connection_ended_says_so() {
    use wal2iceberg::lake::catalog::{CatalogChoice, LakeLocation, namespace};
    use wal2iceberg::lake::lock::WriterLock;

    let catalog_db = TestDb::new().await;
    let uri = catalog_db.config_url();
    let dir = tempfile::tempdir().unwrap();
    let choice = CatalogChoice {
        uri: Some(&uri),
        ..CatalogChoice::default()
    };
    let lake = LakeLocation::configure(dir.path(), &choice).unwrap();
    let shop = namespace("shop");
    let mut lock = WriterLock::acquire(&lake, &shop).await.unwrap();
    assert!(lock.holds().await);
    assert!(WriterLock::acquire(&lake, &shop).await.is_err());
    catalog_db
        .exec(
            "SELECT pg_terminate_backend(pid) FROM pg_locks \
             WHERE locktype = 'advisory' AND pid <> pg_backend_pid() \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .await;
    assert!(!lock.holds().await, "the lock went with its connection");
    WriterLock::acquire(&lake, &shop).await.unwrap();
}

/// A run whose writer lock in a PostgreSQL catalog went with its
/// connection (terminated here, as a restart of the catalog's server ends
/// it) commits nothing while another process holds the lock, goes on
/// running, and takes the lock again once that process let go: the
/// changes made meanwhile land then, once.
#[tokio::test]
async fn a_run_that_lost_its_catalog_lock_commits_nothing_until_it_took_it_again() {
    use std::time::{Duration, Instant};
    use wal2iceberg::lake::catalog::{CatalogChoice, LakeLocation, namespace};
    use wal2iceberg::lake::lock::WriterLock;

    let db = TestDb::new().await;
    create_customers(&db).await;
    let catalog_db = TestDb::new().await;
    let uri = catalog_db.config_url();
    let dir = tempfile::tempdir().unwrap();
    let lake_arg = dir.path().display().to_string();
    let slot = unique("lostlock");
    let place = [
        "--lake",
        &lake_arg,
        "--catalog-uri",
        &uri,
        "--namespace",
        "shop",
    ];
    let mut running = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(customers_run(&db, &slot, &place))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let confirmed_past = async |target| {
        let give_up = Instant::now() + Duration::from_secs(180);
        while db.confirmed_flush(&slot).await < Some(target) {
            assert!(Instant::now() < give_up, "the run never confirmed {target}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    db.wait_until_active(&slot).await;
    confirmed_past(db.wal_insert_lsn().await).await;

    let holders = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' \
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    catalog_db
        .exec(&format!(
            "SELECT pg_terminate_backend(pid) FROM ({holders}) h"
        ))
        .await;
    let lake = LakeLocation::configure(
        dir.path(),
        &CatalogChoice {
            uri: Some(&uri),
            ..CatalogChoice::default()
        },
    )
    .unwrap();
    let give_up = Instant::now() + Duration::from_secs(30);
    let ours = loop {
        match WriterLock::acquire(&lake, &namespace("shop")).await {
            Ok(lock) => break lock,
            Err(e) => assert!(Instant::now() < give_up, "the run's lock stayed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    change_customers(&db).await;
    let target = db.wal_insert_lsn().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        db.confirmed_flush(&slot).await < Some(target),
        "the run committed while another process held the lake's lock"
    );
    assert!(running.try_wait().unwrap().is_none(), "the run stopped");

    drop(ours);
    confirmed_past(target).await;
    let held = catalog_db.client.query(holders, &[]).await.unwrap();
    assert_eq!(held.len(), 1, "the run holds the lock again");
    RemoteLake::with_catalog(dir.path(), uri.clone())
        .assert_customers_changed()
        .await;
    running.kill().await.unwrap();
}
