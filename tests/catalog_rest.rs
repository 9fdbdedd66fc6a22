//! A lake behind an Iceberg REST catalog (rustberg, a server we did not
//! write, started by the harness) with its warehouse on S3 (moto): runs
//! load, stream and restart through it, compaction and expiry commit
//! through it, and pyiceberg's `RestCatalog` and DuckDB (the metadata
//! location the catalog serves) read what it wrote from S3; the oracle's
//! random workload under random kills and a crash before a commit lose and
//! repeat nothing there.

use crate::support::oracle::{Oracle, RemoteSettings};
use crate::support::readers::{
    RemoteLake, change_customers, create_customers, customers_run, id_plan_pairs, loaded_customers,
};
use crate::support::rest::RestServer;
use crate::support::s3::S3Server;
use crate::support::*;

/// A REST catalog whose warehouse is `wh/` in a new bucket of `s3`; the
/// readers' settings for it, and the bucket.
async fn rest_on_s3(
    dir: &std::path::Path,
    s3: &S3Server,
) -> (RestServer, Vec<(&'static str, String)>, String) {
    let bucket = s3.bucket("rest").await;
    let warehouse = format!("s3://{bucket}/wh");
    let server = RestServer::start_on_s3(dir, &warehouse, s3);
    let mut readers = RemoteLake::on_s3(dir, warehouse, s3).into_env();
    readers.push(("READ_LAKE_CATALOG_URI", server.uri.clone()));
    (server, readers, bucket)
}

#[tokio::test]
async fn a_rest_catalog_on_s3_is_written_through_its_commits_and_read_by_other_engines() {
    let db = TestDb::new().await;
    create_customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let (server, readers, bucket) = rest_on_s3(dir.path(), &s3).await;
    let lake_dir = dir.path().join("lake");
    let lake_arg = lake_dir.display().to_string();
    let slot = unique("restcat");
    let mut catalog = vec![
        "--lake",
        &lake_arg,
        "--catalog-type",
        "rest",
        "--catalog-uri",
        &server.uri,
        "--namespace",
        "shop",
    ];
    let properties = s3.properties();
    for property in &properties {
        catalog.extend(["--catalog-property", property]);
    }
    let run = customers_run(
        &db,
        &slot,
        &[&["--exit-when-idle", "1s"], &catalog[..]].concat(),
    );
    assert_success(&logged(&run).await);
    assert!(
        !lake_dir.join("catalog.db").exists() && !lake_dir.join("warehouse").exists(),
        "no SQLite catalog beside the REST one, no local warehouse"
    );
    assert!(s3.objects(&bucket, "wh/shop/customers/data/").await > 0);
    let read = RemoteLake::with_env(&lake_dir, readers);
    assert_eq!(
        id_plan_pairs(&read.pyiceberg("shop.customers", "rows").await),
        loaded_customers()
    );

    change_customers(&db).await;
    assert_success(&logged(&run).await);
    read.assert_customers_changed().await;

    // A rewrite and an expiry commit through the catalog too; the rows
    // stay, and the next run goes on from where the table is.
    let compact: Vec<&str> = ["compact"].iter().chain(&catalog).copied().collect();
    assert_success(&cli(&compact).await);
    let expire: Vec<&str> = [
        "expire-snapshots",
        "--older-than",
        "0s",
        "--retain-last",
        "1",
    ]
    .iter()
    .chain(&catalog)
    .copied()
    .collect();
    assert_success(&cli(&expire).await);
    let snapshots = read.pyiceberg("shop.customers", "snapshots").await;
    assert_eq!(snapshots.as_array().unwrap().len(), 1, "{snapshots}");
    db.exec("UPDATE customers SET plan = 'free' WHERE id = 2")
        .await;
    assert_success(&logged(&run).await);
    let want = [(1, "team".into()), (2, "free".into()), (4, "free".into())];
    assert_eq!(
        id_plan_pairs(&read.pyiceberg("shop.customers", "rows").await),
        want
    );
    assert_eq!(id_plan_pairs(&read.duckdb("shop.customers").await), want);
    assert_eq!(read.bronze_ops("shop.customers_changes").await, "rrrudcuu");

    let out = cli(&["show", "customers", "--format", "json"]
        .iter()
        .chain(&catalog)
        .copied()
        .collect::<Vec<_>>())
    .await;
    assert_success(&out);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("Barbara") && !shown.contains("Linus"),
        "{shown}"
    );
}

#[tokio::test]
async fn random_kills_and_a_crash_before_a_commit_on_a_rest_catalog_on_s3_lose_and_repeat_nothing()
{
    let mut oracle = Oracle::new(500).await;
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let (server, readers, _) = rest_on_s3(dir.path(), &s3).await;
    let remote = RemoteSettings {
        catalog_uri: Some(server.uri.clone()),
        warehouse: None,
        properties: s3.properties(),
        ..RemoteSettings::default()
    };
    oracle.on_remote_lake(remote, readers);
    oracle.kill_at_random(8, 19).await;
    // Data files written, the catalog not yet told: the next run streams
    // the batch again.
    let crashing = oracle.spawn_crashing_at("before-catalog-commit", 2);
    oracle.expect_crash(crashing, "before-catalog-commit").await;
    let (changes, rows) = oracle.finish().await;
    assert!(changes > 0 && rows > 0, "{changes} changes, {rows} rows");
}

#[tokio::test]
async fn a_rest_catalogs_multi_table_commits_show_a_transaction_in_both_tables_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = RestServer::start(dir.path(), &dir.path().join("warehouse"));
    crate::atomic_commits::two_tables_are_seen_together(
        &["--catalog-uri", &server.uri],
        vec![("READ_LAKE_CATALOG_URI", server.uri.clone())],
    )
    .await;
}
