//! A lake whose warehouse is on S3 (moto's server, started by the
//! harness): runs load, stream and restart against it, configured by
//! catalog properties and by the `AWS_*` variables, and pyiceberg and
//! DuckDB read the tables from S3.

use crate::support::gcs::GcsServer;
use crate::support::oracle::{Oracle, RemoteSettings};
use crate::support::readers::{
    RemoteLake, change_customers, create_customers, customers_run, id_plan_pairs, loaded_customers,
};
use crate::support::s3::S3Server;
use crate::support::*;

#[tokio::test]
async fn a_lake_on_s3_loads_streams_restarts_and_is_read_from_s3() {
    let server = S3Server::start();
    let bucket = server.bucket("lake").await;
    let db = TestDb::new().await;
    create_customers(&db).await;
    // A table whose folders share the first's name as a prefix.
    db.exec("CREATE TABLE customers2(id int PRIMARY KEY, plan text); INSERT INTO customers2 VALUES (9, 'pro')")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let lake_dir = dir.path().join("lake");
    let lake_arg = lake_dir.display().to_string();
    let warehouse = format!("s3://{bucket}/shop");
    let slot = unique("s3");
    let url = db.config_url();
    let run_args = |more: &[String]| {
        let mut args: Vec<String> = [
            "run",
            "--source",
            &url,
            "--tables",
            "public.customers,public.customers2",
            "--slot",
            &slot,
            "--lake",
            &lake_arg,
            "--warehouse",
            &warehouse,
            "--namespace",
            "shop",
            "--exit-when-idle",
            "1s",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend_from_slice(more);
        args
    };
    // Configured by catalog properties.
    let properties = property_flags(server.properties());
    assert_success(&cli(&run_args(&properties)).await);
    let s3 = RemoteLake::on_s3(&lake_dir, warehouse.clone(), &server);
    assert_eq!(
        id_plan_pairs(&s3.pyiceberg("shop.customers", "rows").await),
        loaded_customers()
    );
    assert!(
        !lake_dir.join("warehouse").exists(),
        "no local warehouse folder beside the catalog"
    );

    change_customers(&db).await;
    // Restarted with the AWS_* variables instead, as S3 users configure it.
    assert_success(&with_aws_env(&server, &run_args(&[])).await);
    // An expiry keeps an object just written that nothing refers to yet:
    // it may be on its way to another writer's commit.
    let young = "shop/shop/customers/data/in-flight-00000.parquet";
    server.put(&bucket, young, "not committed yet").await;
    let expire = expire_args(&lake_arg, &warehouse, "customers");
    let out = with_aws_env(&server, &expire).await;
    assert_success(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(" 0 orphan files deleted"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(server.objects(&bucket, young).await, 1);

    s3.assert_customers_changed().await;
    assert_eq!(
        s3.duckdb("shop.customers_changes")
            .await
            .as_array()
            .unwrap()
            .len(),
        7
    );

    // Without them, the error says what is missing.
    let out = cli(&["show", "customers", "--lake", &lake_arg]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("its files are in an object store; give the lake's"),
        "{stderr}"
    );
    // The commands that read the lake take the same settings.
    let mut show: Vec<String> = [
        "show",
        "customers",
        "--lake",
        &lake_arg,
        "--warehouse",
        &warehouse,
        "--format",
        "json",
    ]
    .map(str::to_owned)
    .to_vec();
    show.extend(properties);
    let out = cli(&show).await;
    assert_success(&out);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("Barbara") && !shown.contains("Linus"),
        "{shown}"
    );

    // drop-table deletes the table's objects, and only its own.
    let folder = |table: &str| format!("shop/shop/{table}/");
    assert!(server.objects(&bucket, &folder("customers")).await > 0);
    let drop = [
        "drop-table",
        "--source",
        &url,
        "--lake",
        &lake_arg,
        "--warehouse",
        &warehouse,
        "--namespace",
        "shop",
        "--table",
        "public.customers",
        "--yes",
    ];
    assert_success(&with_aws_env(&server, &drop).await);
    assert_eq!(server.objects(&bucket, &folder("customers")).await, 0);
    assert_eq!(
        server.objects(&bucket, &folder("customers_changes")).await,
        0
    );
    assert!(server.objects(&bucket, &folder("customers2")).await > 0);
    assert_eq!(
        id_plan_pairs(&s3.pyiceberg("shop.customers2", "rows").await),
        [(9, "pro".into())]
    );
}

/// The orphan sweep on S3: objects under a table's folders that nothing
/// refers to, two hours old (the server's clock set back), are deleted by
/// `expire-snapshots`, and the table's own files, as old, stay: readers
/// read every row and every change.
#[tokio::test]
async fn expire_snapshots_sweeps_old_orphans_on_s3_and_keeps_the_tables_files() {
    let server = S3Server::start_behind(7200);
    let bucket = server.bucket("orphans").await;
    let db = TestDb::new().await;
    create_customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let lake_dir = dir.path().join("lake");
    let lake = lake_dir.display().to_string();
    let warehouse = format!("s3://{bucket}/shop");
    let slot = unique("orphans");
    let place = [
        "--lake",
        &lake,
        "--warehouse",
        &warehouse,
        "--namespace",
        "shop",
        "--exit-when-idle",
        "1s",
    ];
    let run = customers_run(&db, &slot, &place);
    assert_success(&with_aws_env(&server, &run).await);
    change_customers(&db).await;
    assert_success(&with_aws_env(&server, &run).await);
    let table = "shop/shop/customers";
    let crashed = [
        format!("{table}/data/crashed-00000.parquet"),
        format!("{table}/metadata/99999-crashed.metadata.json"),
    ];
    for key in &crashed {
        server.put(&bucket, key, "left by a crash").await;
    }
    let out = with_aws_env(&server, &expire_args(&lake, &warehouse, "customers")).await;
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(" 2 orphan files deleted"), "{stdout}");
    for key in &crashed {
        assert_eq!(server.objects(&bucket, key).await, 0, "{key} kept");
    }
    RemoteLake::on_s3(&lake_dir, warehouse, &server)
        .assert_customers_changed()
        .await;
}

/// `--catalog-property` flags of `properties`.
fn property_flags(properties: Vec<String>) -> Vec<String> {
    properties
        .into_iter()
        .flat_map(|p| ["--catalog-property".to_owned(), p])
        .collect()
}

/// `expire-snapshots` of `table` on an object store lake: every snapshot
/// but the current one past, and orphans as old as the floor allows.
fn expire_args(lake: &str, warehouse: &str, table: &str) -> Vec<String> {
    [
        "expire-snapshots",
        "--lake",
        lake,
        "--warehouse",
        warehouse,
        "--older-than",
        "0s",
        "--retain-last",
        "1",
        table,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `wal2iceberg` with `args`, the server reached through the `AWS_*`
/// variables, to the end.
async fn with_aws_env<S: AsRef<std::ffi::OsStr>>(
    server: &S3Server,
    args: &[S],
) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(args)
        .envs(server.environment())
        .env("RUST_LOG", "wal2iceberg=warn")
        .output()
        .await
        .expect("start wal2iceberg")
}

#[tokio::test]
async fn random_kills_on_s3_with_a_catalog_in_postgresql_lose_and_repeat_nothing() {
    let server = S3Server::start();
    let bucket = server.bucket("oracle").await;
    let catalog_db = TestDb::new().await;
    let mut oracle = Oracle::new(500).await;
    let warehouse = format!("s3://{bucket}/lake");
    let mut readers = RemoteLake::on_s3(oracle.lake.path(), warehouse.clone(), &server).into_env();
    readers.push(("READ_LAKE_CATALOG_URI", catalog_db.config_url()));
    let remote = RemoteSettings {
        catalog_uri: Some(catalog_db.config_url()),
        warehouse: Some(warehouse),
        properties: server.properties(),
        ..RemoteSettings::default()
    };
    oracle.on_remote_lake(remote, readers);
    oracle.kill_at_random(8, 23).await;
    // Files on S3, the catalog not yet told: the next run streams the
    // batch again.
    let crashing = oracle.spawn_crashing_at("before-catalog-commit", 2);
    oracle.expect_crash(crashing, "before-catalog-commit").await;
    let (changes, rows) = oracle.finish().await;
    assert!(changes > 0 && rows > 0, "{changes} changes, {rows} rows");
}

/// A lake whose warehouse is on Google Cloud Storage (fake-gcs-server):
/// load, stream, a restart configured by `STORAGE_EMULATOR_HOST` (as
/// Google's libraries take an emulator) instead of properties, `verify`,
/// the orphan sweep (an old object nothing refers to goes, one just
/// written stays), and pyiceberg reading both tables from GCS.
#[tokio::test]
async fn a_lake_on_gcs_loads_streams_restarts_sweeps_and_is_read_from_gcs() {
    let server = GcsServer::start("lake");
    let db = TestDb::new().await;
    create_customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let lake_dir = dir.path().join("lake");
    let lake_arg = lake_dir.display().to_string();
    let warehouse = "gs://lake/shop".to_owned();
    let slot = unique("gcs");
    let place = [
        "--lake",
        &lake_arg,
        "--warehouse",
        &warehouse,
        "--namespace",
        "shop",
        "--exit-when-idle",
        "1s",
    ];
    let properties = property_flags(server.properties());
    let run = customers_run(&db, &slot, &place);
    assert_success(&cli(&[run.clone(), properties.clone()].concat()).await);
    let readers = RemoteLake::with_env(
        &lake_dir,
        vec![
            ("READ_LAKE_WAREHOUSE", warehouse.clone()),
            ("READ_LAKE_PROPS", server.reader_properties()),
        ],
    );
    assert_eq!(
        id_plan_pairs(&readers.pyiceberg("shop.customers", "rows").await),
        loaded_customers()
    );
    assert!(
        !lake_dir.join("warehouse").exists(),
        "no local warehouse folder beside the catalog"
    );
    assert!(server.objects("lake", "shop/shop/customers/data") > 0);

    change_customers(&db).await;
    let with_emulator_env = |args: Vec<String>| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
            .args(args)
            .env("STORAGE_EMULATOR_HOST", &server.endpoint)
            .env("RUST_LOG", "wal2iceberg=warn")
            .output()
    };
    assert_success(&with_emulator_env(run).await.unwrap());
    assert_eq!(
        id_plan_pairs(&readers.pyiceberg("shop.customers", "rows").await),
        [(1, "team".into()), (2, "pro".into()), (4, "free".into())]
    );
    assert_eq!(
        readers.bronze_ops("shop.customers_changes").await,
        "rrrudcu",
        "bronze holds every change once"
    );
    let mut verify: Vec<String> = [
        "verify",
        "--source",
        &db.config_url(),
        "--slot",
        &slot,
        "--tables",
        "public.customers",
    ]
    .map(str::to_owned)
    .to_vec();
    verify.extend(place[..6].iter().map(|s| (*s).to_owned()));
    let out = with_emulator_env(verify).await.unwrap();
    assert_success(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("the lake matches the source"),
        "{out:?}"
    );

    let old = "shop/shop/customers/data/crashed-00000.parquet";
    let young = "shop/shop/customers/data/in-flight-00000.parquet";
    server.put("lake", old, "left by a crash");
    server.age("lake", old, 2);
    server.put("lake", young, "not committed yet");
    let mut expire = expire_args(&lake_arg, &warehouse, "customers");
    expire.extend(properties);
    let out = cli(&expire).await;
    assert_success(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(" 1 orphan files deleted"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!server.holds("lake", old) && server.holds("lake", young));
    assert_eq!(
        id_plan_pairs(&readers.pyiceberg("shop.customers", "rows").await),
        [(1, "team".into()), (2, "pro".into()), (4, "free".into())]
    );

    // drop-table deletes both tables' objects.
    let mut drop: Vec<String> = [
        "drop-table",
        "--source",
        &db.config_url(),
        "--table",
        "public.customers",
        "--yes",
    ]
    .map(str::to_owned)
    .to_vec();
    drop.extend(place[..6].iter().map(|s| (*s).to_owned()));
    assert_success(&with_emulator_env(drop).await.unwrap());
    assert_eq!(server.objects("lake", "shop/shop/customers"), 0);
    assert_eq!(server.objects("lake", "shop/shop/customers_changes"), 0);
}
