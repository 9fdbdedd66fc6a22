//! Large transactions, streamed transactions with aborts, and logical
//! decoding messages.

use std::time::Duration;

use wal2iceberg::apply::{RunOptions, run};
use wal2iceberg::cdc::capture::CaptureOptions;
use wal2iceberg::cdc::event::{Event, Op};
use wal2iceberg::cdc::stream::Next;
use wal2iceberg::config::RunSettings;

use crate::support::alloc;
use crate::support::*;

const ROWS: i64 = 100_000;

/// Reads the one big transaction, holding no event longer than needed, and
/// returns (changes seen, peak bytes this thread held above the start).
async fn consume_big_transaction(db: &TestDb, options: &CaptureOptions) -> (i64, i64) {
    let (_, mut stream) = open_fresh(db, options).await;
    db.exec(&format!(
        "INSERT INTO big SELECT g, repeat(md5(g::text), 16) FROM generate_series(1, {ROWS}) g"
    ))
    .await;
    let base = alloc::reset_peak();
    let mut seen = 0i64;
    let mut last_id = 0;
    loop {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
        match stream.next_before(Some(deadline)).await.expect("stream") {
            Next::Event(Event::Change(c)) => {
                assert_eq!(c.op, Op::Insert);
                let wal2iceberg::cdc::event::Datum::Value(wal2iceberg::cdc::value::Value::Int8(id)) =
                    after(&c, "id")
                else {
                    panic!("id")
                };
                assert_eq!(*id, last_id + 1, "changes in order");
                last_id = *id;
                seen += 1;
            }
            Next::Event(Event::Commit { end_lsn, .. }) => {
                stream.confirm(end_lsn).await.unwrap();
                break;
            }
            Next::Event(_) => {}
            Next::Idle | Next::Closed => panic!("stream ended after {seen} changes"),
        }
    }
    let peak = alloc::peak() - base;
    stream.stop().await.unwrap();
    (seen, peak)
}

/// About 50 MB of row data: buffering the transaction would show.
const FLAT_BOUND: i64 = 16 << 20;

#[tokio::test]
async fn a_100k_row_transaction_passes_through_in_flat_memory() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE big(id bigint PRIMARY KEY, pad text)")
        .await;
    let mut options = db.options(&["big"]);
    options.proto_version = 1;
    let (seen, peak) = consume_big_transaction(&db, &options).await;
    assert_eq!(seen, ROWS);
    assert!(peak < FLAT_BOUND, "held {peak} bytes at peak");
}

#[tokio::test]
async fn a_100k_row_streamed_transaction_is_spooled_not_held_in_memory() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE big(id bigint PRIMARY KEY, pad text)")
        .await;
    let mut options = db.options(&["big"]);
    options.streaming = true;
    let (seen, peak) = consume_big_transaction(&db, &options).await;
    assert_eq!(seen, ROWS);
    assert!(peak < FLAT_BOUND, "held {peak} bytes at peak");
}

/// The test server streams past 64 kB (`logical_decoding_work_mem`), so
/// the open transaction's first 20,000 rows arrive as chunks at once; the
/// pauses inside it are longer than the idle exit. Only its Stream Commit
/// makes events, and the run must wait for it.
/// Opens a transaction of 20,000 inserts into `big(id, pad)` on a
/// connection of its own, which the server streams at once; returns the
/// connection and the rest of the transaction: 20,000 more inserts after
/// 2 s, the commit 2 s later.
async fn open_big_transaction(db: &TestDb) -> (TestDb, String) {
    let writer = TestDb::connect(db.config_url()).await;
    let insert = |from: i64| {
        format!(
            "INSERT INTO big SELECT g, md5(g::text) FROM generate_series({from}, {}) g;",
            from + 19_999
        )
    };
    writer.exec(&format!("BEGIN; {}", insert(1))).await;
    let rest = format!(
        "SELECT pg_sleep(2); {} SELECT pg_sleep(2); COMMIT;",
        insert(20_001)
    );
    (writer, rest)
}

#[tokio::test]
async fn a_run_that_exits_when_idle_waits_for_an_open_streamed_transaction() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE big(id bigint PRIMARY KEY, pad text)")
        .await;
    let lake = tempfile::tempdir().unwrap();
    let mut capture = db.options(&["big"]);
    capture.streaming = true;
    let options = RunOptions {
        namespace: Some("shop".into()),
        run: RunSettings {
            flush_interval: Duration::from_millis(200),
            exit_when_idle: Some(Duration::from_secs(1)),
            ..RunSettings::DEFAULT
        },
        ..RunOptions::new(capture, lake.path().to_owned())
    };
    run(&db.config, &options).await.unwrap();

    let (writer, rest) = open_big_transaction(&db).await;
    let (report, ()) = tokio::join!(run(&db.config, &options), writer.exec(&rest));
    assert_eq!(report.unwrap().changes_applied, 40_000);
    assert_reconciled(&db, "big", lake.path(), "shop.big").await;
}

