//! The initial load is consistent with the stream: no change committed
//! after the snapshot is missed, none before it repeated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rand::Rng;
use wal2iceberg::cdc::capture::{self, Capture};
use wal2iceberg::cdc::event::{Datum, Event, Op};
use wal2iceberg::cdc::value::Value;
use wal2iceberg::pg::source::SourceClient;

use crate::support::*;

async fn write_randomly(client: SourceClient, stop: Arc<AtomicBool>, commits: Arc<AtomicU64>) {
    let mut next_id = 100_000;
    while !stop.load(Ordering::Relaxed) {
        let sql = {
            let mut rng = rand::rng();
            let mut statements = Vec::new();
            for _ in 0..rng.random_range(1..4) {
                let id = rng.random_range(1..20_000);
                statements.push(match rng.random_range(0..3) {
                    0 => {
                        next_id += 1;
                        format!("INSERT INTO t VALUES ({next_id}, 0, 'new')")
                    }
                    1 => format!("UPDATE t SET val = val + 1, note = 'upd' WHERE id = {id}"),
                    _ => format!("DELETE FROM t WHERE id = {id}"),
                });
            }
            format!("BEGIN; {}; COMMIT;", statements.join("; "))
        };
        client.batch_execute(&sql).await.expect("writer");
        commits.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_plus_stream_equals_the_table_under_concurrent_writes() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE t(id int PRIMARY KEY, val int NOT NULL, note text);
         INSERT INTO t SELECT g, 0, 'orig' FROM generate_series(1, 20000) g;",
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicU64::new(0));
    let writer = tokio::spawn(write_randomly(
        SourceClient::connect(&db.config).await.unwrap(),
        stop.clone(),
        commits.clone(),
    ));
    while commits.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (load, mut stream) = open_fresh(&db, &db.options(&["t"])).await;
    let during_load = commits.load(Ordering::Relaxed);
    let streamed_so_far = read_commits(&mut stream, 50).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    db.exec("INSERT INTO t VALUES (-1, -1, 'sentinel')").await;
    let mut events = streamed_so_far;
    events.extend(
        read_until(&mut stream, |events| {
            changes(events)
                .iter()
                .any(|c| c.op == Op::Insert && after(c, "id") == &int4(-1))
                && matches!(events.last(), Some(Event::Commit { .. }))
        })
        .await,
    );

    let consistent_point = changes(&load)[0].tx.commit_lsn;
    let streamed = changes(&events);
    assert!(
        streamed.iter().all(|c| c.tx.commit_lsn > consistent_point),
        "nothing from before the snapshot is streamed again"
    );
    assert!(
        during_load > 20,
        "the writer kept committing while the load ran"
    );

    let mut model = Model::default();
    for change in changes(&load).into_iter().chain(streamed) {
        model.apply(change);
    }
    let rows = db
        .client
        .query("SELECT id, val, note FROM t ORDER BY id", &[])
        .await
        .unwrap();
    assert_eq!(model.rows.len(), rows.len(), "row count");
    for row in rows {
        let id: i32 = row.get(0);
        let expected = vec![
            serde_json::json!(id),
            serde_json::json!(row.get::<_, i32>(1)),
            serde_json::json!(row.get::<_, Option<String>>(2)),
        ];
        assert_eq!(model.rows.get(&id.to_string()), Some(&expected), "row {id}");
    }
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn one_publication_over_several_tables_and_a_truncate_of_both() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE a(id int PRIMARY KEY); CREATE TABLE b(id int PRIMARY KEY, a_id int REFERENCES a);
         INSERT INTO a VALUES (1); INSERT INTO b VALUES (1, 1);",
    )
    .await;
    let (load, mut stream) = open_fresh(&db, &db.options(&["public.a", "public.b"])).await;
    let tables: Vec<String> = changes(&load)
        .iter()
        .map(|c| c.relation.name.to_string())
        .collect();
    assert_eq!(tables, ["public.a", "public.b"]);

    db.exec("BEGIN; INSERT INTO a VALUES (2); INSERT INTO b VALUES (2, 2); COMMIT;")
        .await;
    db.exec("TRUNCATE a, b RESTART IDENTITY CASCADE").await;
    let events = read_commits(&mut stream, 2).await;
    assert_eq!(ops(&events), "cctt", "{}", summary(&events));
    let c = changes(&events);
    assert_eq!(c[0].tx, c[1].tx, "one transaction");
    assert_eq!((c[0].seq, c[1].seq), (0, 1));
    assert_eq!(c[1].relation.name.to_string(), "public.b");
    let truncated: Vec<String> = c[2..].iter().map(|c| c.relation.name.to_string()).collect();
    assert_eq!(truncated.len(), 2);
    assert!(
        truncated.contains(&"public.a".to_owned()) && truncated.contains(&"public.b".to_owned())
    );
    assert_eq!(
        c[2].truncate_options,
        wal2iceberg::pg::pgoutput::TRUNCATE_RESTART_IDENTITY
            | wal2iceberg::pg::pgoutput::TRUNCATE_CASCADE
    );
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn a_relation_sent_again_after_alter_table_updates_the_columns() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE t(id int PRIMARY KEY, a text, b text); INSERT INTO t VALUES (1, 'x', 'y');",
    )
    .await;
    let (_, mut stream) = open_fresh(&db, &db.options(&["t"])).await;
    db.exec("INSERT INTO t VALUES (2, 'x', 'y')").await;
    db.exec("ALTER TABLE t ADD COLUMN c int DEFAULT 7").await;
    db.exec("INSERT INTO t VALUES (3, 'x', 'y', 8)").await;
    db.exec("ALTER TABLE t DROP COLUMN a").await;
    db.exec("UPDATE t SET b = 'z' WHERE id = 1").await;
    let events = read_commits(&mut stream, 3).await;
    let c = changes(&events);
    let names = |i: usize| -> Vec<String> {
        c[i].relation
            .columns
            .iter()
            .map(|c| c.name.clone())
            .collect()
    };
    assert_eq!(names(0), ["id", "a", "b"]);
    assert_eq!(names(1), ["id", "a", "b", "c"]);
    assert_eq!(after(c[1], "c"), &int4(8));
    assert_eq!(names(2), ["id", "b", "c"]);
    assert_eq!(after(c[2], "c"), &int4(7));
    assert_eq!(after(c[2], "b"), &text("z"));
    assert_eq!(c[2].after.as_ref().unwrap().len(), 3);
    assert!(c[2].relation.columns[0].is_primary_key);
    assert!(!matches!(after(c[2], "id"), Datum::NotSent));
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn generated_columns_are_left_out_of_the_load_as_the_stream_leaves_them_out() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE g(id int PRIMARY KEY, a int, doubled int GENERATED ALWAYS AS (a * 2) STORED);
         INSERT INTO g(id, a) VALUES (1, 5);",
    )
    .await;
    let (load, mut stream) = open_fresh(&db, &db.options(&["g"])).await;
    db.exec("INSERT INTO g(id, a) VALUES (2, 6)").await;
    let events = read_commits(&mut stream, 1).await;
    for change in changes(&load).into_iter().chain(changes(&events)) {
        let names: Vec<&str> = change
            .relation
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["id", "a"]);
        assert_eq!(change.after.as_ref().unwrap().len(), 2);
    }
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn rows_of_one_multi_insert_share_an_lsn_and_differ_by_seq() {
    use futures_util::SinkExt;
    let db = TestDb::new().await;
    db.exec("CREATE TABLE m(id int PRIMARY KEY)").await;
    let (_, mut stream) = open_fresh(&db, &db.options(&["m"])).await;
    // COPY FROM writes its rows with heap multi-insert: one WAL record.
    let sink = db.client.copy_in("COPY m FROM STDIN").await.unwrap();
    futures_util::pin_mut!(sink);
    sink.send(bytes::Bytes::from_static(b"1\n2\n3\n"))
        .await
        .unwrap();
    sink.finish().await.unwrap();
    let events = read_commits(&mut stream, 1).await;
    let c = changes(&events);
    assert_eq!(c.len(), 3);
    assert!(
        c.iter().all(|x| x.lsn == c[0].lsn),
        "one record, one LSN: {}",
        summary(&events)
    );
    let keys: std::collections::HashSet<_> = c.iter().map(|x| (x.tx.commit_lsn, x.seq)).collect();
    assert_eq!(keys.len(), 3, "(commit_lsn, seq) tells them apart");
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn a_publication_with_more_tables_yields_only_the_captured_ones() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE wanted(id int PRIMARY KEY); CREATE TABLE other(id int PRIMARY KEY);
         CREATE PUBLICATION pub FOR ALL TABLES;",
    )
    .await;
    let (_, mut stream) = open_fresh(&db, &db.options(&["wanted"])).await;
    db.exec("BEGIN; INSERT INTO other VALUES (1); INSERT INTO wanted VALUES (1); COMMIT;")
        .await;
    let events = read_commits(&mut stream, 1).await;
    let c = changes(&events);
    assert_eq!(c.len(), 1, "{}", summary(&events));
    assert_eq!(c[0].relation.name.to_string(), "public.wanted");
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn the_load_reports_its_progress_against_the_planners_estimate() {
    use wal2iceberg::cdc::capture::{self, Capture};
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE big(id int PRIMARY KEY); INSERT INTO big SELECT generate_series(1, 70000);
         CREATE TABLE fresh(id int PRIMARY KEY); INSERT INTO fresh VALUES (1);",
    )
    .await;
    // VACUUM counts the rows exactly; ANALYZE would sample them.
    db.exec("VACUUM big").await;
    let Capture::Fresh {
        mut load, pending, ..
    } = capture::open(&db.config, &db.options(&["big", "fresh"]))
        .await
        .unwrap()
    else {
        panic!("a new slot");
    };
    let mut seen = Vec::new();
    while let Some(rows) = load.next_rows().await.unwrap() {
        seen.push((
            rows.relation.name.name.clone(),
            rows.rows.len(),
            rows.table_rows,
            rows.estimate,
        ));
    }
    // Rows come in runs of 64 Ki; the rows handed out so far are counted;
    // the estimate is the planner's, none for a table never analyzed.
    let big = |run, done| ("big".to_owned(), run, done, Some(70_000));
    assert_eq!(
        seen,
        [
            big(65_536, 65_536),
            big(4_464, 70_000),
            ("fresh".to_owned(), 1, 1, None)
        ]
    );
    drop(pending);
}

