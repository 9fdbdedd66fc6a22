//! `wal2iceberg run` end to end: source changes to bronze and silver,
//! read back through pyiceberg and DuckDB.

use std::time::Duration;

use serde_json::json;
use wal2iceberg::apply::{RunOptions, run};

use crate::support::*;

fn options(db: &TestDb, slot: &str, lake: &std::path::Path) -> RunOptions {
    run_options(db, &["customers"], slot, lake)
}

async fn ops_and_plans(lake: &std::path::Path) -> (String, Vec<(i64, String)>) {
    let ops = bronze_ops(lake, "shop.customers_changes").await;
    let plans = id_plan_rows(lake, "shop.customers").await;
    (ops, plans)
}

#[tokio::test]
async fn run_lands_the_seed_walkthrough_and_a_replay_adds_nothing() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL, plan text NOT NULL);
         ALTER TABLE customers REPLICA IDENTITY FULL;
         INSERT INTO customers VALUES (1,'Ada','free'),(2,'Grace','pro'),(3,'Linus','free');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("run");
    let report = run(&db.config, &options(&db, &slot, dir.path()))
        .await
        .unwrap();
    assert_eq!(report.changes_applied, 3);
    let (ops, plans) = ops_and_plans(dir.path()).await;
    assert_eq!(ops, "rrr");
    assert_eq!(
        plans,
        [(1, "free".into()), (2, "pro".into()), (3, "free".into())]
    );

    // A copy of the slot that never hears the next confirmation: what a
    // crash after the Iceberg commits and before the confirmation leaves.
    let stale = unique("stale");
    db.exec(&format!(
        "SELECT pg_copy_logical_replication_slot('{slot}', '{stale}')"
    ))
    .await;

    for sql in SEED_CHANGES {
        db.exec(sql).await;
    }
    let report = run(&db.config, &options(&db, &slot, dir.path()))
        .await
        .unwrap();
    assert_eq!(report.changes_applied, 4);
    let after_run = ops_and_plans(dir.path()).await;
    assert_eq!(after_run.0, "rrruudc");
    assert_eq!(
        after_run.1,
        [(1, "team".into()), (2, "pro".into()), (4, "free".into())]
    );
    assert_eq!(db.confirmed_flush(&slot).await, Some(report.confirmed));
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;

    // The replay: the stale copy, under the slot's name (the lake claims
    // its slot by name), sends the four changes again.
    db.exec(&format!(
        "SELECT pg_drop_replication_slot('{slot}');
         SELECT pg_copy_logical_replication_slot('{stale}', '{slot}');
         SELECT pg_drop_replication_slot('{stale}');"
    ))
    .await;
    let replay = run(&db.config, &options(&db, &slot, dir.path()))
        .await
        .unwrap();
    assert_eq!(replay.changes_applied, 4, "the changes did come again");
    assert_eq!(
        ops_and_plans(dir.path()).await,
        after_run,
        "bronze still seven rows, silver unchanged"
    );
    let summary = pyiceberg(dir.path(), "shop.customers_changes", "summary").await;
    assert_eq!(summary["total-records"], json!("7"));

    // DuckDB reads the same: position deletes applied, seven changes.
    let silver = id_plan_pairs(&duckdb(dir.path(), "shop.customers").await);
    assert_eq!(silver, after_run.1);
    let bronze = duckdb(dir.path(), "shop.customers_changes").await;
    assert_eq!(bronze.as_array().unwrap().len(), 7);
}

#[tokio::test]
async fn default_and_full_identity_give_the_same_silver_across_one_transaction() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE full_t(id int PRIMARY KEY, name text, plan text);
         ALTER TABLE full_t REPLICA IDENTITY FULL;
         CREATE TABLE default_t(id int PRIMARY KEY, name text, plan text);
         INSERT INTO full_t VALUES (1,'Ada','free'),(2,'Grace','pro');
         INSERT INTO default_t VALUES (1,'Ada','free'),(2,'Grace','pro');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&db, &unique("both"), dir.path());
    opts.capture = db.options(&["full_t", "default_t"]);
    run(&db.config, &opts).await.unwrap();
    db.exec(
        "BEGIN;
         UPDATE full_t SET plan='team' WHERE id=1; UPDATE default_t SET plan='team' WHERE id=1;
         DELETE FROM full_t WHERE id=2; DELETE FROM default_t WHERE id=2;
         COMMIT;",
    )
    .await;
    let report = run(&db.config, &opts).await.unwrap();
    assert_eq!(report.changes_applied, 4);

    let full = id_plan_rows(dir.path(), "shop.full_t").await;
    assert_eq!(full, [(1, "team".to_owned())]);
    assert_eq!(
        id_plan_rows(dir.path(), "shop.default_t").await,
        full,
        "silver is the same for both"
    );

    let bronze = |table: &'static str| {
        let lake = dir.path().to_owned();
        async move { pyiceberg(&lake, table, "rows").await }
    };
    let full_b = bronze("shop.full_t_changes").await;
    let default_b = bronze("shop.default_t_changes").await;
    // One source transaction: both tables' changes share its commit LSN.
    assert_eq!(
        full_b[2]["_cdc_commit_lsn"],
        default_b[2]["_cdc_commit_lsn"]
    );
    assert_eq!(full_b[2]["_cdc_before"]["_cdc_image"], json!("full"));
    assert_eq!(full_b[2]["_cdc_before"]["plan"], json!("free"));
    assert_eq!(
        default_b[2]["_cdc_before"],
        serde_json::Value::Null,
        "DEFAULT: no old tuple for a non-key update"
    );
    assert_eq!(full_b[3]["_cdc_op"], json!("d"));
    assert_eq!(full_b[3]["name"], json!("Grace"));
    assert_eq!(default_b[3]["_cdc_before"]["_cdc_image"], json!("key"));
    assert_eq!(default_b[3]["name"], serde_json::Value::Null);
    assert_eq!(
        default_b[3]["_cdc_before"]["_cdc_not_sent"],
        json!(["name", "plan"])
    );
    for table in ["full_t", "default_t"] {
        assert_reconciled(&db, table, dir.path(), &format!("shop.{table}")).await;
    }

    // One TRUNCATE of both, then a row: bronze records it, silver empties in
    // the same snapshot that adds the row.
    db.exec("BEGIN; TRUNCATE full_t, default_t; INSERT INTO default_t VALUES (9, 'Lin', 'pro'); COMMIT;")
        .await;
    run(&db.config, &opts).await.unwrap();
    assert_eq!(bronze_ops(dir.path(), "shop.full_t_changes").await, "rrudt");
    assert_eq!(
        bronze_ops(dir.path(), "shop.default_t_changes").await,
        "rrudtc"
    );
    assert_eq!(id_plan_rows(dir.path(), "shop.full_t").await, []);
    assert_eq!(
        id_plan_rows(dir.path(), "shop.default_t").await,
        [(9, "pro".to_owned())]
    );
    for table in ["full_t", "default_t"] {
        assert_reconciled(&db, table, dir.path(), &format!("shop.{table}")).await;
    }
}

