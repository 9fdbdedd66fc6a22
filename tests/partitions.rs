//! Partitioned tables: a partitioned table named in `--tables` is one
//! Iceberg table holding every partition at every level; a partition named
//! alone is a table of its own; what cannot work is refused before
//! anything is created (docs/tables.md, Partitioned tables).

use serde_json::json;
use wal2iceberg::apply::{RunOptions, run};
use wal2iceberg::cdc::capture;

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

/// [`EVENTS`] with 300 rows in three regions, loaded into a new lake.
async fn loaded_events(slot: &str) -> (TestDb, tempfile::TempDir, RunOptions) {
    let db = TestDb::new().await;
    db.exec(&format!(
        "{EVENTS}
         INSERT INTO ev SELECT i, (ARRAY['eu', 'us', 'asia'])[1 + i % 3], i, 'loaded'
           FROM generate_series(1, 300) i;"
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["ev"], &unique(slot), dir.path());
    run(&db.config, &opts).await.unwrap();
    (db, dir, opts)
}

#[tokio::test]
async fn a_partitioned_table_is_one_lake_table_of_all_its_partitions() {
    let (db, dir, opts) = loaded_events("parts").await;
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
         UPDATE ev SET note = 'moved' WHERE region = 'us' AND id > 250;
         BEGIN;
         DELETE FROM ev WHERE id = 4;
         INSERT INTO ev VALUES (4, 'eu', 0, 'deleted, then inserted elsewhere');
         COMMIT;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "ev", dir.path(), "shop.ev").await;

    // Bronze: one table, the root's; a row that moved partitions is one
    // update, its before image the key it moved from, though PostgreSQL
    // decodes a delete and an insert.
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
    assert_eq!(ops, ["r", "u"], "{moved:?}");
    assert_eq!(moved[1]["id"], json!(103));
    assert_eq!(moved[1]["_cdc_before"]["id"], json!(3), "{moved:?}");
    let replaced: Vec<&str> = bronze
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["id"] == json!(4))
        .map(|r| r["_cdc_op"].as_str().unwrap())
        .collect();
    assert_eq!(replaced, ["r", "d", "c"], "a delete and an insert stay so");
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
async fn a_partitioned_table_under_a_random_workload_new_and_attached_partitions_and_crashes_loses_and_repeats_nothing()
 {
    let mut oracle = crate::support::oracle::Oracle::partitioned(500).await;
    // A crash between bronze's and silver's commits of a streamed batch,
    // while rows move between partitions and levels.
    let point = "between-bronze-and-silver";
    oracle.table_by_table();
    let mut crashing = oracle.spawn_crashing_at(point, 3);
    oracle.wait_loaded(&mut crashing).await;
    oracle.start_workload();
    oracle.expect_crash(crashing, point).await;
    // While a run streams: a partition created while the workload goes
    // on, and rows in it; a table holding rows attached (the audit records
    // its rows as reads in the attaching transaction, as bronze must show
    // them), rows moved into it, a partition truncated alone (its rows
    // deletes); then the run killed. The workload pauses for the attach
    // and the truncate so that the audit's order stays the commit order.
    let mut killed = oracle.spawn();
    oracle.db.wait_until_active(&oracle.slot).await;
    oracle
        .db
        .exec(
            "CREATE TABLE accounts_far PARTITION OF accounts FOR VALUES FROM (100000000) TO (200000000);
             INSERT INTO accounts SELECT i, 'far ' || i, i, NULL FROM generate_series(100000000, 100000200) i;
             UPDATE accounts SET id = id - 99999000 WHERE id BETWEEN 100000000 AND 100000010;",
        )
        .await;
    oracle.stop_workload().await;
    oracle
        .db
        .exec(
            "CREATE TABLE accounts_attached(id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL, note text);
             INSERT INTO accounts_attached SELECT i, 'attached ' || i, i / 4.0, repeat('n', 3000)
               FROM generate_series(200000000, 200000099) i;
             BEGIN;
             ALTER TABLE accounts ATTACH PARTITION accounts_attached FOR VALUES FROM (200000000) TO (300000000);
             INSERT INTO audit(op, new) SELECT 'r', to_jsonb(a) FROM accounts_attached a;
             COMMIT;
             BEGIN;
             INSERT INTO audit(op, old) SELECT 'd', to_jsonb(a) FROM accounts_low_1 a;
             TRUNCATE accounts_low_1;
             COMMIT;
             UPDATE accounts SET balance = balance + 1 WHERE id BETWEEN 200000000 AND 200000020;
             UPDATE accounts SET id = id - 400000000 WHERE id BETWEEN 200000050 AND 200000060;",
        )
        .await;
    oracle.start_workload();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    killed.kill().await.unwrap();
    // The workload's own TRUNCATE may leave few rows live: the changes
    // are what must have been many.
    let (changes, rows) = oracle.finish().await;
    assert!(changes > 100, "{changes} changes, {rows} rows");
}

