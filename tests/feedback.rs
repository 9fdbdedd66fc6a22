//! Feedback: the slot's confirmed_flush_lsn follows what the caller
//! confirmed, never passes it, never moves back, and a restart resumes
//! right after it.

use std::time::Duration;

use tokio::time::Instant;
use wal2iceberg::cdc::capture::{self, Capture};
use wal2iceberg::cdc::event::Event;
use wal2iceberg::cdc::stream::{ChangeStream, Next};
use wal2iceberg::model::Lsn;

use crate::support::*;

fn commit_ends(events: &[Event]) -> Vec<Lsn> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Commit { end_lsn, .. } => Some(*end_lsn),
            _ => None,
        })
        .collect()
}

/// Keeps the stream running (status updates, keepalives) for `d`,
/// asserting that no change arrives. PostgreSQL 14 sends transactions
/// without published changes as an empty Begin and Commit: those are
/// confirmed as a sink would.
async fn run_quietly(stream: &mut ChangeStream, d: Duration) {
    let deadline = Instant::now() + d;
    loop {
        match stream.next_before(Some(deadline)).await.unwrap() {
            Next::Idle => return,
            Next::Event(Event::Begin(_)) => {}
            Next::Event(Event::Commit { end_lsn, .. }) => stream.confirm(end_lsn).await.unwrap(),
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn wait_for_flush(
    db: &TestDb,
    slot: &str,
    stream: &mut ChangeStream,
    pred: impl Fn(Lsn) -> bool,
) -> Lsn {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let flushed = db.confirmed_flush(slot).await.unwrap();
        if pred(flushed) {
            return flushed;
        }
        assert!(
            Instant::now() < give_up,
            "confirmed_flush_lsn stuck at {flushed}"
        );
        run_quietly(stream, Duration::from_millis(100)).await;
    }
}

async fn resume(db: &TestDb, options: &capture::CaptureOptions) -> ChangeStream {
    match capture::open(&db.config, options).await.unwrap() {
        Capture::Resume {
            load: None,
            pending,
            ..
        } => pending.start().await.unwrap(),
        Capture::Resume { load: Some(_), .. } => panic!("nothing to load"),
        Capture::Fresh { .. } => panic!("the slot should exist"),
    }
}

#[tokio::test]
async fn the_slot_follows_confirmations_exactly_and_resumes_after_them() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY)").await;
    let options = db.options(&["t"]);
    let (_, mut stream) = open_fresh(&db, &options).await;
    stream.set_status_interval(Duration::from_millis(50));
    for id in 1..=3 {
        db.exec(&format!("INSERT INTO t VALUES ({id})")).await;
    }
    let events = read_commits(&mut stream, 3).await;
    let ends = commit_ends(&events);

    stream.confirm(ends[0]).await.unwrap();
    let flushed = wait_for_flush(&db, &options.slot, &mut stream, |f| f >= ends[0]).await;
    assert_eq!(flushed, ends[0], "reaches what was confirmed");

    // Delivered but unconfirmed transactions hold the slot where it is,
    // through many status updates and keepalives.
    run_quietly(&mut stream, Duration::from_millis(500)).await;
    assert_eq!(
        db.confirmed_flush(&options.slot).await,
        Some(ends[0]),
        "never passes it"
    );

    // A lower confirmation does not move the position back.
    stream.confirm(Lsn(ends[0].0 - 1)).await.unwrap();
    assert_eq!(stream.confirmed(), ends[0]);
    run_quietly(&mut stream, Duration::from_millis(200)).await;
    assert_eq!(db.confirmed_flush(&options.slot).await, Some(ends[0]));
    stream.stop().await.unwrap();

    // After a restart the unconfirmed transactions come again, the
    // confirmed one does not.
    let mut stream = resume(&db, &options).await;
    let again = read_commits(&mut stream, 2).await;
    assert_eq!(ops(&again), "cc");
    assert_eq!(after(changes(&again)[0], "id"), &int4(2));
    assert_eq!(commit_ends(&again), ends[1..]);
    stream.confirm(ends[2]).await.unwrap();
    stream.stop().await.unwrap();

    db.exec("INSERT INTO t VALUES (4)").await;
    let mut stream = resume(&db, &options).await;
    let next = read_commits(&mut stream, 1).await;
    assert_eq!(changes(&next).len(), 1);
    assert_eq!(
        after(changes(&next)[0], "id"),
        &int4(4),
        "resumes right after the confirmed position"
    );
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn a_quiet_slot_advances_with_keepalives_once_everything_is_confirmed() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY)").await;
    let options = db.options(&["t"]);
    let (_, mut stream) = open_fresh(&db, &options).await;
    stream.set_status_interval(Duration::from_millis(50));
    db.exec("INSERT INTO t VALUES (1)").await;
    let events = read_commits(&mut stream, 1).await;
    let end = commit_ends(&events)[0];
    stream.confirm(end).await.unwrap();

    // WAL written elsewhere (another table, not published) is never a
    // change for this slot, but must not be retained for it either.
    db.exec("CREATE TABLE other(x int); INSERT INTO other SELECT generate_series(1, 1000);")
        .await;
    let written = db.wal_insert_lsn().await;
    let flushed = wait_for_flush(&db, &options.slot, &mut stream, |f| f >= written).await;
    assert!(flushed > end);
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn keepalives_asking_for_a_reply_are_answered_between_timer_updates() {
    let db = TestDb::new().await;
    // The server asks for a reply after half of wal_sender_timeout without
    // one, and drops the connection after all of it.
    db.exec("CREATE TABLE t(id int PRIMARY KEY)").await;
    let dbname = db.config.dbname.clone();
    db.exec(&format!(
        "ALTER DATABASE {dbname} SET wal_sender_timeout = '2s'"
    ))
    .await;
    let options = db.options(&["t"]);
    let (_, mut stream) = open_fresh(&db, &options).await;
    stream.set_status_interval(Duration::from_secs(3600));
    run_quietly(&mut stream, Duration::from_secs(6)).await;
    db.exec("INSERT INTO t VALUES (1)").await;
    assert_eq!(
        ops(&read_commits(&mut stream, 1).await),
        "c",
        "the connection survived"
    );
    stream.stop().await.unwrap();
}