fn options_for(db: &TestDb, tables: &[&str], slot: &str, lake: &std::path::Path) -> RunOptions {
    run_options(db, tables, slot, lake)
}

/// The `_cdc_op` codes of a bronze table, in commit order.
async fn bronze_ops(lake: &std::path::Path, table: &str) -> String {
    pyiceberg(lake, table, "rows")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["_cdc_op"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn unchanged_toast_under_default_is_filled_from_the_current_row() {
    let db = TestDb::new().await;
    // EXTERNAL storage keeps the 6,400-byte bodies out of line and
    // uncompressed, so an update that leaves them alone does not send them.
    db.exec(
        "CREATE TABLE docs(id int PRIMARY KEY, n int NOT NULL, body text NOT NULL);
         ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
         INSERT INTO docs SELECT i, 0, repeat(md5(i::text), 200) FROM generate_series(1, 3) i;",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = options_for(&db, &["docs"], &unique("toast"), dir.path());
    run(&db.config, &opts).await.unwrap();

    // From the committed data file.
    db.exec("UPDATE docs SET n = 1 WHERE id = 1").await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "docs", dir.path(), "shop.docs").await;

    // From the open batch, and across a primary-key change (the old key's
    // row holds the value).
    db.exec(
        "INSERT INTO docs VALUES (4, 0, repeat(md5('4'), 200));
         UPDATE docs SET n = 2 WHERE id = 4;
         UPDATE docs SET n = 3 WHERE id = 2;
         UPDATE docs SET id = 5, n = 4 WHERE id = 3;",
    )
    .await;
    let report = run(&db.config, &opts).await.unwrap();
    assert_eq!(report.changes_applied, 4);
    assert_reconciled(&db, "docs", dir.path(), "shop.docs").await;

    // Bodies never change here, so every update's bronze row must hold the
    // body its key has at the source now.
    let source: std::collections::HashMap<i32, String> = db
        .client
        .query("SELECT id, body FROM docs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let bronze = pyiceberg(dir.path(), "shop.docs_changes", "rows").await;
    let updates: Vec<_> = bronze
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] == json!("u"))
        .collect();
    assert_eq!(updates.len(), 4);
    for row in updates {
        let id = row["id"].as_i64().unwrap() as i32;
        assert_eq!(
            row["body"].as_str(),
            Some(source[&id].as_str()),
            "bronze holds the real value of {id}, not a placeholder"
        );
    }
}

/// A fill reads the row group that holds the row, not the whole file:
/// rows in the first and in a later row group (128 Ki rows each) of the
/// load's data file get their bodies back.
#[tokio::test]
async fn unchanged_toast_is_filled_from_the_row_group_that_holds_the_row() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE docs(id int PRIMARY KEY, n int NOT NULL, body text NOT NULL);
         ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
         INSERT INTO docs SELECT i, 0,
           CASE WHEN i IN (5, 135000, 139999) THEN repeat(md5(i::text), 200) ELSE '' END
         FROM generate_series(1, 140000) i;",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = options_for(&db, &["docs"], &unique("groups"), dir.path());
    run(&db.config, &opts).await.unwrap();
    db.exec("UPDATE docs SET n = 1 WHERE id IN (5, 135000, 139999)")
        .await;
    let report = run(&db.config, &opts).await.unwrap();
    assert_eq!(report.changes_applied, 3);
    let silver = db
        .client
        .query("SELECT id FROM docs WHERE n = 1", &[])
        .await
        .unwrap();
    assert_eq!(silver.len(), 3);
    let bronze = pyiceberg(dir.path(), "shop.docs_changes", "rows").await;
    let updated: Vec<(i64, usize)> = bronze
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] == json!("u"))
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["body"].as_str().map_or(0, str::len),
            )
        })
        .collect();
    assert_eq!(updated, [(5, 6400), (135000, 6400), (139999, 6400)]);
    assert_reconciled(&db, "docs", dir.path(), "shop.docs").await;
}

