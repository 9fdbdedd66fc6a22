//! Seconds behind as `status` and `/metrics` tell it to the least-privileged
//! role of docs/operations.md (no `pg_read_all_stats`): the age of the
//! oldest change the lake does not hold, never 0 while one is pending,
//! whether a run holds the slot or not; and a run told to end when idle
//! ends only once the server has sent it what was committed before.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;
use wal2iceberg::ops::scratch::ScratchPostgres;

use crate::support::*;

async fn wal2iceberg(args: &[&str]) -> (i32, String, String) {
    let out = cli(args).await;
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn a_pending_change_is_never_zero_seconds_behind_for_the_least_privileged_role() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free');")
        .await;
    let admin = db.config_url();
    let (code, _, stderr) =
        wal2iceberg(&["setup", "--source", &admin, "--tables", "public.customers"]).await;
    assert_eq!(code, 0, "{stderr}");
    let least = admin.replace("postgres@", "wal2iceberg@");
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("lag");
    let common = [
        "--source",
        &least,
        "--slot",
        &slot,
        "--lake",
        &lake_path,
        "--namespace",
        "shop",
    ];
    let status = || async {
        let (code, stdout, stderr) =
            wal2iceberg(&[&["status", "--json"], &common[..]].concat()).await;
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<Value>(&stdout).unwrap()
    };
    let (code, _, stderr) =
        wal2iceberg(&[&["run", "--exit-when-idle", "1s"][..], &common[..]].concat()).await;
    assert_eq!(code, 0, "{stderr}");
    let caught_up = status().await;
    assert_eq!(
        caught_up["slot"]["seconds_behind"],
        json!(0.0),
        "{caught_up}"
    );

    // Stopped, one change pending: its age.
    db.exec("UPDATE customers SET plan = 'pro'").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopped = status().await;
    let behind = stopped["slot"]["seconds_behind"].as_f64();
    assert!(
        behind.is_some_and(|b| (2.0..60.0).contains(&b)),
        "{stopped}"
    );

    // Running, the same change received and its commit to the lake slow:
    // still its age, by status and by the run's own metric.
    let mut running = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args([&["run", "--metrics-addr", "127.0.0.1:0"][..], &common[..]].concat())
        .env(wal2iceberg::failpoint::STALL_VARIABLE, "commit:30000")
        .env("RUST_LOG", "wal2iceberg=info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(running.stderr.take().unwrap()).lines();
    let addr = metrics_address(&mut lines).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    db.wait_until_active(&slot).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = status().await;
    assert_eq!(held["slot"]["active"], json!(true), "{held}");
    let behind = held["slot"]["seconds_behind"].as_f64();
    assert!(behind.is_some_and(|b| (4.0..60.0).contains(&b)), "{held}");
    let scrape = http_get(&addr, "/metrics").await;
    let metric = scrape
        .lines()
        .find_map(|l| l.strip_prefix("wal2iceberg_seconds_behind "))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(metric.is_some_and(|b| (4.0..60.0).contains(&b)), "{scrape}");
    running.kill().await.unwrap();
}

#[tokio::test]
async fn status_says_why_seconds_behind_is_unknown_and_what_would_tell_it() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY); CREATE PUBLICATION lagpub FOR TABLE t;")
        .await;
    let slot = unique("lagunknown");
    let role = format!("watcher_{slot}");
    db.exec(&format!(
        "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
    ))
    .await;
    db.exec(&format!(
        "INSERT INTO t VALUES (1); CREATE ROLE {role} LOGIN;"
    ))
    .await;
    let watcher = db.config_url().replace("postgres@", &format!("{role}@"));
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let status = async |json: &[&str]| {
        let mut args = vec!["status"];
        args.extend_from_slice(json);
        args.extend([
            "--source",
            &watcher,
            "--slot",
            &slot,
            "--publication",
            "lagpub",
            "--lake",
            &lake_path,
        ]);
        wal2iceberg(&args).await
    };
    let (code, stdout, stderr) = status(&[]).await;
    // No lake where the slot is: status exits 1 for that, and says it.
    assert_eq!(code, 1, "{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.contains("seconds behind"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains("unknown") && line.contains(&format!("ALTER ROLE \"{role}\" REPLICATION")),
        "{stdout}"
    );
    let (code, stdout, stderr) = status(&["--json"]).await;
    assert_eq!(code, 1, "{stderr}");
    let json: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["slot"]["seconds_behind"], Value::Null, "{json}");
    assert!(
        json["slot"]["seconds_behind_unknown"]
            .as_str()
            .is_some_and(|r| r.contains("REPLICATION")),
        "{json}"
    );
    db.exec(&format!(
        "SELECT pg_drop_replication_slot('{slot}'); DROP ROLE {role};"
    ))
    .await;
}

/// A run of `public.customers` into `lake` that ends once idle for 1 s.
async fn run_until_idle(db: &TestDb, slot: &str, lake: &std::path::Path) {
    let more = ["--exit-when-idle", "1s"];
    let out = at_lake_with("run", db, slot, lake, "public.customers", &more).await;
    assert_success(&out);
}

#[tokio::test]
async fn a_run_ending_when_idle_waits_for_what_the_server_is_still_reading() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free');
         CREATE TABLE unpublished(id int, note text);",
    )
    .await;
    let lake = tempfile::tempdir().unwrap();
    let slot = unique("idle");
    run_until_idle(&db, &slot, lake.path()).await;
    // WAL the server takes some seconds to read through, none of it for
    // the run, then the change it must not end without.
    db.exec(
        "INSERT INTO unpublished SELECT g, repeat('x', 100) FROM generate_series(1, 1500000) g;
         UPDATE customers SET plan = 'pro' WHERE id = 1;",
    )
    .await;
    run_until_idle(&db, &slot, lake.path()).await;
    assert_reconciled(&db, "customers", lake.path(), "shop.customers").await;
}

#[tokio::test]
async fn a_run_ending_when_idle_waits_for_an_asynchronous_commit_not_yet_flushed() {
    // The WAL writer flushes an asynchronous commit at most every ten
    // seconds here, and the harness commits asynchronously.
    let pg = ScratchPostgres::start(&[("wal_writer_delay", "'10s'")], &[])
        .expect("a server of this test's own");
    let db = TestDb::create_on(&pg).await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free');")
        .await;
    let lake = tempfile::tempdir().unwrap();
    let slot = unique("idle");
    run_until_idle(&db, &slot, lake.path()).await;
    // A commit the WAL writer flushes (so it flushed just now), then the
    // one it leaves for ten seconds.
    db.exec("INSERT INTO customers VALUES (2, 'free')").await;
    let flush_lsn = "SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()";
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !db
        .client
        .query_one(flush_lsn, &[])
        .await
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(
            std::time::Instant::now() < until,
            "the first commit was never flushed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db.exec("UPDATE customers SET plan = 'pro' WHERE id = 1")
        .await;
    let flushed: bool = db.client.query_one(flush_lsn, &[]).await.unwrap().get(0);
    assert!(
        !flushed,
        "the premise: the update's commit is acknowledged but not flushed"
    );
    run_until_idle(&db, &slot, lake.path()).await;
    assert_reconciled(&db, "customers", lake.path(), "shop.customers").await;
}