/// A table of `ev`'s columns, and twenty rows of `region` from id
/// `from` on, with values large enough to be TOASTed.
fn standalone(name: &str) -> String {
    format!("CREATE TABLE {name}(id int, region text, v int, note text, PRIMARY KEY (id, region));")
}

fn rows(table: &str, region: &str, from: i32) -> String {
    format!(
        "INSERT INTO {table} SELECT i, '{region}', i, repeat('{region} ', 3000 + i)
           FROM generate_series({from}, {from} + 19) i;"
    )
}

#[tokio::test]
async fn rows_a_partition_held_when_attached_reach_the_lake_at_the_attach_whether_stopped_or_streaming()
 {
    let db = TestDb::new().await;
    db.exec(&format!(
        "{EVENTS}
         INSERT INTO ev SELECT i, (ARRAY['eu', 'us'])[1 + i % 2], i, 'loaded' FROM generate_series(1, 100) i;"
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("attach");
    let opts = run_options(&db, &["ev"], &slot, dir.path());
    run(&db.config, &opts).await.unwrap();

    // While stopped: one partition attached inside a savepoint, a
    // partitioned table with rows in its partition attached, then a
    // partition with rows attached to it, below the root; then changes to the attached rows, whose large values an
    // update leaves unchanged (TOAST), and a detach.
    db.exec(&format!(
        "{}{}
         CREATE TABLE ev_jp(id int, region text, v int, note text, PRIMARY KEY (id, region))
           PARTITION BY RANGE (id);
         CREATE TABLE ev_jp_lo PARTITION OF ev_jp FOR VALUES FROM (MINVALUE) TO (1010);
         {}{}{}
         BEGIN;
         INSERT INTO ev VALUES (500, 'us', 0, 'before the attach');
         SAVEPOINT s;
         ALTER TABLE ev ATTACH PARTITION ev_asia FOR VALUES IN ('asia');
         RELEASE s;
         UPDATE ev SET v = -v WHERE id = 300;
         COMMIT;
         ALTER TABLE ev ATTACH PARTITION ev_jp FOR VALUES IN ('jp');
         ALTER TABLE ev_jp ATTACH PARTITION ev_jp_hi FOR VALUES FROM (1010) TO (MAXVALUE);
         UPDATE ev SET v = v + 1000 WHERE region IN ('asia', 'jp') AND id % 3 = 0;
         DELETE FROM ev WHERE region = 'jp' AND id % 5 = 0;
         ALTER TABLE ev DETACH PARTITION ev_us;",
        standalone("ev_asia"),
        rows("ev_asia", "asia", 300),
        rows("ev_jp", "jp", 1000).replace("+ 19", "+ 9"),
        standalone("ev_jp_hi"),
        rows("ev_jp_hi", "jp", 1010).replace("+ 19", "+ 9"),
    ))
    .await;
    run(&db.config, &opts).await.unwrap();
    // The detached partition's rows stay in the lake (docs/tables.md).
    db.exec("ALTER TABLE ev ATTACH PARTITION ev_us FOR VALUES IN ('us')")
        .await;
    assert_reconciled(&db, "ev", dir.path(), "shop.ev").await;

    // While streaming: a partition attached, its rows changed at once.
    let mut streaming = run_options(&db, &["ev"], &slot, dir.path());
    streaming.run.exit_when_idle = None;
    let shutdown = streaming.shutdown.clone();
    let config = db.config.clone();
    let pipeline = tokio::spawn(async move { run(&config, &streaming).await });
    db.wait_until_active(&slot).await;
    db.exec(&format!(
        "{}{}
         ALTER TABLE ev ATTACH PARTITION ev_fr FOR VALUES IN ('fr');
         UPDATE ev SET note = 'right after its read' WHERE region = 'fr' AND id = 2019;
         UPDATE ev SET v = v + 2000 WHERE region = 'fr' AND id % 2 = 0;
         DELETE FROM ev WHERE region = 'fr' AND id % 7 = 0;",
        standalone("ev_fr"),
        rows("ev_fr", "fr", 2000)
    ))
    .await;
    let target = db.wal_insert_lsn().await;
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while db.confirmed_flush(&slot).await.unwrap() < target {
        assert!(
            std::time::Instant::now() < give_up,
            "the run did not catch up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    shutdown.request();
    pipeline.await.unwrap().unwrap();
    assert_reconciled(&db, "ev", dir.path(), "shop.ev").await;
    // Verify's replay of bronze counts an attached partition's reads as
    // rows of one partition, not as a load of the whole table.
    assert_success(&verify_lake(&db, &slot, dir.path(), "public.ev").await);

    // Bronze: each attached row is a read, at its attach's commit.
    let bronze = pyiceberg(dir.path(), "shop.ev_changes", "rows").await;
    let attached = |region: &str| -> Vec<(String, i64)> {
        bronze
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["region"] == json!(region) && r["_cdc_op"] == json!("r"))
            .map(|r| (r["_cdc_commit_lsn"].to_string(), r["id"].as_i64().unwrap()))
            .collect()
    };
    for region in ["asia", "jp", "fr"] {
        let reads = attached(region);
        assert_eq!(reads.len(), 20, "{region}: {reads:?}");
        assert!(
            reads.iter().all(|(lsn, _)| lsn == &reads[0].0),
            "{region}: one commit holds them: {reads:?}"
        );
    }
}

#[tokio::test]
async fn a_partitioned_table_needs_the_partition_triggers_which_a_superuser_setup_installs() {
    let db = TestDb::new().await;
    let role = unique("plain");
    db.exec(&format!(
        "{EVENTS}
         CREATE ROLE {role} LOGIN REPLICATION;
         GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role};"
    ))
    .await;
    let mut config = db.config.clone();
    config.user = role;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["ev"], &unique("plain"), dir.path());
    let failures = capture::check(&config, &opts.capture).await.unwrap();
    let f = failures
        .iter()
        .find(|f| f.check == "partition_rows_triggers")
        .unwrap_or_else(|| panic!("{failures:?}"));
    assert!(
        f.problem.contains("public.ev") && f.fix.contains("wal2iceberg setup --tables public.ev"),
        "{f}"
    );
    let slots = db.slot_count().await;
    let err = run(&config, &opts).await.unwrap_err().to_string();
    assert!(err.contains("partition_rows_triggers"), "{err}");
    assert_eq!(db.slot_count().await, slots, "no slot was created");

    let ev = wal2iceberg::model::TableName::parse("public.ev").unwrap();
    wal2iceberg::ops::setup::setup(&db.config, &[ev])
        .await
        .unwrap();
    let failures = capture::check(&config, &opts.capture).await.unwrap();
    assert!(
        failures
            .iter()
            .all(|f| f.check != "partition_rows_triggers"),
        "{failures:?}"
    );
}

#[tokio::test]
async fn a_truncate_of_partitions_alone_deletes_their_rows_and_one_of_the_whole_table_stays_a_truncate()
 {
    let (db, dir, opts) = loaded_events("trunc").await;
    // A leaf, a partitioned partition (its leaves send), and a partition
    // created after the run began, in one transaction with other changes.
    db.exec(
        "CREATE TABLE ev_jp PARTITION OF ev FOR VALUES IN ('jp');
         INSERT INTO ev SELECT i, 'jp', i, 'jp' FROM generate_series(1000, 1009) i;
         BEGIN;
         UPDATE ev SET v = -v WHERE region = 'us' AND id < 50;
         TRUNCATE ev_us;
         INSERT INTO ev VALUES (2000, 'us', 1, 'after the truncate');
         COMMIT;
         TRUNCATE ev_eu_lo, ev_jp;
         TRUNCATE ev_eu;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "ev", dir.path(), "shop.ev").await;
    let bronze = pyiceberg(dir.path(), "shop.ev_changes", "rows").await;
    let count = |op: &str| {
        bronze
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["_cdc_op"] == json!(op))
            .count()
    };
    // us: 100 rows; eu: 33 in its low leaf, then the other 67; jp: 10.
    assert_eq!(count("d"), 210, "one delete per truncated row");
    assert_eq!(count("t"), 0);

    db.exec("INSERT INTO ev VALUES (3000, 'eu', 1, 'x'); TRUNCATE ev;")
        .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "ev", dir.path(), "shop.ev").await;
    let ops = bronze_ops(dir.path(), "shop.ev_changes").await;
    assert_eq!(
        (ops.matches('d').count(), ops.chars().last()),
        (210, Some('t')),
        "a TRUNCATE of the partitioned table sends no keys"
    );
}

#[tokio::test]
async fn a_partition_trigger_that_fails_never_fails_the_users_command_and_the_run_says_so() {
    let (db, dir, opts) = loaded_events("failing").await;
    // A broken helper of the triggers (as a bug would be): the user's
    // ATTACH and TRUNCATE still go through.
    db.exec(&format!(
        "DROP FUNCTION wal2iceberg.emit_rows(text, oid, regclass, text[]);
         {}{}
         ALTER TABLE ev ATTACH PARTITION ev_jp FOR VALUES IN ('jp');
         TRUNCATE ev_us;",
        standalone("ev_jp"),
        rows("ev_jp", "jp", 5000)
    ))
    .await;
    let lake = dir.path().display().to_string();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args([
            "run",
            "--source",
            &db.config_url(),
            "--tables",
            "public.ev",
            "--slot",
            &opts.capture.slot,
            "--publication",
            &opts.capture.publication,
            "--lake",
            &lake,
            "--namespace",
            "shop",
            "--exit-when-idle",
            "1s",
        ])
        .env("RUST_LOG", "wal2iceberg=warn")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("partition trigger failed")
            && stderr.contains("public.ev_jp")
            && stderr.contains("public.ev_us"),
        "{stderr}"
    );
}