/// A clean stop persists silver's key index under the state directory;
/// the next start restores it, and only when silver is still at the
/// snapshot it was persisted at: another writer's snapshot, or a killed
/// run, make the next start rebuild it, and the rows stay right.
#[tokio::test]
async fn the_key_index_persisted_at_a_clean_stop_is_restored_only_at_its_snapshot() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE accounts(id int PRIMARY KEY, plan text NOT NULL);
         INSERT INTO accounts SELECT g, 'free' FROM generate_series(1, 2000) g;",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().display().to_string();
    let slot = unique("state");
    let url = db.config_url();
    let args = [
        "run",
        "--source",
        &url,
        "--slot",
        &slot,
        "--lake",
        &lake,
        "--namespace",
        "shop",
        "--tables",
        "public.accounts",
    ];
    let command = || {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"));
        command
            .args(args)
            .env("RUST_LOG", "wal2iceberg=info")
            .kill_on_drop(true);
        command
    };
    let run_once = || async {
        let out = command()
            .args(["--exit-when-idle", "1s"])
            .output()
            .await
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{said}");
        said
    };
    let folder = dir.path().join("state/shop/accounts");
    let first = run_once().await;
    assert!(folder.join("index.json").exists(), "persisted: {first}");

    db.exec(
        "UPDATE accounts SET plan = 'pro' WHERE id % 7 = 0;
         DELETE FROM accounts WHERE id % 11 = 0;
         INSERT INTO accounts VALUES (5000, 'new');",
    )
    .await;
    let second = run_once().await;
    assert!(
        second.contains("silver key index restored") && !second.contains("key index rebuilt"),
        "{second}"
    );
    assert_reconciled(&db, "accounts", dir.path(), "shop.accounts").await;

    // Another writer's snapshot: the index persisted is not of it.
    tamper(
        dir.path(),
        "shop.accounts",
        &["rewrite", "14", "plan", "pro"],
    )
    .await;
    db.exec("UPDATE accounts SET plan = 'team' WHERE id IN (14, 15)")
        .await;
    let third = run_once().await;
    assert!(
        third.contains("silver key index rebuilt") && !third.contains("index restored"),
        "{third}"
    );
    assert_reconciled(&db, "accounts", dir.path(), "shop.accounts").await;

    // A killed run persisted nothing, and took the index it restored.
    let mut running = command().spawn().unwrap();
    db.wait_until_streaming(&slot).await;
    db.exec("UPDATE accounts SET plan = 'killed' WHERE id = 16")
        .await;
    running.kill().await.unwrap();
    running.wait().await.unwrap();
    assert!(!folder.join("index.json").exists());
    let fourth = run_once().await;
    assert!(fourth.contains("silver key index rebuilt"), "{fourth}");
    assert_reconciled(&db, "accounts", dir.path(), "shop.accounts").await;

    // A resync's reload replaces every row: its index is exact, and kept.
    request_resync(&db, dir.path(), "public.accounts").await;
    run_once().await;
    let after_resync = run_once().await;
    assert!(
        after_resync.contains("silver key index restored"),
        "{after_resync}"
    );
    assert_reconciled(&db, "accounts", dir.path(), "shop.accounts").await;
    let left: Vec<_> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.len() <= 2,
        "the index and its one run, no more: {left:?}"
    );
}

#[tokio::test]
async fn tables_the_lake_lacks_are_loaded_from_a_new_snapshot_while_the_others_stream() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE a(id int PRIMARY KEY, v text);
         CREATE TABLE b(id int PRIMARY KEY, v text);
         CREATE TABLE empty_t(id int PRIMARY KEY);
         INSERT INTO a SELECT i, 'a' || i FROM generate_series(1, 3) i;
         INSERT INTO b SELECT i, 'b' || i FROM generate_series(1, 3) i;",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("added");
    run(
        &db.config,
        &options_for(&db, &["a", "empty_t"], &slot, dir.path()),
    )
    .await
    .unwrap();
    // An empty source table gets both tables, marked loaded.
    assert_eq!(
        pyiceberg(dir.path(), "shop.empty_t", "rows").await,
        json!([])
    );
    let summary = pyiceberg(dir.path(), "shop.empty_t_changes", "summary").await;
    assert!(summary["wal2iceberg.end-lsn"].is_string(), "{summary}");

    // b joins later: changes made to it before then are in its snapshot.
    db.exec("UPDATE a SET v = 'a1*' WHERE id = 1; UPDATE b SET v = 'b1*' WHERE id = 1; INSERT INTO b VALUES (4, 'b4');")
        .await;
    let all = options_for(&db, &["a", "b", "empty_t"], &slot, dir.path());
    run(&db.config, &all).await.unwrap();
    assert_eq!(bronze_ops(dir.path(), "shop.a_changes").await, "rrru");
    assert_eq!(bronze_ops(dir.path(), "shop.b_changes").await, "rrrr");
    assert_reconciled(&db, "a", dir.path(), "shop.a").await;
    assert_reconciled(&db, "b", dir.path(), "shop.b").await;

    db.exec("UPDATE b SET v = 'b2*' WHERE id = 2; DELETE FROM b WHERE id = 3;")
        .await;
    run(&db.config, &all).await.unwrap();
    assert_eq!(bronze_ops(dir.path(), "shop.b_changes").await, "rrrrud");
    assert_reconciled(&db, "b", dir.path(), "shop.b").await;

    // Silver lost while bronze holds changes after its load (a crash
    // between the load commits leaves bronze with its load alone, which
    // silver is then loaded from): only silver is loaded again, from a new
    // snapshot.
    let lake = wal2iceberg::lake::catalog::Lake::open_embedded(dir.path())
        .await
        .unwrap();
    let silver_b =
        iceberg::TableIdent::new(wal2iceberg::lake::catalog::namespace("shop"), "b".into());
    iceberg::Catalog::drop_table(lake.catalog(), &silver_b)
        .await
        .unwrap();
    db.exec("UPDATE b SET v = 'b4*' WHERE id = 4").await;
    run(&db.config, &all).await.unwrap();
    assert_eq!(
        bronze_ops(dir.path(), "shop.b_changes").await,
        "rrrrudu",
        "bronze is not loaded twice"
    );
    assert_reconciled(&db, "b", dir.path(), "shop.b").await;
    assert_reconciled(&db, "a", dir.path(), "shop.a").await;
    let slots = db.slot_count().await;
    assert_eq!(slots, 1, "the temporary load slots are gone");
}

