//! Before images under REPLICA IDENTITY DEFAULT and FULL, and unchanged
//! TOAST values, as the server sends them: never filled with placeholders.

use wal2iceberg::cdc::event::{Datum, ImageKind};
use wal2iceberg::cdc::value::Value;

use crate::support::*;

#[tokio::test]
async fn default_identity_sends_keys_only_and_old_keys_on_key_updates() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY, name text, plan text); INSERT INTO t VALUES (1,'Ada','free'),(2,'Grace','pro');")
        .await;
    let (_, mut stream) = open_fresh(&db, &db.options(&["t"])).await;

    db.exec("UPDATE t SET plan = 'team' WHERE id = 1").await;
    db.exec("DELETE FROM t WHERE id = 2").await;
    db.exec("UPDATE t SET id = 10 WHERE id = 1").await;
    let events = read_commits(&mut stream, 3).await;
    assert_eq!(ops(&events), "udu", "{}", summary(&events));
    let c = changes(&events);

    // An update that leaves the key alone carries no old tuple.
    assert!(c[0].before.is_none(), "{}", summary(&events));
    assert_eq!(after(c[0], "plan"), &text("team"));

    // A delete carries the key; the other columns were not sent, and say so.
    let delete = c[1].before.as_ref().unwrap();
    assert_eq!(delete.kind, ImageKind::Key);
    assert_eq!(before(c[1], "id"), &int4(2));
    assert_eq!(before(c[1], "name"), &Datum::NotSent);
    assert_eq!(before(c[1], "plan"), &Datum::NotSent);

    // A primary-key update carries the old key.
    assert_eq!(c[2].before.as_ref().unwrap().kind, ImageKind::Key);
    assert_eq!(before(c[2], "id"), &int4(1));
    assert_eq!(before(c[2], "name"), &Datum::NotSent);
    assert_eq!(after(c[2], "id"), &int4(10));
    assert_eq!(after(c[2], "name"), &text("Ada"));
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn full_identity_sends_the_complete_old_row_including_nulls() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE t(id int PRIMARY KEY, name text, plan text);
         ALTER TABLE t REPLICA IDENTITY FULL;
         INSERT INTO t VALUES (1,'Ada',NULL),(2,'Grace','pro');",
    )
    .await;
    let (_, mut stream) = open_fresh(&db, &db.options(&["t"])).await;
    db.exec("UPDATE t SET plan = 'team' WHERE id = 1").await;
    db.exec("DELETE FROM t WHERE id = 2").await;
    let events = read_commits(&mut stream, 2).await;
    let c = changes(&events);
    assert_eq!(c[0].before.as_ref().unwrap().kind, ImageKind::Full);
    assert_eq!(before(c[0], "name"), &text("Ada"));
    assert_eq!(
        before(c[0], "plan"),
        &Datum::Value(Value::Null),
        "a real NULL stays NULL"
    );
    assert_eq!(c[1].before.as_ref().unwrap().kind, ImageKind::Full);
    assert_eq!(before(c[1], "plan"), &text("pro"));
    stream.stop().await.unwrap();
}

/// Over 8 kB, stored out of line and uncompressed, so that it is TOASTed.
const BIG: &str = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g)";

#[tokio::test]
async fn unchanged_toast_is_marked_under_default_and_recoverable_under_full() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "CREATE TABLE d(id int PRIMARY KEY, doc text, n int);
         ALTER TABLE d ALTER COLUMN doc SET STORAGE EXTERNAL;
         CREATE TABLE f(id int PRIMARY KEY, doc text, n int);
         ALTER TABLE f ALTER COLUMN doc SET STORAGE EXTERNAL;
         ALTER TABLE f REPLICA IDENTITY FULL;
         INSERT INTO d VALUES (1, {BIG}, 0);
         INSERT INTO f VALUES (1, {BIG}, 0);"
    ))
    .await;
    let expected: String = db
        .client
        .query_one(&format!("SELECT {BIG}"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(expected.len() > 8192);
    let (load, mut stream) = open_fresh(&db, &db.options(&["d", "f"])).await;
    assert_eq!(
        after(changes(&load)[0], "doc"),
        &text(&expected),
        "the load reads the whole value"
    );

    db.exec("UPDATE d SET n = 1 WHERE id = 1").await;
    db.exec("UPDATE f SET n = 1 WHERE id = 1").await;
    let events = read_commits(&mut stream, 2).await;
    let c = changes(&events);

    assert_eq!(
        after(c[0], "doc"),
        &Datum::UnchangedToast,
        "DEFAULT: marked, not filled"
    );
    assert_eq!(after(c[0], "n"), &int4(1));
    assert!(c[0].before.is_none());

    assert_eq!(
        after(c[1], "doc"),
        &Datum::UnchangedToast,
        "FULL: the new tuple still omits it"
    );
    assert_eq!(
        before(c[1], "doc"),
        &text(&expected),
        "FULL: the old row carries the value"
    );
    stream.stop().await.unwrap();
}
