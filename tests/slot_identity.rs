//! The slot a lake streams from is the one it confirmed: the slot never
//! stands past what the lake records (its tables' positions, or a mark
//! recorded before the slot passed them), and a start refuses a slot that
//! does, before it changes anything (docs/tables.md, The table set).

use std::path::Path;
use std::time::{Duration, Instant};

use iceberg::TableIdent;
use wal2iceberg::apply::RunOptions;
use wal2iceberg::apply::table_set::mark;
use wal2iceberg::lake::catalog::{Lake, namespace};
use wal2iceberg::lake::files::writer::Position;
use wal2iceberg::model::Lsn;
use wal2iceberg::ops::scratch::{ScratchPostgres, StopMode};

use crate::support::*;

/// What the bronze table of `table` in the lake at `lake` records: its
/// mark, and its snapshots' end position.
async fn recorded(lake: &Path, table: &str) -> (Option<Lsn>, Option<Lsn>) {
    let lake = Lake::open_embedded(lake).await.unwrap();
    let ident = TableIdent::new(namespace("shop"), format!("{table}_changes"));
    let bronze = lake.catalog_table(&ident).await.unwrap();
    let position = Position::of(&bronze).unwrap().map(|p| p.end_lsn);
    (mark(&bronze), position)
}

/// `wal2iceberg check` of the run `opts` describe: its exit code and
/// report.
async fn check(db: &TestDb, opts: &RunOptions) -> (Option<i32>, String) {
    let lake = opts.lake.folder.display().to_string();
    let out = cli(&[
        "check",
        "--source",
        &db.config_url(),
        "--tables",
        "public.customers",
        "--slot",
        &opts.capture.slot,
        "--publication",
        &opts.capture.publication,
        "--lake",
        &lake,
        "--namespace",
        "shop",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), stdout)
}

/// A run on `opts` is refused for the slot standing past the lake, and
/// neither the slot nor the lake moves.
async fn assert_refused(db: &TestDb, opts: &RunOptions, dir: &Path) {
    let slot = &opts.capture.slot;
    let confirmed = db.confirmed_flush(slot).await;
    let before = recorded(dir, "customers").await;
    let (code, stdout) = check(db, opts).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("[slot_past_lake]"), "{stdout}");
    let err = wal2iceberg::apply::run(&db.config, opts)
        .await
        .expect_err("the run must refuse the slot");
    let message = err.to_string();
    assert!(
        message.contains(&format!("replication slot {slot:?} stands at"))
            && message.contains("the furthest position this lake records")
            && message.contains("drop-table"),
        "{message}"
    );
    assert_eq!(db.confirmed_flush(slot).await, confirmed, "the slot stays");
    assert_eq!(recorded(dir, "customers").await, before, "the lake stays");
}

async fn customers(db: &TestDb) {
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text);
         INSERT INTO customers VALUES (1, 'free'), (2, 'pro');",
    )
    .await;
}

#[tokio::test]
async fn the_slot_passes_quiet_wal_behind_a_mark_and_one_made_again_under_its_name_is_refused() {
    let db = TestDb::new().await;
    customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["customers"], &unique("marked"), dir.path());
    let slot = opts.capture.slot.clone();
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    let (first_mark, loaded) = recorded(dir.path(), "customers").await;
    assert!(loaded.is_some() && first_mark.is_some(), "{first_mark:?}");

    // WAL the lake's table has no part in: the slot follows it (it is not
    // held for nothing), and the lake records where it stands first.
    db.exec("CREATE TABLE other(x int); INSERT INTO other SELECT generate_series(1, 10000);")
        .await;
    let written = db.wal_insert_lsn().await;
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    let confirmed = db.confirmed_flush(&slot).await.unwrap();
    let (marked, position) = recorded(dir.path(), "customers").await;
    assert_eq!(position, loaded, "no change of customers came");
    assert!(
        confirmed >= written,
        "the slot stays at {confirmed}, behind {written}"
    );
    assert!(
        marked >= Some(confirmed),
        "the slot stands at {confirmed}, past the lake's mark {marked:?}"
    );

    // The next start takes its own slot up.
    db.exec("UPDATE customers SET plan = 'team' WHERE id = 1")
        .await;
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;

    // Dropped by hand and made again under its name (by another
    // consumer): the new slot starts after a change the lake never got.
    db.exec(&format!("SELECT pg_drop_replication_slot('{slot}')"))
        .await;
    db.exec("DELETE FROM customers WHERE id = 2").await;
    db.exec(&format!(
        "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
    ))
    .await;
    assert_refused(&db, &opts, dir.path()).await;
}