/// `err` is the load's refusal of table `b` after `ddl`, saying `said`:
/// a concurrent change, which the run retries with a new snapshot.
fn assert_concurrent(err: &wal2iceberg::Error, ddl: &str, said: &str) {
    assert_eq!(
        err.kind(),
        wal2iceberg::ErrorKind::Concurrent,
        "{ddl}: {err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("public.b") && text.contains(said),
        "{ddl}: {text}"
    );
}

#[tokio::test]
async fn a_truncate_or_alter_after_the_snapshot_stops_the_load_instead_of_loading_wrong_rows() {
    // Each change commits after the load's snapshot, before b is locked:
    // the snapshot would see b empty, a COPY of the snapshot's column
    // names would fail or read another column, or reach another table.
    for (ddl, said) in [
        ("TRUNCATE b", "truncated"),
        (
            "ALTER TABLE b RENAME COLUMN v TO w",
            "column of the table was renamed",
        ),
        (
            "ALTER TABLE b RENAME COLUMN v TO w; ALTER TABLE b ADD COLUMN v text",
            "column of the table was renamed",
        ),
        (
            "ALTER TABLE b DROP COLUMN v",
            "column of the table was renamed or dropped",
        ),
        (
            "ALTER TABLE b RENAME TO c",
            "renamed or dropped after the snapshot",
        ),
        (
            "ALTER TABLE b RENAME TO c; CREATE TABLE b(id int PRIMARY KEY, v text)",
            "name was given to another table",
        ),
    ] {
        let db = TestDb::new().await;
        db.exec(
            "CREATE TABLE a(id int PRIMARY KEY); CREATE TABLE b(id int PRIMARY KEY, v text);
             INSERT INTO a VALUES (1); INSERT INTO b VALUES (1, 'x'), (2, 'y');",
        )
        .await;
        let Capture::Fresh { mut load, .. } =
            capture::open(&db.config, &db.options(&["public.a", "public.b"]))
                .await
                .expect("open capture")
        else {
            panic!("expected a new slot");
        };
        // Table a is being read; b is not locked yet, so the change commits.
        let first = loop {
            if let Some(Event::Change(c)) = load.next_event().await.expect("load") {
                break c;
            }
        };
        assert_eq!(first.relation.name.to_string(), "public.a");
        db.exec(ddl).await;
        let err = loop {
            match load.next_event().await {
                Ok(Some(Event::Change(c))) => {
                    assert_ne!(
                        c.relation.name.to_string(),
                        "public.b",
                        "b loaded after {ddl}"
                    )
                }
                Ok(Some(_)) => {}
                Ok(None) => panic!("the load ended as if nothing happened to b: {ddl}"),
                Err(e) => break e,
            }
        };
        assert_concurrent(&err, ddl, said);
    }
}