#[tokio::test]
async fn changes_bronze_takes_alone_after_silver_was_lost_fill_unchanged_toast_values_from_history()
{
    let db = TestDb::new().await;
    db.exec(TOASTED_DOCS).await;
    let dir = tempfile::tempdir().unwrap();
    let opts = options_for(&db, &["docs"], &unique("gap"), dir.path());
    run(&db.config, &opts).await.unwrap();
    db.exec("UPDATE docs SET body = repeat('streamed ', 700) WHERE id = 3")
        .await;
    run(&db.config, &opts).await.unwrap();

    // Silver lost; then, before the next run, updates that leave the large
    // value alone (TOAST): of a row whose value changed just before, of a
    // row only the load holds, of one the stream changed earlier. Silver is
    // loaded again at a later point; bronze takes these alone.
    let lake = wal2iceberg::lake::catalog::Lake::open_embedded(dir.path())
        .await
        .unwrap();
    let silver =
        iceberg::TableIdent::new(wal2iceberg::lake::catalog::namespace("shop"), "docs".into());
    iceberg::Catalog::drop_table(lake.catalog(), &silver)
        .await
        .unwrap();
    drop(lake);
    db.exec(
        "UPDATE docs SET body = repeat('changed ', 800) WHERE id = 1;
         UPDATE docs SET n = 1 WHERE id = 1;
         UPDATE docs SET n = 2 WHERE id = 2;
         UPDATE docs SET n = 3 WHERE id = 3;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "docs", dir.path(), "shop.docs").await;
    let bronze = pyiceberg(dir.path(), "shop.docs_changes", "rows").await;
    let source: std::collections::HashMap<i64, String> = db
        .client
        .query("SELECT id::int8, body FROM docs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (id, n) in [(1, 1), (2, 2), (3, 3)] {
        let update = bronze
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == json!(id) && r["n"] == json!(n))
            .unwrap_or_else(|| panic!("bronze lacks the update of {id}: {bronze}"));
        assert_eq!(
            update["body"].as_str(),
            Some(source[&id].as_str()),
            "the value {id} had then"
        );
    }
}

#[tokio::test]
async fn a_lost_slot_is_never_replaced_under_a_loaded_lake() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1, 'free');")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("lost");
    let opts = options(&db, &slot, dir.path());
    run(&db.config, &opts).await.unwrap();
    // As teardown leaves the source: slot and publication gone.
    db.exec(&format!(
        "SELECT pg_drop_replication_slot('{slot}'); DROP PUBLICATION {};",
        opts.capture.publication
    ))
    .await;
    db.exec("UPDATE customers SET plan = 'pro'").await;
    let err = run(&db.config, &opts).await.unwrap_err().to_string();
    assert!(
        err.contains("does not exist") && err.contains("gap") && err.contains("public.customers"),
        "{err}"
    );
    let publications: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_publication WHERE pubname = $1",
            &[&opts.capture.publication],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        publications, 0,
        "refused before it made the publication again"
    );
    // check says so too, where it said all was well.
    let lake = dir.path().display().to_string();
    let url = db.config_url();
    let checked = cli(&[
        "check",
        "--source",
        &url,
        "--slot",
        &slot,
        "--publication",
        &opts.capture.publication,
        "--lake",
        &lake,
        "--namespace",
        "shop",
        "--tables",
        "public.customers",
    ])
    .await;
    let said = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.status.code() == Some(1) && said.contains("[slot_lost]"),
        "{said}"
    );
    assert_eq!(
        db.confirmed_flush(&slot).await,
        None,
        "no new slot was made"
    );
    assert_eq!(
        id_plan_rows(dir.path(), "shop.customers").await,
        [(1, "free".to_owned())]
    );
}

