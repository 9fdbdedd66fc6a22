//! The seed lab's Steps 2, 5 and 6, without Kafka: three rows loaded, then
//! two updates, a delete and an insert, in commit order with their images.

use wal2iceberg::cdc::event::{Event, ImageKind};
use wal2iceberg::cdc::value::Value;

use crate::support::*;

const CREATE: &str = "
    CREATE TABLE customers(
      id int PRIMARY KEY, name text NOT NULL, plan text NOT NULL,
      updated_at timestamptz NOT NULL DEFAULT now());
    ALTER TABLE customers REPLICA IDENTITY FULL;
    INSERT INTO customers(id, name, plan) VALUES (1,'Ada','free'),(2,'Grace','pro'),(3,'Linus','free');";

const CHANGES: &str = "
    UPDATE customers SET plan='pro',  updated_at=now() WHERE id=1;
    UPDATE customers SET plan='team', updated_at=now() WHERE id=1;
    DELETE FROM customers WHERE id=3;
    INSERT INTO customers(id, name, plan) VALUES (4,'Barbara','free');";

#[tokio::test]
async fn initial_load_then_updates_delete_and_insert_arrive_in_commit_order() {
    let db = TestDb::new().await;
    db.exec(CREATE).await;
    let options = db.options(&["public.customers"]);
    let (load, mut stream) = open_fresh(&db, &options).await;

    assert_eq!(ops(&load), "rrr", "{}", summary(&load));
    let loaded = changes(&load);
    assert_eq!(after(loaded[0], "name"), &text("Ada"));
    assert_eq!(after(loaded[2], "plan"), &text("free"));
    let consistent_point = loaded[0].tx.commit_lsn;
    assert!(
        loaded
            .iter()
            .all(|c| c.lsn == consistent_point && c.before.is_none())
    );
    assert_eq!(
        loaded.iter().map(|c| c.seq).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "seq numbers the rows of the load"
    );

    // As psql runs them: each statement its own transaction.
    for statement in CHANGES.split(';').filter(|s| !s.trim().is_empty()) {
        db.exec(statement).await;
    }
    let events = read_commits(&mut stream, 4).await;
    assert_eq!(ops(&events), "uudc", "{}", summary(&events));
    let c = changes(&events);

    // First update: full before image (REPLICA IDENTITY FULL) and the after image.
    let before = c[0].before.as_ref().expect("before image under FULL");
    assert_eq!(before.kind, ImageKind::Full);
    assert_eq!(crate::support::before(c[0], "plan"), &text("free"));
    assert_eq!(crate::support::before(c[0], "name"), &text("Ada"));
    assert_eq!(after(c[0], "plan"), &text("pro"));
    assert_eq!(crate::support::before(c[1], "plan"), &text("pro"));
    assert_eq!(after(c[1], "plan"), &text("team"));
    // The delete carries the whole old row, the insert the new one.
    assert_eq!(crate::support::before(c[2], "name"), &text("Linus"));
    assert!(c[2].after.is_none());
    assert_eq!(after(c[3], "id"), &int4(4));
    assert_eq!(after(c[3], "name"), &text("Barbara"));

    // Each statement is its own transaction, in commit order, after the load.
    let commit_lsns: Vec<_> = c.iter().map(|c| c.tx.commit_lsn).collect();
    assert!(
        commit_lsns.windows(2).all(|w| w[0] < w[1]),
        "{commit_lsns:?}"
    );
    assert!(commit_lsns[0] > consistent_point);
    // Commit timestamps arrive relative to 2000-01-01 and are converted to
    // the Unix epoch: they must be now, not thirty years from now.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!(
        c.iter().all(|c| (now - c.tx.commit_ts).abs() < 60_000_000),
        "{}",
        summary(&events)
    );
    assert!(c.iter().all(|c| c.seq == 0));
    let Event::Commit { end_lsn, tx } = events.last().unwrap() else {
        panic!("ends with a commit")
    };
    assert_eq!(tx.commit_lsn, c[3].tx.commit_lsn);
    assert!(*end_lsn > tx.commit_lsn);
    assert!(matches!(
        crate::support::after(c[3], "updated_at"),
        wal2iceberg::cdc::event::Datum::Value(Value::TimestampTz(_))
    ));
    stream.stop().await.unwrap();
}