#[tokio::test]
async fn a_slot_tail_consumed_without_the_lake_is_refused_and_a_lake_from_before_marks_is_not() {
    let db = TestDb::new().await;
    customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["customers"], &unique("consumed"), dir.path());
    let slot = opts.capture.slot.clone();
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();

    // `tail --consume` not told of the lake warns, and confirms a change
    // the lake never gets.
    db.exec("UPDATE customers SET plan = 'team' WHERE id = 1")
        .await;
    let before = db.confirmed_flush(&slot).await;
    let tail = cli(&[
        "tail",
        "--source",
        &db.config_url(),
        "--tables",
        "public.customers",
        "--publication",
        &opts.capture.publication,
        "--slot",
        &slot,
        "--consume",
        "--exit-when-idle",
        "1500ms",
    ])
    .await;
    assert_success(&tail);
    assert!(
        String::from_utf8_lossy(&tail.stdout).contains(r#""op":"u""#),
        "{tail:?}"
    );
    assert!(db.confirmed_flush(&slot).await > before, "tail consumed");
    assert_refused(&db, &opts, dir.path()).await;

    // A lake whose tables record no mark (made before marks were) cannot
    // tell: its slot is taken up as before, and the lake records where it
    // stands from then on.
    tamper(dir.path(), "shop.customers_changes", &["forget", "0"]).await;
    assert_eq!(recorded(dir.path(), "customers").await.0, None);
    db.exec("UPDATE customers SET plan = 'pro' WHERE id = 2")
        .await;
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    let confirmed = db.confirmed_flush(&slot).await;
    let (marked, position) = recorded(dir.path(), "customers").await;
    assert!(
        marked.is_some() && marked.max(position) >= confirmed,
        "the slot stands at {confirmed:?}, past the lake's {marked:?} and {position:?}"
    );
    assert_eq!(
        bronze_ops(dir.path(), "shop.customers_changes").await,
        "rru",
        "the change tail consumed never reached the lake"
    );
}

#[tokio::test]
async fn dropping_the_table_that_holds_the_marks_hands_its_reach_to_another() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE accounts(id int PRIMARY KEY); INSERT INTO accounts VALUES (1);
         CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1, 'free');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["accounts", "customers"], &unique("heir"), dir.path());
    let slot = opts.capture.slot.clone();
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    db.exec("CREATE TABLE other(x int); INSERT INTO other SELECT generate_series(1, 10000);")
        .await;
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    let confirmed = db.confirmed_flush(&slot).await.unwrap();
    // The marks went to the first bronze by name; customers' stays behind.
    assert!(recorded(dir.path(), "accounts").await.0 >= Some(confirmed));
    let (marked, position) = recorded(dir.path(), "customers").await;
    assert!(
        marked.max(position) < Some(confirmed),
        "{marked:?} {position:?}"
    );

    let lake = dir.path().display().to_string();
    let dropped = cli(&[
        "drop-table",
        "--source",
        &db.config_url(),
        "--lake",
        &lake,
        "--namespace",
        "shop",
        "--publication",
        &opts.capture.publication,
        "--table",
        "public.accounts",
        "--yes",
    ])
    .await;
    assert_success(&dropped);
    assert!(recorded(dir.path(), "customers").await.0 >= Some(confirmed));
    let customers = run_options(&db, &["customers"], &slot, dir.path());
    db.exec("UPDATE customers SET plan = 'pro' WHERE id = 1")
        .await;
    wal2iceberg::apply::run(&db.config, &customers)
        .await
        .unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
}

/// A walsender shutting down waits until its client confirmed all it
/// sent, and the server's shutdown waits for it. It asks for a reply, and
/// a run whose slot waits for its next mark (5 s apart) records it then,
/// at once: the fast shutdown waits for one catalog commit, not for the
/// marks' spacing nor until pg_ctl gives up.
#[tokio::test]
async fn a_fast_shutdown_of_the_source_is_answered_with_a_mark_at_once() {
    let pg = ScratchPostgres::start(&[], &[]).expect("a server of this test's own");
    let db = TestDb::create_on(&pg).await;
    customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = run_options(&db, &["customers"], &unique("shutdown"), dir.path());
    opts.run.exit_when_idle = None;
    let slot = opts.capture.slot.clone();
    let shutdown = opts.shutdown.clone();
    let config = db.config.clone();
    let running = tokio::spawn(async move { wal2iceberg::apply::run(&config, &opts).await });
    db.wait_until_streaming(&slot).await;
    // WAL of other tables: the first mark follows it at once ...
    db.exec("CREATE TABLE other(x int); INSERT INTO other SELECT generate_series(1, 1000);")
        .await;
    let written = db.wal_insert_lsn().await;
    let give_up = Instant::now() + Duration::from_secs(60);
    while db.confirmed_flush(&slot).await < Some(written) {
        assert!(Instant::now() < give_up, "the slot never followed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ... and the next is 5 s away when the server stops.
    db.exec("INSERT INTO other SELECT generate_series(1, 1000)")
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // On a thread of its own: the run shares this test's runtime.
    let pg = std::sync::Arc::new(pg);
    let restarting = pg.clone();
    let stopping = Instant::now();
    tokio::task::spawn_blocking(move || restarting.restart(StopMode::Fast))
        .await
        .unwrap()
        .expect("restart the server");
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the fast restart waited {took:?} for the run"
    );
    shutdown.request();
    running.await.unwrap().unwrap();
}