#[tokio::test]
async fn a_large_transaction_is_spread_over_files_and_committed_as_one_snapshot() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE big(id int PRIMARY KEY, n int NOT NULL, note text)")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options_for(&db, &["big"], &unique("big"), dir.path());
    opts.run.max_batch_rows = 1;
    // The snapshot read below is the transaction's, not a compaction's.
    opts.run.compact_after_files = 0;
    run(&db.config, &opts).await.unwrap();
    db.exec(
        "BEGIN;
         INSERT INTO big SELECT i, 0, 'row ' || i FROM generate_series(1, 120000) i;
         UPDATE big SET n = 1 WHERE id % 1000 = 0;
         DELETE FROM big WHERE id % 1000 = 1;
         COMMIT;",
    )
    .await;
    let report = run(&db.config, &opts).await.unwrap();
    assert_eq!(report.changes_applied, 120_240);
    assert_eq!(report.batches, 1, "one source transaction, one commit");

    let bronze = pyiceberg(dir.path(), "shop.big_changes", "summary").await;
    assert_eq!(bronze["added-records"], json!("120240"));
    let files: u64 = bronze["added-data-files"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(files >= 3, "bronze spread over {files} files");
    let silver = pyiceberg(dir.path(), "shop.big", "summary").await;
    println!("large transaction: bronze {files} data files; silver {silver}");
    assert_eq!(
        silver["total-records"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            - silver["total-position-deletes"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap(),
        119_880
    );
    assert_reconciled(&db, "big", dir.path(), "shop.big").await;
    let duck = duckdb(dir.path(), "shop.big").await;
    assert_eq!(
        duck.as_array().unwrap().len(),
        119_880,
        "DuckDB applies the same deletes"
    );
}

#[tokio::test]
async fn added_and_dropped_columns_and_a_retyped_key_are_followed() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text, old text); INSERT INTO customers VALUES (1, 'free', 'x');")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&db, &unique("ddl"), dir.path());
    run(&db.config, &opts).await.unwrap();

    // Mid-stream, inside one batch: rows before and after each change.
    db.exec(
        "INSERT INTO customers VALUES (2, 'pro', 'y');
         ALTER TABLE customers ADD COLUMN tags text[], ADD COLUMN score numeric(5,1);
         INSERT INTO customers VALUES (3, 'team', 'z', '{a,NULL}', 4.5);
         ALTER TABLE customers DROP COLUMN old;
         UPDATE customers SET score = 1.5 WHERE id = 1;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
    let schema = pyiceberg(dir.path(), "shop.customers_changes", "schema").await;
    assert_eq!(schema["types"]["tags"], json!("list<string>"));
    assert!(
        schema["types"]["_cdc_before"]
            .as_str()
            .unwrap()
            .contains("score"),
        "{schema}"
    );
    let bronze = pyiceberg(dir.path(), "shop.customers_changes", "rows").await;
    let by_op: Vec<(String, serde_json::Value, serde_json::Value)> = bronze
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["_cdc_op"].as_str().unwrap().to_owned(),
                r["old"].clone(),
                r["score"].clone(),
            )
        })
        .collect();
    assert_eq!(
        by_op,
        [
            ("r".to_owned(), json!("x"), json!(null)),
            ("c".to_owned(), json!("y"), json!(null)),
            ("c".to_owned(), json!("z"), json!("4.5")),
            ("u".to_owned(), json!(null), json!("1.5")),
        ],
        "the dropped column keeps its history and is null from then on"
    );
    let silver = pyiceberg(dir.path(), "shop.customers", "schema").await;
    assert!(
        silver["ids"].get("old").is_none(),
        "the dropped column left silver's schema: {silver}"
    );

    // A primary-key column's type Iceberg cannot promote to: silver is
    // loaded anew under the new type, the run goes on.
    db.exec("ALTER TABLE customers ALTER COLUMN id TYPE text; UPDATE customers SET plan = 'x' WHERE id = '2';")
        .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
    let silver = pyiceberg(dir.path(), "shop.customers", "schema").await;
    assert_eq!(silver["types"]["id"], json!("string"), "{silver}");
    assert_eq!(silver["identifier"], json!(["id"]), "{silver}");
}