/// The same on several connections, for a table without a key (which a
/// parallel load looks at for block ranges before it locks anything).
#[tokio::test]
async fn a_table_renamed_or_dropped_before_a_parallel_load_stops_it_to_be_retried() {
    for (ddl, said) in [
        (
            "ALTER TABLE b RENAME TO c",
            "renamed or dropped after the snapshot",
        ),
        (
            "ALTER TABLE b RENAME TO c; CREATE TABLE b(id int, v text)",
            "name was given to another table",
        ),
        ("DROP TABLE b", "renamed or dropped after the snapshot"),
    ] {
        let db = TestDb::new().await;
        db.exec(
            "CREATE TABLE b(id int, v text); ALTER TABLE b REPLICA IDENTITY FULL;
             INSERT INTO b VALUES (1, 'x');",
        )
        .await;
        let Capture::Fresh { load, pending, .. } =
            capture::open(&db.config, &db.options(&["public.b"]))
                .await
                .expect("open capture")
        else {
            panic!("expected a new slot");
        };
        db.exec(ddl).await;
        let lsn = load.consistent_point();
        let err = match load
            .in_parallel(&db.config, 2, move |rows| {
                rows.for_each_row(lsn, |_| {})?;
                Ok(())
            })
            .await
        {
            Err(e) => e,
            Ok(mut load) => match load.next().await {
                Ok(Some(())) => panic!("b loaded after {ddl}"),
                Ok(None) => panic!("the load ended as if nothing happened to b: {ddl}"),
                Err(e) => e,
            },
        };
        assert_concurrent(&err, ddl, said);
        drop(pending);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_load_in_parallel_on_connections_that_share_the_snapshot() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE a(id int PRIMARY KEY); INSERT INTO a SELECT generate_series(1, 1000);
         CREATE TABLE b(id int PRIMARY KEY); INSERT INTO b SELECT generate_series(1, 70000);
         CREATE TABLE c(id int PRIMARY KEY); INSERT INTO c VALUES (1);",
    )
    .await;
    let Capture::Fresh { load, pending, .. } =
        capture::open(&db.config, &db.options(&["a", "b", "c"]))
            .await
            .unwrap()
    else {
        panic!("a new slot");
    };
    // Committed after the snapshot: no connection of the load may see it.
    db.exec("INSERT INTO a VALUES (1001); DELETE FROM b WHERE id <= 10; INSERT INTO c VALUES (2);")
        .await;
    // Table a's COPY waits for this lock: read one after another, nothing
    // would come until it is released.
    let blocker = SourceClient::connect(&db.config).await.unwrap();
    blocker
        .batch_execute("BEGIN; LOCK TABLE a IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let lsn = load.consistent_point();
    let mut load = load
        .in_parallel(&db.config, 2, move |rows| {
            let mut ids = Vec::new();
            rows.for_each_row(lsn, |row| ids.push(row[0].clone()))?;
            Ok((rows.relation.name.name.clone(), ids))
        })
        .await
        .unwrap();
    let mut loaded = std::collections::BTreeMap::<String, Vec<Datum>>::new();
    let add = |loaded: &mut std::collections::BTreeMap<String, Vec<Datum>>,
               (table, ids): (String, Vec<Datum>)| {
        loaded.entry(table).or_default().extend(ids)
    };
    while loaded.get("b").map_or(0, Vec::len) < 70_000 || !loaded.contains_key("c") {
        let next = tokio::time::timeout(std::time::Duration::from_secs(30), load.next())
            .await
            .expect("b and c load while a waits for its lock");
        add(&mut loaded, next.unwrap().expect("the load is not over"));
    }
    blocker.batch_execute("COMMIT").await.unwrap();
    while let Some(run) = load.next().await.unwrap() {
        add(&mut loaded, run);
    }
    let ids = |range: std::ops::RangeInclusive<i32>| range.map(int4).collect::<Vec<_>>();
    assert_eq!(loaded.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(loaded["a"], ids(1..=1000));
    assert_eq!(loaded["b"], ids(1..=70_000));
    assert_eq!(loaded["c"], ids(1..=1));
    let mut relations: Vec<_> = load
        .relations()
        .iter()
        .map(|r| r.name.name.clone())
        .collect();
    relations.sort();
    assert_eq!(relations, ["a", "b", "c"]);
    drop(pending);
}

#[tokio::test]
async fn a_large_keyless_table_is_read_in_block_ranges_on_every_connection_at_once() {
    let db = TestDb::new().await;
    // About 5,000 pages: three ranges of 1,024 pages or more, each read in
    // several runs.
    db.exec(
        "CREATE TABLE k(id int NOT NULL, pad text); ALTER TABLE k REPLICA IDENTITY FULL;
         INSERT INTO k SELECT g, repeat('x', 60) FROM generate_series(1, 400000) g;",
    )
    .await;
    let Capture::Fresh { load, pending, .. } = capture::open(&db.config, &db.options(&["k"]))
        .await
        .unwrap()
    else {
        panic!("a new slot");
    };
    // After the snapshot: new versions in blocks past its end, old ones
    // gone from the table but not from the snapshot.
    db.exec(
        "UPDATE k SET pad = 'moved' WHERE id % 3 = 0; DELETE FROM k WHERE id % 7 = 0;
         INSERT INTO k SELECT g, 'late' FROM generate_series(400001, 460000) g;",
    )
    .await;
    let lsn = load.consistent_point();
    let mut load = load
        .in_parallel(&db.config, 3, move |rows| {
            let mut ids = Vec::new();
            rows.for_each_row(lsn, |row| ids.push(row.clone()))?;
            Ok(ids)
        })
        .await
        .unwrap();
    let ranged =
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COPY%ctid%' AND state = 'active'";
    let mut at_once = 0;
    let mut rows = Vec::new();
    while let Some(run) = load.next().await.unwrap() {
        let active: i64 = db.client.query_one(ranged, &[]).await.unwrap().get(0);
        at_once = at_once.max(active);
        rows.extend(run);
    }
    assert!(at_once >= 2, "ranges of the table read at once: {at_once}");
    rows.sort_by_key(|row| match &row[0] {
        Datum::Value(Value::Int4(id)) => *id,
        other => panic!("an id: {other:?}"),
    });
    let expected: Vec<Vec<Datum>> = (1..=400_000)
        .map(|id| vec![int4(id), Datum::Value(Value::Text("x".repeat(60)))])
        .collect();
    assert!(
        rows == expected,
        "each row of the snapshot once, as it was then"
    );
    drop(pending);
}

#[tokio::test]
async fn a_failure_on_one_load_connection_stops_the_parallel_load() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE a(id int PRIMARY KEY); CREATE TABLE b(id int PRIMARY KEY);
         INSERT INTO a SELECT generate_series(1, 200000); INSERT INTO b VALUES (1);",
    )
    .await;
    let Capture::Fresh { load, pending, .. } =
        capture::open(&db.config, &db.options(&["public.a", "public.b"]))
            .await
            .unwrap()
    else {
        panic!("a new slot");
    };
    db.exec("TRUNCATE b").await;
    let mut load = load
        .in_parallel(&db.config, 2, |rows| Ok(rows.rows.len()))
        .await
        .unwrap();
    let err = loop {
        match load.next().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the load ended as if b were empty"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), wal2iceberg::ErrorKind::Concurrent, "{err}");
    assert!(err.to_string().contains("public.b"), "{err}");
    drop(pending);
}