#[tokio::test]
async fn tail_that_exits_when_idle_waits_for_an_open_streamed_transaction() {
    use wal2iceberg::ops::tail::{TailOptions, TailSlot, tail};
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE big(id bigint PRIMARY KEY, pad text); CREATE PUBLICATION pub FOR TABLE big;",
    )
    .await;
    let mut capture = db.options(&["big"]);
    capture.streaming = true;
    let options = TailOptions {
        capture,
        exit_when_idle: Some(Duration::from_secs(1)),
        slot: TailSlot::Consume,
        lake: None,
        shutdown: Default::default(),
    };
    let mut out = Vec::new();
    tail(&db.config, &options, &mut out).await.unwrap();

    let (writer, rest) = open_big_transaction(&db).await;
    let mut out = Vec::new();
    let (written, ()) = tokio::join!(tail(&db.config, &options, &mut out), writer.exec(&rest));
    // Begin, the 40,000 inserts, Commit.
    assert_eq!(written.unwrap(), 40_002);
}

#[tokio::test]
async fn streamed_transactions_drop_rolled_back_subtransactions_and_aborts() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY, pad text)")
        .await;
    let mut options = db.options(&["t"]);
    options.streaming = true;
    let (_, mut stream) = open_fresh(&db, &options).await;
    let insert = |from: i32, to: i32| {
        format!("INSERT INTO t SELECT g, repeat('x', 500) FROM generate_series({from}, {to}) g")
    };
    db.exec(&format!("BEGIN; {}; ROLLBACK;", insert(1, 3000)))
        .await;
    db.exec(&format!(
        "BEGIN; {}; SAVEPOINT s1; {}; SAVEPOINT s2; {}; ROLLBACK TO s1; {}; COMMIT;",
        insert(1, 2000),
        insert(2001, 4000),
        insert(4001, 5000),
        insert(5001, 6000)
    ))
    .await;
    let events = read_commits(&mut stream, 1).await;
    let ids: Vec<i32> = changes(&events)
        .iter()
        .map(|c| match after(c, "id") {
            wal2iceberg::cdc::event::Datum::Value(wal2iceberg::cdc::value::Value::Int4(i)) => *i,
            other => panic!("{other:?}"),
        })
        .collect();
    let expected: Vec<i32> = (1..=2000).chain(5001..=6000).collect();
    assert_eq!(ids.len(), expected.len());
    assert_eq!(ids, expected);
    let seqs: Vec<u64> = changes(&events).iter().map(|c| c.seq).collect();
    assert_eq!(seqs, (0..expected.len() as u64).collect::<Vec<_>>());
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn logical_decoding_messages_arrive_in_and_outside_transactions() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY)").await;
    let (_, mut stream) = open_fresh(&db, &db.options(&["t"])).await;
    db.exec("SELECT pg_logical_emit_message(false, 'w2i', 'outside')")
        .await;
    db.exec("BEGIN; INSERT INTO t VALUES (1); SELECT pg_logical_emit_message(true, 'w2i', 'inside'); COMMIT;")
        .await;
    let events = read_commits(&mut stream, 1).await;
    let messages: Vec<(Option<u32>, String)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Message {
                tx,
                prefix,
                content,
                ..
            } => {
                assert_eq!(prefix, "w2i");
                Some((
                    tx.map(|t| t.xid),
                    String::from_utf8(content.clone()).unwrap(),
                ))
            }
            _ => None,
        })
        .collect();
    let commit_xid = changes(&events)[0].tx.xid;
    assert_eq!(
        messages,
        [
            (None, "outside".to_owned()),
            (Some(commit_xid), "inside".to_owned())
        ]
    );
    stream.stop().await.unwrap();
}

/// With `client_min_messages = debug1` the walsender reports its snapshot
/// builder's work as NoticeResponses inside CopyBoth (snapbuild.c logs
/// "serializing snapshot" at DEBUG1 for every running-xacts record, which a
/// CHECKPOINT writes): the stream must read past them.
#[tokio::test]
async fn notices_inside_the_replication_stream_are_skipped() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY)").await;
    db.exec(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET client_min_messages = debug1', \
         current_database()); END $$",
    )
    .await;
    let (_, mut stream) = open_fresh(&db, &db.options(&["t"])).await;
    db.exec("INSERT INTO t VALUES (1)").await;
    read_commits(&mut stream, 1).await;
    db.exec("CHECKPOINT").await;
    db.exec("INSERT INTO t VALUES (2)").await;
    let events = read_commits(&mut stream, 1).await;
    assert_eq!(ops(&events), "c");
    stream.stop().await.unwrap();
}
