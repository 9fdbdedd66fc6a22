//! Partitioned tables: a partitioned table named in `--tables` is one
//! Iceberg table holding every partition at every level; a partition named
//! alone is a table of its own; what cannot work is refused before
//! anything is created (docs/tables.md, Partitioned tables).

use serde_json::json;
use wal2iceberg::cdc::capture;
use wal2iceberg::ops::run::run;

use crate::support::*;

/// `ev`, list-partitioned by region; `eu` sub-partitioned by id range, and
/// a default partition.
const EVENTS: &str = "
    CREATE TABLE ev(id int, region text, v int, note text, PRIMARY KEY (id, region))
      PARTITION BY LIST (region);
    CREATE TABLE ev_eu PARTITION OF ev FOR VALUES IN ('eu') PARTITION BY RANGE (id);
    CREATE TABLE ev_eu_lo PARTITION OF ev_eu FOR VALUES FROM (MINVALUE) TO (100);
    CREATE TABLE ev_eu_hi PARTITION OF ev_eu FOR VALUES FROM (100) TO (MAXVALUE);
    CREATE TABLE ev_us PARTITION OF ev FOR VALUES IN ('us');
    CREATE TABLE ev_other PARTITION OF ev DEFAULT;";

#[tokio::test]
async fn a_partitioned_table_is_one_lake_table_of_all_its_partitions() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "{EVENTS}
         INSERT INTO ev SELECT i, (ARRAY['eu', 'us', 'asia'])[1 + i % 3], i, 'loaded'
           FROM generate_series(1, 300) i;"
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("parts");
    let opts = run_options(&db, &["ev"], &slot, dir.path());
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "ev", dir.path(), "shop.ev").await;

    // Changes in every partition, rows moving between partitions and
    // levels, and a partition created while the run streams (the default
    // partition holds the asia rows, which must leave it first).
    db.exec(
        "INSERT INTO ev VALUES (1000, 'eu', 1, 'new'), (1001, 'us', 1, 'new');
         UPDATE ev SET v = v + 1 WHERE id % 7 = 0;
         UPDATE ev SET id = id + 100 WHERE region = 'eu' AND id < 30;
         UPDATE ev SET region = 'us' WHERE region = 'asia' AND id < 60;
         DELETE FROM ev WHERE id % 11 = 0;
         BEGIN;
         CREATE TEMP TABLE asia_rows AS SELECT * FROM ev_other WHERE region = 'asia';
         DELETE FROM ev_other WHERE region = 'asia';
         CREATE TABLE ev_asia PARTITION OF ev FOR VALUES IN ('asia');
         INSERT INTO ev SELECT * FROM asia_rows;
         COMMIT;
         INSERT INTO ev VALUES (2000, 'asia', 1, 'in a new partition');
         UPDATE ev SET note = 'moved' WHERE region = 'us' AND id > 250;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "ev", dir.path(), "shop.ev").await;

    // Bronze: one table, the root's; a row that moved partitions is a
    // delete and an insert of one transaction, as PostgreSQL decodes it.
    let bronze = pyiceberg(dir.path(), "shop.ev_changes", "rows").await;
    let moved: Vec<&serde_json::Value> = bronze
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| (r["id"] == json!(3) || r["id"] == json!(103)) && r["region"] == json!("eu"))
        .collect();
    let ops: Vec<&str> = moved
        .iter()
        .map(|r| r["_cdc_op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["r", "d", "c"], "{moved:?}");
    assert_eq!(moved[1]["_cdc_commit_lsn"], moved[2]["_cdc_commit_lsn"]);
    let tables = db
        .client
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&opts.capture.publication],
        )
        .await
        .unwrap();
    assert!(
        tables.get::<_, bool>(0),
        "the publication publishes via the root"
    );
}

#[tokio::test]
async fn a_partition_named_alone_is_a_table_of_its_own() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "{EVENTS}
         INSERT INTO ev SELECT i, (ARRAY['eu', 'us'])[1 + i % 2], i, 'x' FROM generate_series(1, 50) i;"
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["ev_us"], &unique("leaf"), dir.path());
    run(&db.config, &opts).await.unwrap();
    db.exec(
        "INSERT INTO ev VALUES (51, 'us', 0, 'y'), (52, 'eu', 0, 'y'); UPDATE ev_us SET v = -v;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "ev_us", dir.path(), "shop.ev_us").await;
}

#[tokio::test]
async fn partitioning_that_cannot_be_captured_is_refused_before_anything_is_created() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "{EVENTS}
         CREATE TABLE loose(id int, v int) PARTITION BY RANGE (id);
         CREATE TABLE loose_a PARTITION OF loose FOR VALUES FROM (0) TO (10);
         ALTER TABLE loose REPLICA IDENTITY FULL;
         CREATE PUBLICATION leaves FOR TABLE ev;
         CREATE PUBLICATION roots FOR TABLE ev WITH (publish_via_partition_root = true);"
    ))
    .await;
    let check = |tables: &[&str], publication: &str| {
        let mut options = db.options(tables);
        options.publication = publication.to_owned();
        let config = db.config.clone();
        async move {
            capture::check(&config, &options)
                .await
                .unwrap()
                .into_iter()
                .map(|f| f.check)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        check(&["ev", "ev_us"], "fresh").await,
        ["partition_and_root"]
    );
    assert_eq!(
        check(&["ev_eu_lo", "ev_eu"], "fresh").await,
        ["partition_and_root"]
    );
    assert_eq!(
        check(&["ev"], "leaves").await,
        ["publish_via_partition_root"]
    );
    assert_eq!(
        check(&["ev_us"], "roots").await,
        ["partition_published_via_root"]
    );
    // REPLICA IDENTITY FULL on the root does not reach its partitions.
    assert_eq!(check(&["loose"], "fresh").await, ["replica_identity"]);
    assert!(check(&["ev"], "roots").await.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let slots = db.slot_count().await;
    let err = run(
        &db.config,
        &run_options(&db, &["ev", "ev_us"], &unique("no"), dir.path()),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("ev_us") && err.contains("capture public.ev alone"),
        "{err}"
    );
    assert_eq!(db.slot_count().await, slots, "no slot was created");
}

#[tokio::test]
async fn a_partitioned_table_under_a_random_workload_a_new_partition_and_crashes_loses_and_repeats_nothing()
 {
    let mut oracle = crate::support::oracle::Oracle::partitioned(500).await;
    // A crash between bronze's and silver's commits of a streamed batch,
    // while rows move between partitions and levels.
    let point = "between-bronze-and-silver";
    let crashing = oracle.spawn_crashing_at(point, 3);
    oracle.wait_loaded().await;
    oracle.start_workload();
    oracle.expect_crash(crashing, point).await;
    // A partition created while the workload goes on, and rows in it,
    // then a run killed mid-stream.
    oracle
        .db
        .exec(
            "CREATE TABLE accounts_far PARTITION OF accounts FOR VALUES FROM (100000000) TO (200000000);
             INSERT INTO accounts SELECT i, 'far ' || i, i, NULL FROM generate_series(100000000, 100000200) i;
             UPDATE accounts SET id = id - 99999000 WHERE id BETWEEN 100000000 AND 100000010;",
        )
        .await;
    let mut killed = oracle.spawn();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    killed.kill().await.unwrap();
    let (changes, rows) = oracle.finish().await;
    assert!(
        changes > 100 && rows > 100,
        "{changes} changes, {rows} rows"
    );
}
