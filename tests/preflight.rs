//! Every preflight failure, provoked against a real server, with its message.

use wal2iceberg::ErrorKind;
use wal2iceberg::cdc::capture::{self, CaptureOptions};
use wal2iceberg::model::Lsn;
use wal2iceberg::model::TableName;
use wal2iceberg::ops::scratch::ScratchPostgres;
use wal2iceberg::pg::conn::ReplicationConnection;
use wal2iceberg::pg::replication::StartOptions;
use wal2iceberg::pg::source::{CheckFailure, SourceClient};

use crate::support::*;

fn find<'a>(failures: &'a [CheckFailure], check: &str) -> &'a CheckFailure {
    failures
        .iter()
        .find(|f| f.check == check)
        .unwrap_or_else(|| panic!("no {check} failure in {failures:?}"))
}

fn options(tables: &[&str], slot: &str) -> CaptureOptions {
    let mut o = CaptureOptions::new(
        tables
            .iter()
            .map(|t| TableName::parse(t).unwrap())
            .collect(),
    );
    o.slot = slot.to_owned();
    o
}

#[tokio::test]
async fn wal_level_other_than_logical_is_reported_with_the_fix() {
    let pg = ScratchPostgres::start(&[("wal_level", "replica")], &[]).unwrap();
    let config = config_for(&pg.url("postgres"));
    let failures = capture::check(&config, &options(&["pg_catalog.pg_class"], "s"))
        .await
        .unwrap();
    let f = find(&failures, "wal_level");
    assert!(f.problem.contains("\"replica\""), "{f}");
    assert!(f.fix.contains("wal_level = logical"), "{f}");
    let err = capture::open(&config, &options(&["pg_catalog.pg_class"], "s"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Preflight);
    assert!(err.to_string().contains("wal_level"), "{err}");
    // setup says so too, before it installs anything.
    let out = cli(&[
        "setup",
        "--source",
        &pg.url("postgres"),
        "--tables",
        "pg_catalog.pg_class",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ALTER SYSTEM SET wal_level = logical") && stderr.contains("restart"),
        "{stderr}"
    );
    let client = SourceClient::connect(&config).await.unwrap();
    let schemas: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'wal2iceberg'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(schemas, 0, "nothing installed");
}

#[tokio::test]
async fn missing_privileges_tables_and_keys_are_all_reported_at_once() {
    let db = TestDb::new().await;
    let role = unique("plain");
    db.exec(&format!(
        "CREATE TABLE keyed(id int PRIMARY KEY);
         CREATE TABLE nokey(id int, v text);
         CREATE ROLE {role} LOGIN;"
    ))
    .await;
    let mut config = db.config.clone();
    config.user = role.clone();
    let failures = capture::check(&config, &options(&["keyed", "nokey", "missing"], "s"))
        .await
        .unwrap();
    let f = find(&failures, "replication_privilege");
    assert!(
        f.fix
            .contains(&format!("ALTER ROLE \"{role}\" REPLICATION")),
        "{f}"
    );
    let f = find(&failures, "select_privilege");
    assert!(
        f.problem.contains("public.keyed")
            && f.fix.contains(&format!(
                "GRANT SELECT ON \"public\".\"keyed\" TO \"{role}\";"
            )),
        "{f}"
    );
    let f = find(&failures, "table_exists");
    assert!(f.problem.contains("public.missing"), "{f}");
    let f = find(&failures, "replica_identity");
    assert!(
        f.problem.contains("public.nokey") && f.fix.contains("REPLICA IDENTITY FULL"),
        "{f}"
    );
}

#[tokio::test]
async fn a_table_without_key_or_full_identity_is_never_published() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE keyed(id int PRIMARY KEY); CREATE TABLE nokey(id int, v text); INSERT INTO nokey VALUES (1, 'a');")
        .await;
    let options = db.options(&["keyed", "nokey"]);
    let err = capture::open(&db.config, &options).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Preflight);
    assert!(err.to_string().contains("public.nokey"), "{err}");
    assert_eq!(db.publishing("nokey").await, 0);
    // The application's UPDATE and DELETE still work.
    db.exec("UPDATE nokey SET v = 'b'; DELETE FROM nokey;")
        .await;

    // With REPLICA IDENTITY FULL the same table is accepted, by tail and
    // by run (which keeps its history, bronze, only).
    db.exec("ALTER TABLE nokey REPLICA IDENTITY FULL").await;
    let failures = capture::check(&db.config, &options).await.unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    let mut to_lake = options.clone();
    to_lake.to_lake = true;
    let failures = capture::check(&db.config, &to_lake).await.unwrap();
    assert!(failures.is_empty(), "{failures:?}");
}