#[tokio::test]
async fn a_hundred_batches_of_random_changes_on_100k_rows_read_back_correct() {
    use rand::{Rng, SeedableRng};

    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE big(id int PRIMARY KEY, n int NOT NULL, note text);
         INSERT INTO big SELECT i, 0, 'row ' || i FROM generate_series(1, 100000) i;",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options_for(&db, &["big"], &unique("random"), dir.path());
    run(&db.config, &opts).await.unwrap();

    // One source transaction per batch: a batch is flushed at the first
    // commit that reaches a batch limit, here the bytes.
    opts.run.max_batch_bytes = 1;
    opts.run.flush_interval = Duration::from_secs(60);
    opts.run.exit_when_idle = Some(Duration::from_secs(3));
    // Compaction of both tables every eighth file, expiry of all but the
    // newest three snapshots after each.
    opts.run.compact_after_files = 8;
    opts.run.retention = wal2iceberg::lake::maintenance::expire::Retention {
        older_than: Duration::ZERO,
        retain_last: 3,
    };
    let config = db.config.clone();
    let pipeline = tokio::spawn(async move { run(&config, &opts).await });
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut next_id = 100_001;
    for batch in 0..100 {
        let mut sql = String::from("BEGIN;");
        for _ in 0..500 {
            let id = rng.random_range(1..next_id);
            match rng.random_range(0..20) {
                0 => sql.push_str(&format!("DELETE FROM big WHERE id = {id};")),
                1 => {
                    sql.push_str(&format!(
                        "INSERT INTO big VALUES ({next_id}, {batch}, NULL);"
                    ));
                    next_id += 1;
                }
                _ => sql.push_str(&format!(
                    "UPDATE big SET n = n + 1, note = 'b{batch}' WHERE id = {id};"
                )),
            }
        }
        sql.push_str("COMMIT;");
        db.exec(&sql).await;
    }
    let report = pipeline.await.unwrap().unwrap();
    assert!(report.batches >= 100, "{report:?}");

    let digest = assert_reconciled(&db, "big", dir.path(), "shop.big").await;
    let summary = pyiceberg(dir.path(), "shop.big", "summary").await;
    let number =
        |s: &serde_json::Value, key: &str| -> u64 { s[key].as_str().unwrap().parse().unwrap() };
    assert!(number(&summary, "total-data-files") <= 8 + 6, "{summary}");
    assert!(number(&summary, "total-delete-files") <= 8 + 6, "{summary}");
    // At most eight commits' files beside the tiers of earlier merges (and
    // bronze's load files).
    let changes = pyiceberg(dir.path(), "shop.big_changes", "summary").await;
    assert!(number(&changes, "total-data-files") <= 8 + 6, "{changes}");
    let rows = number(&changes, "total-records");
    assert_eq!(
        rows,
        100_000 + report.changes_applied,
        "bronze keeps the load and every change through its merges"
    );
    for table in ["shop.big", "shop.big_changes"] {
        let snapshots = pyiceberg(dir.path(), table, "snapshots").await;
        // Three kept at the last expiry, and the commits since.
        let kept = snapshots.as_array().unwrap().len();
        assert!((3..=3 + 8).contains(&kept), "{table}: {snapshots}");
    }
    println!(
        "100k rows after {} batches: {} live rows, silver holds {} data files and {} delete files ({} bytes)",
        report.batches,
        digest.rows,
        summary["total-data-files"],
        summary["total-delete-files"],
        summary["total-files-size"],
    );
}

#[tokio::test]
async fn the_slot_keeps_advancing_while_the_published_tables_are_quiet() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); CREATE TABLE other(x int);")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("quiet");
    let mut opts = options(&db, &slot, dir.path());
    opts.run.exit_when_idle = None;
    opts.run.heartbeat_interval = Some(Duration::from_millis(500));
    opts.monitor_interval = Duration::from_millis(200);
    let shutdown = opts.shutdown.clone();
    let config = db.config.clone();
    let pipeline = tokio::spawn(async move { run(&config, &opts).await });

    // WAL from a table nobody publishes: never a change, never retained
    // (the lake records where the slot goes, at most every 10 s).
    while db.confirmed_flush(&slot).await.is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.exec("INSERT INTO other SELECT generate_series(1, 500)")
        .await;
    let target = db.wal_insert_lsn().await;
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let flushed = db.confirmed_flush(&slot).await.unwrap();
        if flushed >= target {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "confirmed_flush_lsn stuck at {flushed}, below {target}"
        );
        db.exec("INSERT INTO other VALUES (1)").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    shutdown.request();
    let report = pipeline.await.unwrap().unwrap();
    assert_eq!(report.changes_applied, 0, "no published change came");
}