#[tokio::test]
async fn a_slot_in_use_by_another_process_is_refused_without_harm() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY)").await;
    let options = db.options(&["t"]);
    let mut other = db.config.clone();
    other.application_name = "pg_recvlogical".to_owned();
    let (_, mut first) = open_fresh_as(&other, &options).await;

    let failures = capture::check(&db.config, &options).await.unwrap();
    let f = find(&failures, "slot_in_use");
    assert!(
        f.problem.contains(&options.slot)
            && f.problem.contains("pg_recvlogical")
            && f.fix.contains("pg_terminate_backend"),
        "{f}"
    );
    let err = capture::open(&db.config, &options).await.err().unwrap();
    assert!(err.to_string().contains("in use"), "{err}");

    // Straight to START_REPLICATION, the server's refusal is explained too.
    let conn = ReplicationConnection::connect(&db.config).await.unwrap();
    let start = StartOptions {
        slot: options.slot.clone(),
        start_lsn: Lsn::ZERO,
        proto_version: 2,
        publications: vec![options.publication.clone()],
        messages: false,
        streaming: false,
    };
    let err = conn.start_replication(&start).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Slot);
    assert!(
        err.to_string().contains("is in use by another process"),
        "{err}"
    );

    // The first consumer is unharmed.
    db.exec("INSERT INTO t VALUES (1)").await;
    assert_eq!(ops(&read_commits(&mut first, 1).await), "c");
    first.stop().await.unwrap();
}

#[tokio::test]
async fn no_free_slot_or_wal_sender_is_reported() {
    let pg = ScratchPostgres::start(
        &[("max_replication_slots", "1"), ("max_wal_senders", "1")],
        &[],
    )
    .unwrap();
    let config = config_for(&pg.url("postgres"));
    let client = wal2iceberg::pg::source::SourceClient::connect(&config)
        .await
        .unwrap();
    client
        .batch_execute("CREATE TABLE t(id int PRIMARY KEY)")
        .await
        .unwrap();
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
        .await
        .unwrap();
    let mut busy = ReplicationConnection::connect(&config).await.unwrap();
    busy.identify_system().await.unwrap();
    let failures = capture::check(&config, &options(&["t"], "mine"))
        .await
        .unwrap();
    let f = find(&failures, "free_replication_slot");
    assert!(f.fix.contains("max_replication_slots"), "{f}");
    let f = find(&failures, "free_wal_sender");
    assert!(f.fix.contains("max_wal_senders"), "{f}");
    busy.close().await.unwrap();
}

#[tokio::test]
async fn a_publication_that_skips_operations_is_reported() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t WITH (publish = 'insert');")
        .await;
    let failures = capture::check(&db.config, &db.options(&["t"]))
        .await
        .unwrap();
    let f = find(&failures, "publication_operations");
    assert!(f.problem.contains("update, delete, truncate"), "{f}");
}

#[tokio::test]
async fn malformed_options_are_rejected_before_connecting() {
    let unreachable = config_for("postgres://nobody@127.0.0.1:1/none?sslmode=disable");
    for (mutate, needle) in [
        (
            Box::new(|o: &mut CaptureOptions| o.tables.clear()) as Box<dyn Fn(&mut CaptureOptions)>,
            "no tables",
        ),
        (
            Box::new(|o: &mut CaptureOptions| o.slot = "Bad-Name".into()),
            "slot name",
        ),
        (
            Box::new(|o: &mut CaptureOptions| o.proto_version = 3),
            "proto_version 3",
        ),
        (
            Box::new(|o: &mut CaptureOptions| {
                o.proto_version = 1;
                o.streaming = true;
            }),
            "streaming needs",
        ),
    ] {
        let mut o = options(&["t"], "ok");
        mutate(&mut o);
        let err = capture::check(&unreachable, &o).await.err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains(needle), "{err}");
    }
}

#[tokio::test]
async fn a_table_silver_cannot_keep_is_refused_by_check_and_run_alike_before_anything_is_created() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE nokey(id int NOT NULL, v text); CREATE UNIQUE INDEX nokey_id ON nokey(id);
         ALTER TABLE nokey REPLICA IDENTITY USING INDEX nokey_id;
         CREATE TABLE reserved(id int PRIMARY KEY, _cdc_op text);",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let slot = unique("refused");
    for (table, check, problem) in [
        (
            "public.nokey",
            "primary_key",
            "has no primary key and REPLICA IDENTITY USING INDEX",
        ),
        ("public.reserved", "reserved_column_names", "_cdc_op"),
    ] {
        let place = [
            "--source",
            &db.config_url(),
            "--tables",
            table,
            "--slot",
            &slot,
            "--publication",
            "refused",
        ];
        let checked = cli(&[&["check"][..], &place[..]].concat()).await;
        let said = String::from_utf8_lossy(&checked.stdout);
        assert_eq!(checked.status.code(), Some(1), "{said}");
        assert!(said.contains(check) && said.contains(problem), "{said}");

        let lake_arg = lake.display().to_string();
        let ran = cli(&[&["run"][..], &place[..], &["--lake", &lake_arg][..]].concat()).await;
        let stderr = String::from_utf8_lossy(&ran.stderr);
        assert!(!ran.status.success());
        assert!(
            stderr.contains(problem) && stderr.contains(table),
            "{stderr}"
        );
        assert_eq!(db.slot_count().await, 0, "no slot for {table}");
        assert!(!lake.exists(), "no lake folder for {table}");
        let publication: i64 = db
            .client
            .query_one(
                "SELECT count(*) FROM pg_publication WHERE pubname = 'refused'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(publication, 0, "no publication for {table}");
    }
}