#[tokio::test]
async fn a_terminated_walsender_is_reconnected_and_nothing_is_lost_or_repeated() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1, 'free');")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("reconnect");
    let mut opts = options(&db, &slot, dir.path());
    opts.run.exit_when_idle = None;
    let shutdown = opts.shutdown.clone();
    let config = db.config.clone();
    let pipeline = tokio::spawn(async move { run(&config, &opts).await });

    let wait_confirmed = |target: wal2iceberg::model::Lsn| {
        let db = &db;
        let slot = &slot;
        async move {
            let give_up = std::time::Instant::now() + Duration::from_secs(60);
            while db.confirmed_flush(slot).await.is_none_or(|f| f < target) {
                assert!(
                    std::time::Instant::now() < give_up,
                    "never confirmed {target}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // Streaming (the load done) before the first change.
    db.wait_until_streaming(&slot).await;
    for round in 2..5 {
        db.exec(&format!("INSERT INTO customers VALUES ({round}, 'pro')"))
            .await;
        let written = db.wal_insert_lsn().await;
        wait_confirmed(written).await;
        // The walsender may be between connections; wait for it.
        let give_up = std::time::Instant::now() + Duration::from_secs(30);
        let terminated = loop {
            let terminated: Option<bool> = db
                .client
                .query_one(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await
                .unwrap()
                .get(0);
            if let Some(t) = terminated {
                break t;
            }
            assert!(
                std::time::Instant::now() < give_up,
                "the slot never became active"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(terminated, "round {round}: the walsender was running");
        db.exec(&format!(
            "UPDATE customers SET plan = 'team{round}' WHERE id = 1"
        ))
        .await;
    }
    let written = db.wal_insert_lsn().await;
    wait_confirmed(written).await;
    shutdown.request();
    let report = pipeline.await.unwrap().unwrap();
    assert_eq!(
        report.changes_applied,
        1 + 3 + 3,
        "the load, three inserts, three updates"
    );
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
    assert_eq!(
        bronze_ops(dir.path(), "shop.customers_changes").await,
        "rcucucu",
        "each change once"
    );
}

#[tokio::test]
async fn after_an_added_column_show_and_verify_read_bronzes_older_files() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text);
         ALTER TABLE customers REPLICA IDENTITY FULL;
         INSERT INTO customers VALUES (1, 'free'), (2, 'pro');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("added");
    let opts = options(&db, &slot, dir.path());
    run(&db.config, &opts).await.unwrap();
    // The new column goes into bronze's _cdc_before too, which the files
    // written before lack.
    db.exec(
        "UPDATE customers SET plan = 'team' WHERE id = 1;
         ALTER TABLE customers ADD COLUMN seats int;
         UPDATE customers SET seats = 3 WHERE id = 2;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    let lake = dir.path().display().to_string();
    let shown = cli(&[
        "show",
        "customers_changes",
        "--lake",
        &lake,
        "--format",
        "json",
    ])
    .await;
    assert_success(&shown);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    let verified = verify_lake(&db, &slot, dir.path(), "public.customers").await;
    assert_success(&verified);
}

#[tokio::test]
async fn a_table_without_a_primary_key_under_full_identity_keeps_its_whole_history() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE events(kind text, body text, n int);
         ALTER TABLE events REPLICA IDENTITY FULL;
         ALTER TABLE events ALTER COLUMN body SET STORAGE EXTERNAL;
         INSERT INTO events VALUES ('a', 'x', 1), ('a', 'x', 1), ('b', repeat(md5('b'), 200), 2);
         CREATE TABLE customers(id int PRIMARY KEY, plan text);
         INSERT INTO customers VALUES (1, 'free');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("keyless");
    let opts = options_for(&db, &["events", "customers"], &slot, dir.path());
    run(&db.config, &opts).await.unwrap();
    // A duplicate more, an update that leaves the TOASTed body alone (the
    // complete before image holds it), one of two equal rows deleted, and
    // the keyed table beside it.
    db.exec(
        "INSERT INTO events VALUES ('a', 'x', 1);
         UPDATE events SET n = n + 10 WHERE kind = 'b';
         DELETE FROM events WHERE ctid = (SELECT min(ctid) FROM events WHERE kind = 'a');
         UPDATE customers SET plan = 'pro';",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    // And again after a restart.
    db.exec("INSERT INTO events VALUES ('c', NULL, 3); UPDATE events SET n = 0 WHERE kind = 'a';")
        .await;
    run(&db.config, &opts).await.unwrap();

    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
    let lake = wal2iceberg::lake::catalog::Lake::open_embedded(dir.path())
        .await
        .unwrap();
    let silver = iceberg::TableIdent::new(
        wal2iceberg::lake::catalog::namespace("shop"),
        "events".into(),
    );
    assert!(
        lake.table_if_exists(&silver).await.unwrap().is_none(),
        "no silver without a key"
    );

    // Bronze replayed as a multiset of rows is the source's.
    type Row = (Option<String>, Option<String>, Option<i64>);
    let row = |v: &serde_json::Value| -> Row {
        (
            v["kind"].as_str().map(str::to_owned),
            v["body"].as_str().map(str::to_owned),
            v["n"].as_i64(),
        )
    };
    let mut replayed: Vec<Row> = Vec::new();
    let bronze = pyiceberg(dir.path(), "shop.events_changes", "rows").await;
    for change in bronze.as_array().unwrap() {
        let mut remove = |r: Row| {
            let at = replayed
                .iter()
                .position(|x| *x == r)
                .expect("the before image is a live row");
            replayed.remove(at);
        };
        match change["_cdc_op"].as_str().unwrap() {
            "r" | "c" => replayed.push(row(change)),
            "u" => {
                remove(row(&change["_cdc_before"]));
                replayed.push(row(change));
            }
            "d" => remove(row(change)),
            op => panic!("unexpected op {op}"),
        }
    }
    let mut source: Vec<Row> = db
        .client
        .query("SELECT kind, body, n::int8 FROM events", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    source.sort();
    replayed.sort();
    assert_eq!(replayed, source);

    // verify says what it cannot compare.
    let verified = verify_lake(&db, &slot, dir.path(), "public.events,public.customers").await;
    assert_success(&verified);
    let said = String::from_utf8_lossy(&verified.stdout);
    assert!(
        said.contains("public.events")
            && said.contains("not compared")
            && said.contains("matches the source in every table compared"),
        "{said}"
    );
    // show points to its history.
    let shown = tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args([
            "show",
            "events",
            "--lake",
            &dir.path().display().to_string(),
        ])
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&shown.stderr);
    assert!(
        said.contains("its history is shop.events_changes"),
        "{said}"
    );
    // Nor can a new snapshot redo its history.
    let resync = tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(["resync", "--table", "public.events", "--namespace", "shop"])
        .args(["--lake", &dir.path().display().to_string()])
        .args(["--source", &db.config_url()])
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&resync.stderr);
    assert_eq!(resync.status.code(), Some(2), "{said}");
    assert!(said.contains("no primary key"), "{said}");
}

#[tokio::test]
async fn a_run_that_leaves_out_a_table_the_lake_holds_applies_it_anyway_and_loses_nothing() {
    let mut oracle = crate::support::oracle::Oracle::new(300).await;
    oracle.add_other_table().await;
    oracle.drain().await;

    // Runs naming only `other` while the workload changes `accounts`: one
    // killed mid-stream, one drained after the workload paused.
    oracle.start_workload();
    oracle.set("--tables", "public.other");
    let mut killed = oracle.spawn();
    oracle.db.exec("UPDATE other SET v = 2").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    killed.kill().await.unwrap();
    oracle.stop_workload().await;
    let out = oracle.run_until_idle("2s").await;
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("public.accounts") && stderr.contains("applied too"),
        "{stderr}"
    );

    // accounts' silver equals its source and bronze holds every audited
    // change once, though no run named it since the load.
    oracle.start_workload();
    let (changes, _) = oracle.finish().await;
    assert!(changes > 50, "{changes} changes");
    assert_reconciled(&oracle.db, "other", oracle.lake.path(), "shop.other").await;
}

#[tokio::test]
async fn a_column_added_with_a_default_reaches_the_rows_before_it_in_silver_by_a_resync() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text);
         INSERT INTO customers SELECT i, 'free' FROM generate_series(1, 3) i;",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("default");
    let opts = options_for(&db, &["customers"], &slot, dir.path());
    run(&db.config, &opts).await.unwrap();

    // While stopped: a constant default (the rows before read it without a
    // rewrite), one row changed, and a volatile default (a rewrite).
    db.exec(
        "ALTER TABLE customers ADD COLUMN flag int NOT NULL DEFAULT 5;
         UPDATE customers SET flag = 7 WHERE id = 1;
         ALTER TABLE customers ADD COLUMN seen timestamptz DEFAULT clock_timestamp();",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
    // Bronze keeps what the stream said: the update, then the reload.
    assert_eq!(
        bronze_ops(dir.path(), "shop.customers_changes").await,
        "rrrurrr"
    );

    // While a run streams.
    let mut streaming = options_for(&db, &["customers"], &slot, dir.path());
    streaming.run.exit_when_idle = None;
    let shutdown = streaming.shutdown.clone();
    let config = db.config.clone();
    let pipeline = tokio::spawn(async move { run(&config, &streaming).await });
    db.wait_until_active(&slot).await;
    db.exec("ALTER TABLE customers ADD COLUMN note text DEFAULT 'none'; INSERT INTO customers VALUES (4, 'pro', 1);")
        .await;
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    let target = db.wal_insert_lsn().await;
    loop {
        let bronze = pyiceberg(dir.path(), "shop.customers_changes", "summary").await;
        let done = db
            .confirmed_flush(&slot)
            .await
            .is_some_and(|at| at >= target)
            && bronze_ops(dir.path(), "shop.customers_changes")
                .await
                .ends_with("rrrr");
        if done {
            break;
        }
        assert!(std::time::Instant::now() < give_up, "no resync: {bronze}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    shutdown.request();
    pipeline.await.unwrap().unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
}

/// A stream lost while a batch is open: the batch is taken out of
/// silver's key index and the index persisted, so the reconnect restores
/// it instead of reading every key again; nothing is lost or repeated.
#[tokio::test]
async fn a_stream_lost_mid_batch_hands_silvers_key_index_to_the_reconnect() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE accounts(id int PRIMARY KEY, plan text NOT NULL);
         INSERT INTO accounts SELECT g, 'free' FROM generate_series(1, 6000) g;",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().display().to_string();
    let slot = unique("handed");
    let url = db.config_url();
    let running = tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args([
            "run",
            "--source",
            &url,
            "--slot",
            &slot,
            "--lake",
            &lake,
            "--namespace",
            "shop",
            "--tables",
            "public.accounts",
            "--exit-when-idle",
            "3s",
        ])
        .env("RUST_LOG", "wal2iceberg=info")
        .env("WAL2ICEBERG_STALL", "stage:1")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    db.wait_until_streaming(&slot).await;
    // A batch of its own before: the commit the index goes back to.
    db.exec("UPDATE accounts SET plan = 'pro' WHERE id <= 10")
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // One transaction of 6,000 changes, staged at 1 ms each, while the
    // stream buffers at most 4,096 messages: the walsender, terminated
    // once part of it is staged, ends the stream mid-batch.
    db.exec("UPDATE accounts SET plan = 'team' WHERE id > 5; DELETE FROM accounts WHERE id = 3")
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let terminated: Option<bool> = db
        .client
        .query_one(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(terminated, Some(true), "the walsender was running");
    let out = running.wait_with_output().await.unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let after = &said[said.find("reconnecting").expect("the stream was lost")..];
    assert!(
        said.contains("the open batch was taken out of silver's key index")
            && after.contains("silver key index restored")
            && !after.contains("key index rebuilt"),
        "{said}"
    );
    assert_reconciled(&db, "accounts", dir.path(), "shop.accounts").await;
    let ops = bronze_ops(dir.path(), "shop.accounts_changes").await;
    assert_eq!(
        ops.matches('u').count(),
        10 + 5995,
        "each update once: {ops}"
    );
    assert_eq!(ops.matches('d').count(), 1);
}

#[tokio::test]
async fn a_bronze_made_before_it_recorded_its_source_is_held_under_its_chosen_name() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1, 'free');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("legacy");
    let mut opts = options_for(&db, &["customers"], &slot, dir.path());
    let table = wal2iceberg::model::TableName::parse("public.customers").unwrap();
    opts.table_names.insert(table, "clients".into());
    run(&db.config, &opts).await.unwrap();
    // As a lake of a version before bronze recorded its source and slot.
    tamper(dir.path(), "shop.clients_changes", &["forget", "0"]).await;
    db.exec("UPDATE customers SET plan = 'pro'").await;
    // Its tables are the lake's claim on the slot: the run goes on there.
    let report = run(&db.config, &opts).await.unwrap();
    assert_eq!(report.changes_applied, 1);
    assert_reconciled(&db, "customers", dir.path(), "shop.clients").await;
}
