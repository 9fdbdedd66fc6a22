//! Schema changes followed while the stream runs and while wal2iceberg is
//! stopped (docs/tables.md, Schema changes), read back through pyiceberg
//! and DuckDB.

use std::time::Duration;

use serde_json::{Value, json};
use wal2iceberg::apply::{RunOptions, run};
use wal2iceberg::shutdown::Shutdown;

use crate::support::*;

pub(crate) const SILVER: &str = "shop.orders";
pub(crate) const BRONZE: &str = "shop.orders_changes";

/// `orders`, the table the rename tests change, with two rows.
pub(crate) const TWO_ORDERS: &str =
    "CREATE TABLE orders(id int PRIMARY KEY, customer text, qty int);
     INSERT INTO orders VALUES (1, 'ann', 1), (2, 'bob', 2);";

pub(crate) async fn schema(lake: &std::path::Path, table: &str) -> Value {
    pyiceberg(lake, table, "schema").await
}

/// The values of `column` in the rows of a bronze table, in commit order.
async fn history(lake: &std::path::Path, column: &str) -> Vec<Value> {
    pyiceberg(lake, BRONZE, "rows")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[column].clone())
        .collect()
}

/// A new lake, `orders` loaded into it by a first run on a slot named
/// after `prefix`; that run's options.
pub(crate) async fn loaded(db: &TestDb, prefix: &str) -> (tempfile::TempDir, RunOptions) {
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(db, &["orders"], &unique(prefix), dir.path());
    run(&db.config, &opts).await.unwrap();
    (dir, opts)
}

/// `verify` of `orders` passes: it reads the older files under the new
/// names too.
pub(crate) async fn assert_verified(db: &TestDb, slot: &str, lake: &std::path::Path) {
    let verified = verify_lake(db, slot, lake, "public.orders").await;
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stdout)
    );
}

/// The reads (`r` rows: loads and reloads) of `id` among bronze's `rows`,
/// oldest first (DuckDB gives rows in no particular order).
pub(crate) fn reads_of(rows: &Value, id: i64) -> Vec<Value> {
    let mut reads: Vec<Value> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] == "r" && r["id"] == json!(id))
        .cloned()
        .collect();
    reads.sort_by_key(|r| r["_cdc_commit_lsn"].as_i64());
    reads
}

/// A run in the background.
pub(crate) type Running =
    tokio::task::JoinHandle<wal2iceberg::error::Result<wal2iceberg::apply::RunReport>>;

/// The arguments of a `wal2iceberg run` of `orders` with `opts`' slot and
/// publication, into the lake at `lake`, ending when idle.
pub(crate) fn binary_run(db: &TestDb, opts: &RunOptions, lake: &std::path::Path) -> Vec<String> {
    [
        "run",
        "--source",
        &db.config_url(),
        "--slot",
        &opts.capture.slot,
        "--lake",
        &lake.display().to_string(),
        "--namespace",
        "shop",
        "--publication",
        &opts.capture.publication,
        "--tables",
        "public.orders",
        "--exit-when-idle",
        "2s",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Runs the binary with `args` until it dies at the failpoint `point`.
pub(crate) async fn crash_at(args: &[String], point: &str) {
    let crashed = tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(args)
        .env(wal2iceberg::failpoint::VARIABLE, format!("{point}:1"))
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&crashed.stderr);
    assert!(
        !crashed.status.success() && said.contains(&format!("failpoint {point} reached")),
        "{said}"
    );
}

/// A run of `tables` on `slot` into `lake`, in the background, that ends
/// once idle for `idle_secs`; returned once it streams. A run that starts
/// its stream over for a resync is idle while the walsender reads through
/// the WAL other tests' databases wrote meanwhile, before it confirms
/// past it (`applied`): give it tens of seconds.
pub(crate) async fn streaming(
    db: &TestDb,
    tables: &[&str],
    slot: &str,
    lake: &std::path::Path,
    idle_secs: u64,
) -> Running {
    let mut options = run_options(db, tables, slot, lake);
    options.run.exit_when_idle = Some(Duration::from_secs(idle_secs));
    spawn_run(db, options).await
}

/// [`streaming`] until the returned request stops it, however long it is
/// idle: for a test whose checks between its writes may outlast any idle
/// time under load.
pub(crate) async fn streaming_until_stopped(
    db: &TestDb,
    tables: &[&str],
    slot: &str,
    lake: &std::path::Path,
) -> (Running, Shutdown) {
    let mut options = run_options(db, tables, slot, lake);
    options.run.exit_when_idle = None;
    let stop = options.shutdown.clone();
    (spawn_run(db, options).await, stop)
}

async fn spawn_run(db: &TestDb, options: RunOptions) -> Running {
    // The run's log, shown with a failing test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("wal2iceberg=info")
        .with_test_writer()
        .try_init();
    let slot = options.capture.slot.clone();
    let config = db.config.clone();
    let running = tokio::spawn(async move { run(&config, &options).await });
    db.wait_until_streaming(&slot).await;
    running
}

/// Waits until the run confirmed everything written so far (up to three
/// minutes: after a resync's restart, under the other tests' load, it has
/// taken over one); a run that ended before fails the test with its result.
pub(crate) async fn applied(db: &TestDb, slot: &str, running: &mut Running) {
    let target = db.wal_insert_lsn().await;
    for _ in 0..1800 {
        if db.confirmed_flush(slot).await >= Some(target) {
            return;
        }
        if running.is_finished() {
            let ended = running.await.unwrap();
            panic!("the run ended before it confirmed {target}: {ended:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the run did not confirm {target}");
}

#[tokio::test]
async fn renames_keep_field_ids_and_history_and_promotions_widen_in_place() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, customer text, qty int, price numeric(10,2), note text);
         INSERT INTO orders VALUES (1, 'ann', 1, 9.99, 'a');",
    )
    .await;
    let (dir, opts) = loaded(&db, "ddl").await;
    let before = [
        schema(dir.path(), SILVER).await,
        schema(dir.path(), BRONZE).await,
    ];

    // While the run streams, each change inside a batch with changes
    // before and after it; the rename inside one transaction too.
    let slot = opts.capture.slot.clone();
    // Idle long enough to outlast the resync the int to bigint rewrite asks
    // for, and the walsender catching up through other tests' WAL after it.
    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 30).await;
    for step in [
        "INSERT INTO orders VALUES (2, 'bob', 2, 19.99, 'b');
         BEGIN;
         UPDATE orders SET qty = 3 WHERE id = 1;
         ALTER TABLE orders RENAME COLUMN customer TO customer_name;
         UPDATE orders SET customer_name = 'anna' WHERE id = 1;
         COMMIT;",
        "ALTER TABLE orders ALTER COLUMN qty TYPE bigint, ALTER COLUMN price TYPE numeric(12,2);
         INSERT INTO orders VALUES (3, 'cy', 5000000000, 1234567890.12, 'c');",
        "ALTER TABLE orders DROP COLUMN note;
         UPDATE orders SET qty = qty + 1 WHERE id = 2;",
    ] {
        db.exec(step).await;
        applied(&db, &slot, &mut running).await;
    }
    running.await.unwrap().unwrap();
    let opts = run_options(&db, &["orders"], &slot, dir.path());
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;

    let after = [
        schema(dir.path(), SILVER).await,
        schema(dir.path(), BRONZE).await,
    ];
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(new["ids"]["customer_name"], old["ids"]["customer"], "{new}");
        assert!(new["ids"].get("customer").is_none(), "{new}");
        assert_eq!(new["ids"]["qty"], old["ids"]["qty"]);
        assert_eq!(new["types"]["qty"], json!("long"));
        assert_eq!(new["types"]["price"], json!("decimal(12, 2)"));
    }
    let (old_bronze, new_bronze) = (&before[1], &after[1]);
    assert_eq!(
        new_bronze["before_ids"]["customer_name"],
        old_bronze["before_ids"]["customer"]
    );
    assert!(after[0]["ids"].get("note").is_none(), "dropped from silver");
    assert!(new_bronze["ids"].get("note").is_some(), "kept in bronze");

    // Every engine reads the whole history under the new name. PostgreSQL
    // rewrites the table for int to bigint, which may change every value
    // (`USING`) with no change sent: silver is reloaded, and bronze holds
    // the reload's reads of the three rows after the retype, before or
    // after the last step's update.
    let changes = ["ann", "bob", "ann", "anna", "cy", "bob"].map(|n| json!(n));
    let reloaded = ["anna", "bob", "cy"].map(|n| json!(n));
    let split = |rows: &[Value], column: &str| {
        let (mut reads, changes): (Vec<_>, Vec<_>) = rows
            .iter()
            .enumerate()
            .partition(|(at, r)| *at > 0 && r["_cdc_op"] == "r");
        reads.sort_by_key(|(_, r)| r[column].to_string());
        let values = |rows: Vec<(usize, &Value)>| -> Vec<Value> {
            rows.into_iter().map(|(_, r)| r[column].clone()).collect()
        };
        (values(changes), values(reads))
    };
    let rows = pyiceberg(dir.path(), BRONZE, "rows").await;
    let rows = rows.as_array().unwrap();
    assert_eq!(
        split(rows, "customer_name"),
        (changes.to_vec(), reloaded.to_vec())
    );
    assert_eq!(
        split(rows, "qty").0,
        [1, 2, 3, 3, 5_000_000_000i64, 3].map(|n| json!(n))
    );
    let duck = duckdb(dir.path(), BRONZE).await;
    let mut duck_rows = duck.as_array().unwrap().clone();
    duck_rows.sort_by_key(|r| (r["_cdc_commit_lsn"].as_i64(), r["_cdc_seq"].as_i64()));
    assert_eq!(
        split(&duck_rows, "customer_name"),
        (changes.to_vec(), reloaded.to_vec())
    );
    let duck_silver = duckdb(dir.path(), SILVER).await;
    let mut pairs: Vec<(i64, String, i64)> = duck_silver
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["customer_name"].as_str().unwrap().to_owned(),
                r["qty"].as_i64().unwrap(),
            )
        })
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        [
            (1, "anna".to_owned(), 3),
            (2, "bob".to_owned(), 3),
            (3, "cy".to_owned(), 5_000_000_000)
        ]
    );
    assert_verified(&db, &opts.capture.slot, dir.path()).await;
}

#[tokio::test]
async fn a_rename_made_while_stopped_is_recognised_at_start_by_its_column_number() {
    let db = TestDb::new().await;
    db.exec(TWO_ORDERS).await;
    let (dir, opts) = loaded(&db, "stopped").await;
    let before = schema(dir.path(), SILVER).await;

    // Two renames, the key's among them, and a new column under a name
    // the renames freed.
    db.exec(
        "ALTER TABLE orders RENAME COLUMN customer TO buyer;
         ALTER TABLE orders RENAME COLUMN id TO order_id;
         ALTER TABLE orders ADD COLUMN customer int;
         UPDATE orders SET customer = 7 WHERE order_id = 2;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    let after = schema(dir.path(), SILVER).await;
    assert_eq!(after["ids"]["buyer"], before["ids"]["customer"], "{after}");
    assert_eq!(after["ids"]["order_id"], before["ids"]["id"]);
    assert_eq!(after["identifier"], json!(["order_id"]));
    assert!(after["ids"]["customer"].as_i64() > before["ids"]["qty"].as_i64());
    assert_eq!(
        history(dir.path(), "buyer").await,
        [json!("ann"), json!("bob"), json!("bob")]
    );
}

#[tokio::test]
async fn a_type_iceberg_cannot_promote_to_retires_the_column_in_bronze_and_reloads_silver() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, qty int, price numeric(12,2), note text);
         INSERT INTO orders SELECT i, i, i * 1.5, 'n' FROM generate_series(1, 50) i;",
    )
    .await;
    let (dir, opts) = loaded(&db, "retype").await;
    let before = schema(dir.path(), BRONZE).await;

    let slot = opts.capture.slot.clone();
    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 30).await;
    // The ALTER rewrites every row, which the stream does not show: only
    // a reload of silver brings the new values.
    db.exec(
        "UPDATE orders SET qty = qty + 100 WHERE id <= 3;
         ALTER TABLE orders ALTER COLUMN qty TYPE text USING qty::text || ' pcs',
                            ALTER COLUMN price TYPE numeric(12,3);
         UPDATE orders SET qty = 'many' WHERE id = 2;
         INSERT INTO orders VALUES (51, 'one', 1.125, 'new');",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    // A column of a domain: its base type's field.
    db.exec(
        "UPDATE orders SET note = 'after' WHERE id IN (2, 4);
         CREATE DOMAIN positive AS int CHECK (VALUE > 0);
         ALTER TABLE orders ADD COLUMN rank positive;
         UPDATE orders SET rank = 7 WHERE id = 4;",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    running
        .await
        .unwrap()
        .expect("the run keeps running through the change");
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;

    let after = schema(dir.path(), BRONZE).await;
    let old_qty = before["ids"]["qty"].as_i64().unwrap();
    let retired = format!("qty__{old_qty}");
    assert_eq!(after["ids"][&retired], json!(old_qty), "{after}");
    assert_eq!(after["types"][&retired], json!("int"));
    assert_eq!(after["types"]["qty"], json!("string"));
    assert_eq!(after["types"]["price"], json!("decimal(12, 3)"));
    assert!(after["ids"]["qty"].as_i64() > before["ids"]["note"].as_i64());
    let silver = schema(dir.path(), SILVER).await;
    assert_eq!(silver["types"]["qty"], json!("string"));
    assert!(silver["ids"].get(&retired).is_none(), "{silver}");

    // Bronze: the history before the change under the retired name, what
    // came after under the column's, and the reload's reads of every row.
    let rows = pyiceberg(dir.path(), BRONZE, "rows").await;
    let rows = rows.as_array().unwrap();
    let of = |op: &str, id: i64| -> Vec<&Value> {
        rows.iter()
            .filter(|r| r["_cdc_op"] == op && r["id"] == json!(id))
            .collect()
    };
    let update_of_1 = of("u", 1);
    assert_eq!(update_of_1[0][&retired], json!(101));
    assert_eq!(update_of_1[0]["qty"], json!(null));
    assert_eq!(of("c", 51)[0]["qty"], json!("one"));
    let reads_of_5 = of("r", 5);
    assert_eq!(reads_of_5.len(), 2, "the load and the reload");
    assert_eq!(reads_of_5[1]["qty"], json!("5 pcs"));
    assert_eq!(after["types"]["rank"], json!("int"));
    assert_eq!(of("u", 4).last().unwrap()["rank"], json!(7));
    // DuckDB reads the retired field and the new one alike.
    let duck = duckdb(dir.path(), BRONZE).await;
    let duck_update_of_1 = duck
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["_cdc_op"] == "u" && r["id"] == json!(1))
        .expect("the update of 1");
    assert_eq!(duck_update_of_1[&retired], json!(101));
    assert_eq!(duck_update_of_1["qty"], json!(null));
    assert_verified(&db, &slot, dir.path()).await;
}

/// A resync's snapshot ahead of bronze's stream by a retype: asked for
/// while the run is stopped, it is loaded at the next start from a
/// snapshot that already has `qty` as text, while bronze's stream still
/// holds it as int. Bronze's copy of the resync's rows keeps `qty`'s
/// values, under its name once the stream reaches the retype.
#[tokio::test]
async fn a_resync_ahead_of_a_retype_keeps_the_retyped_columns_values_in_bronze() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, qty int, note text);
         INSERT INTO orders SELECT i, i, 'n' FROM generate_series(1, 20) i;",
    )
    .await;
    let (dir, opts) = loaded(&db, "ahead").await;
    let before = schema(dir.path(), BRONZE).await;
    db.exec(
        "UPDATE orders SET qty = qty + 100 WHERE id = 1;
         ALTER TABLE orders ALTER COLUMN qty TYPE text USING qty::text || ' pcs';
         UPDATE orders SET qty = 'many' WHERE id = 2;
         ALTER TABLE orders ADD COLUMN flag int DEFAULT 5;",
    )
    .await;
    request_resync(&db, dir.path(), "public.orders").await;
    let ran = cli(&binary_run(&db, &opts, dir.path())).await;
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;

    let after = schema(dir.path(), BRONZE).await;
    let old_qty = before["ids"]["qty"].as_i64().unwrap();
    let retired = format!("qty__{old_qty}");
    assert_eq!(after["types"][&retired], json!("int"), "{after}");
    assert_eq!(after["types"]["qty"], json!("string"));
    let waiting: Vec<&String> = after["ids"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|name| name.starts_with("qty__") && **name != retired)
        .collect();
    assert!(waiting.is_empty(), "no field waits any more: {after}");

    // The resync's reads hold qty as the snapshot saw it, under its name,
    // through pyiceberg and DuckDB.
    for rows in [
        pyiceberg(dir.path(), BRONZE, "rows").await,
        duckdb(dir.path(), BRONZE).await,
    ] {
        for (id, qty) in [(1, "101 pcs"), (2, "many"), (7, "7 pcs")] {
            let reads = reads_of(&rows, id);
            assert_eq!(reads.len(), 2, "the load and the reload of {id}");
            assert_eq!(reads[0][&retired], json!(id), "the load of {id}");
            assert_eq!(reads[1]["qty"], json!(qty), "the reload of {id}: {rows}");
            assert_eq!(reads[1]["flag"], json!(5));
        }
    }
    assert_verified(&db, &opts.capture.slot, dir.path()).await;
}

/// Columns narrowed at the source keep their wider fields; a resync's
/// reload then widens its values into them (it stopped the run before).
#[tokio::test]
async fn a_resync_after_a_narrowing_widens_the_reloads_values_into_the_wider_fields() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, qty bigint, ratio float8, price numeric(12,4));
         INSERT INTO orders SELECT i, i, i / 4.0, i * 1.25 FROM generate_series(1, 20) i;",
    )
    .await;
    let (dir, opts) = loaded(&db, "narrow").await;
    db.exec(
        "ALTER TABLE orders ALTER qty TYPE int, ALTER ratio TYPE float4,
                            ALTER price TYPE numeric(10,4);
         UPDATE orders SET qty = 70 WHERE id = 7;",
    )
    .await;
    for step in ["stream", "resync"] {
        if step == "resync" {
            request_resync(&db, dir.path(), "public.orders").await;
        }
        let ran = cli(&binary_run(&db, &opts, dir.path())).await;
        assert!(
            ran.status.success(),
            "{step}: {}",
            String::from_utf8_lossy(&ran.stderr)
        );
        assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    }
    let bronze = schema(dir.path(), BRONZE).await;
    assert_eq!(bronze["types"]["qty"], json!("long"), "{bronze}");
    assert_eq!(bronze["types"]["ratio"], json!("double"));
    assert_eq!(bronze["types"]["price"], json!("decimal(12, 4)"));
    // The load, the reload after the narrowing's rewrite, the resync's.
    let reloaded = reads_of(&pyiceberg(dir.path(), BRONZE, "rows").await, 7);
    assert_eq!(reloaded.len(), 3, "{reloaded:?}");
    for read in &reloaded[1..] {
        assert_eq!(read["qty"], json!(70));
        assert_eq!(read["ratio"], json!(1.75));
    }
    assert_verified(&db, &opts.capture.slot, dir.path()).await;
}

/// A resync asked for while stopped, after the key was widened to a column
/// added since: silver is reloaded keyed by the new key, and the changes
/// bronze then takes alone, from before, are told apart by the key they
/// were written under (an unchanged TOAST value among them filled from
/// bronze's history by it); they stopped the run before.
#[tokio::test]
async fn changes_from_before_a_widened_key_reach_bronze_after_a_resync_keyed_by_it() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, qty int, big text NOT NULL);
         ALTER TABLE orders ALTER COLUMN big SET STORAGE EXTERNAL;
         INSERT INTO orders SELECT i, i, repeat(md5(i::text), 300) FROM generate_series(1, 5) i;",
    )
    .await;
    let (dir, opts) = loaded(&db, "widened").await;
    db.exec(
        "UPDATE orders SET qty = 10 WHERE id = 1;
         DELETE FROM orders WHERE id = 2;
         UPDATE orders SET qty = 30 WHERE id = 3;
         ALTER TABLE orders ADD COLUMN k int NOT NULL DEFAULT 0;
         ALTER TABLE orders DROP CONSTRAINT orders_pkey, ADD PRIMARY KEY (id, k);
         UPDATE orders SET qty = 11, big = big || 'x' WHERE id = 1;
         INSERT INTO orders VALUES (2, 20, 'again', 1);",
    )
    .await;
    request_resync(&db, dir.path(), "public.orders").await;
    let ran = cli(&binary_run(&db, &opts, dir.path())).await;
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    let qty: Vec<Value> = pyiceberg(dir.path(), BRONZE, "rows")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] != "r")
        .map(|r| json!([r["_cdc_op"], r["id"], r["qty"]]))
        .collect();
    assert_eq!(
        qty,
        [
            json!(["u", 1, 10]),
            json!(["d", 2, null]),
            json!(["u", 3, 30]),
            json!(["u", 1, 11]),
            json!(["c", 2, 20]),
        ]
    );
    assert_verified(&db, &opts.capture.slot, dir.path()).await;
}

/// An update that leaves a TOAST value unchanged, right after a change
/// that makes silver wait for a reload (a retype Iceberg cannot promote, a
/// changed key), in the same transaction or the next: the run streams it
/// again after the resync and fills it from bronze's history (it stopped
/// the run before).
#[tokio::test]
async fn an_unchanged_toast_value_after_a_change_that_reloads_silver_keeps_the_run_going() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, c int, big text NOT NULL);
         ALTER TABLE orders ALTER COLUMN big SET STORAGE EXTERNAL;
         INSERT INTO orders SELECT i, i, repeat(md5(i::text), 300) FROM generate_series(1, 5) i;",
    )
    .await;
    let (dir, opts) = loaded(&db, "toast").await;
    let slot = opts.capture.slot.clone();
    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 30).await;
    db.exec(
        "BEGIN;
         ALTER TABLE orders ALTER c TYPE text;
         UPDATE orders SET c = 'retyped' WHERE id = 2;
         COMMIT;
         UPDATE orders SET c = 'next' WHERE id = 3;",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    db.exec(
        "ALTER TABLE orders DROP CONSTRAINT orders_pkey, ADD PRIMARY KEY (id, c);
         UPDATE orders SET c = 'rekeyed' WHERE id = 4;",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    running
        .await
        .unwrap()
        .expect("the run keeps running through the change");
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    let source: std::collections::HashMap<i32, String> = db
        .client
        .query("SELECT id, big FROM orders", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let updates: Vec<Value> = pyiceberg(dir.path(), BRONZE, "rows")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] == "u")
        .cloned()
        .collect();
    assert_eq!(updates.len(), 3, "{updates:?}");
    for row in updates {
        let id = row["id"].as_i64().unwrap() as i32;
        assert_eq!(
            row["big"].as_str(),
            Some(source[&id].as_str()),
            "the value of {id}"
        );
    }
    assert_verified(&db, &slot, dir.path()).await;
}

#[tokio::test]
async fn renames_followed_by_more_ddl_are_told_exactly_from_the_numbers_the_stream_carries() {
    let db = TestDb::new().await;
    db.exec(TWO_ORDERS).await;
    let (dir, opts) = loaded(&db, "exact").await;
    let before = schema(dir.path(), BRONZE).await;
    let installed = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_event_trigger WHERE evtname = 'wal2iceberg_columns'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(installed, 1, "a superuser's run installs the event trigger");

    // While stopped: by the time the stream meets the first rename, the
    // catalog is at the last DDL, whose columns differ from the message's.
    db.exec(
        "UPDATE orders SET qty = 10 WHERE id = 1;
         ALTER TABLE orders RENAME COLUMN customer TO buyer;
         UPDATE orders SET buyer = 'anna' WHERE id = 1;
         ALTER TABLE orders RENAME COLUMN qty TO amount;
         ALTER TABLE orders ADD COLUMN customer text;
         UPDATE orders SET customer = 'c', amount = 20 WHERE id = 2;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    let after = schema(dir.path(), BRONZE).await;
    assert_eq!(after["ids"]["buyer"], before["ids"]["customer"], "{after}");
    assert_eq!(after["ids"]["amount"], before["ids"]["qty"]);
    assert!(after["ids"]["customer"].as_i64() > before["ids"]["_cdc_verbatim"].as_i64());
    assert_eq!(
        after["before_ids"]["buyer"],
        before["before_ids"]["customer"]
    );
    assert_eq!(
        history(dir.path(), "buyer").await,
        ["ann", "bob", "ann", "anna", "bob"].map(|s| json!(s))
    );
    assert_eq!(
        history(dir.path(), "amount").await,
        [1, 2, 10, 10, 20].map(|n| json!(n))
    );
}

/// A crash after a batch staged a schema change and before it committed:
/// the next run meets the changes before the rename again, with the
/// columns as they were, against tables the rename never reached, and
/// takes them as the first run would have. (Committed on its own, the
/// rename would have sent them to the new column of the old name.)
#[tokio::test]
async fn a_crash_between_a_schema_change_and_its_rows_splits_and_loses_nothing() {
    let db = TestDb::new().await;
    db.exec(TWO_ORDERS).await;
    let (dir, opts) = loaded(&db, "evolvecrash").await;
    let before = [
        schema(dir.path(), SILVER).await,
        schema(dir.path(), BRONZE).await,
    ];
    db.exec(
        "UPDATE orders SET qty = 10 WHERE id = 1;
         ALTER TABLE orders RENAME COLUMN customer TO buyer;
         ALTER TABLE orders ADD COLUMN customer text;
         UPDATE orders SET buyer = 'anna', customer = 'c' WHERE id = 1;",
    )
    .await;
    let args = binary_run(&db, &opts, dir.path());
    crash_at(&args, "schema-staged").await;
    assert_eq!(
        schema(dir.path(), BRONZE).await,
        before[1],
        "nothing landed"
    );
    assert_success(&cli(&args).await);

    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    for (table, before) in [SILVER, BRONZE].into_iter().zip(&before) {
        let after = schema(dir.path(), table).await;
        assert_eq!(after["ids"]["buyer"], before["ids"]["customer"], "{after}");
    }
    assert_eq!(
        history(dir.path(), "buyer").await,
        ["ann", "bob", "ann", "anna"].map(|s| json!(s))
    );
    assert_eq!(
        history(dir.path(), "customer").await,
        [json!(null), json!(null), json!(null), json!("c")]
    );
    assert_verified(&db, &opts.capture.slot, dir.path()).await;
}

#[tokio::test]
async fn a_renamed_table_keeps_flowing_to_its_iceberg_tables_across_restarts() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE orders(id int PRIMARY KEY, qty int); INSERT INTO orders VALUES (1, 1);")
        .await;
    let (dir, opts) = loaded(&db, "tablerename").await;

    let slot = opts.capture.slot.clone();
    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 4).await;
    // Renamed before the stream describes it: it is known by its OID.
    db.exec(
        "ALTER TABLE orders RENAME TO orders_v2;
         INSERT INTO orders_v2 VALUES (2, 2);
         UPDATE orders_v2 SET qty = 10 WHERE id = 1;",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    running.await.unwrap().unwrap();
    let rows = pyiceberg(dir.path(), SILVER, "rows").await;
    let mut pairs: Vec<(i64, i64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_i64().unwrap(), r["qty"].as_i64().unwrap()))
        .collect();
    pairs.sort();
    assert_eq!(pairs, [(1, 10), (2, 2)]);
    assert_eq!(
        history(dir.path(), "qty").await,
        [json!(1), json!(2), json!(10)]
    );

    // A new start, named the table's old name as before, finds it by its
    // OID and goes on under the new one, into the same Iceberg tables.
    db.exec("UPDATE orders_v2 SET qty = 20 WHERE id = 2;").await;
    run(&db.config, &opts).await.unwrap();
    assert_eq!(
        history(dir.path(), "qty").await,
        [json!(1), json!(2), json!(10), json!(20)]
    );
    let verified = verify_lake(&db, &slot, dir.path(), "public.orders_v2").await;
    assert_success(&verified);
    // show by the source's new name, which that start recorded, says
    // where the table is.
    let lake = dir.path().display().to_string();
    let shown = cli(&["show", "orders_v2", "--lake", &lake, "--namespace", "shop"]).await;
    let said = String::from_utf8_lossy(&shown.stderr);
    assert!(
        !shown.status.success()
            && said.contains("public.orders_v2 is replicated into orders and orders_changes"),
        "{said}"
    );
    // And every start after: the lake keeps the names the table had; the
    // start says which name it took the old one for.
    db.exec("UPDATE orders_v2 SET qty = 30 WHERE id = 2;").await;
    let ran = cli(&binary_run(&db, &opts, dir.path())).await;
    let said = String::from_utf8_lossy(&ran.stderr);
    assert!(ran.status.success(), "{said}");
    assert!(
        said.contains("names a table by a name it had") && said.contains("public.orders_v2"),
        "{said}"
    );
    assert_eq!(history(dir.path(), "qty").await.last(), Some(&json!(30)));
    assert_success(&at_lake("check", &db, &slot, dir.path(), "public.orders").await);

    // Dropped and created again under the name the lake now records: a
    // different table, refused before anything changes.
    db.exec(
        "DROP TABLE orders_v2;
         CREATE TABLE orders_v2(id int PRIMARY KEY, qty int);
         INSERT INTO orders_v2 VALUES (7, 7);",
    )
    .await;
    let confirmed = db.confirmed_flush(&slot).await;
    let err = run(&db.config, &opts).await.unwrap_err().to_string();
    assert!(err.contains("dropped and created again"), "{err}");
    assert!(err.contains("public.orders_v2"), "{err}");
    assert_eq!(db.confirmed_flush(&slot).await, confirmed);
}

/// A primary key added to a table without one, while a run streams: the
/// table gets its silver, loaded by a resync while the run goes on, and
/// bronze keeps its whole history (docs/tables.md, Schema changes). The
/// key dropped, silver goes, and comes back with a key again.
#[tokio::test]
async fn a_primary_key_added_to_a_keyless_table_gives_it_a_silver_table() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE notes(id int NOT NULL, body text);
         ALTER TABLE notes REPLICA IDENTITY FULL;
         INSERT INTO notes VALUES (1, 'a');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("gainskey");
    let opts = run_options(&db, &["notes"], &slot, dir.path());
    run(&db.config, &opts).await.unwrap();
    let lake = wal2iceberg::lake::catalog::Lake::open_embedded(dir.path())
        .await
        .unwrap();
    let silver = iceberg::TableIdent::new(
        wal2iceberg::lake::catalog::namespace("shop"),
        "notes".into(),
    );
    assert!(lake.table_if_exists(&silver).await.unwrap().is_none());

    let mut running = streaming(&db, &["notes"], &slot, dir.path(), 30).await;
    db.exec(
        "INSERT INTO notes VALUES (2, 'b');
         ALTER TABLE notes ADD PRIMARY KEY (id);
         UPDATE notes SET body = 'a2' WHERE id = 1;
         DELETE FROM notes WHERE id = 2;",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    running.await.unwrap().unwrap();
    db.exec("INSERT INTO notes VALUES (3, 'c');").await;
    run(&db.config, &opts).await.unwrap();

    let notes = || async { id_body_rows(dir.path(), "shop.notes").await };
    assert_eq!(notes().await, [(1, "a2".to_owned()), (3, "c".to_owned())]);
    let bronze = pyiceberg(dir.path(), "shop.notes_changes", "rows").await;
    let mut ops: Vec<&str> = bronze
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["_cdc_op"].as_str().unwrap())
        .collect();
    ops.sort();
    // The load's read, the stream's four changes, the reload's read of
    // the one row left then, and the insert after it.
    assert_eq!(ops, ["c", "c", "d", "r", "r", "u"]);
    assert_eq!(reads_of(&bronze, 1).len(), 2, "{bronze}");
    assert_success(&verify_lake(&db, &slot, dir.path(), "public.notes").await);

    // The key dropped (while stopped, a resync asked for before): silver,
    // which can keep no row by key, goes; bronze keeps every change, rows
    // no key tells apart too, and no reload's reads.
    let (lake_arg, url) = (dir.path().display().to_string(), db.config_url());
    let resync = [
        "resync",
        "--table",
        "public.notes",
        "--namespace",
        "shop",
        "--lake",
        &lake_arg,
        "--source",
        &url,
    ];
    assert_success(&cli(&resync).await);
    db.exec(
        "ALTER TABLE notes DROP CONSTRAINT notes_pkey;
         INSERT INTO notes VALUES (3, 'c-twin'), (4, 'd');
         UPDATE notes SET body = 'c2' WHERE body = 'c';",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert!(lake.table_if_exists(&silver).await.unwrap().is_none());
    let bronze = pyiceberg(dir.path(), "shop.notes_changes", "rows").await;
    assert_eq!(bronze.as_array().unwrap().len(), 9, "{bronze}");
    let verified = verify_lake(&db, &slot, dir.path(), "public.notes").await;
    assert_success(&verified);
    let said = String::from_utf8_lossy(&verified.stdout);
    assert!(said.contains("not compared: no primary key"), "{said}");

    // And a key again: silver anew.
    db.exec(
        "DELETE FROM notes WHERE body = 'c-twin';
         ALTER TABLE notes ADD PRIMARY KEY (id);
         INSERT INTO notes VALUES (5, 'e');",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    let expected = [(1, "a2"), (3, "c2"), (4, "d"), (5, "e")].map(|(id, b)| (id, b.to_owned()));
    assert_eq!(notes().await, expected);
    assert_success(&verify_lake(&db, &slot, dir.path(), "public.notes").await);
}

/// The primary key dropped from a table of the default replica identity,
/// and from one whose identity is a unique index, while a run streams:
/// PostgreSQL refuses the first's UPDATE and DELETE from then on, the
/// second's before images hold the index's columns only, and the run,
/// which starts its stream over to drop their silver, keeps running
/// rather than refusing tables it already publishes.
#[tokio::test]
async fn a_primary_key_dropped_under_the_default_or_an_index_identity_keeps_the_run_going() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, customer text NOT NULL, qty int);
         INSERT INTO orders VALUES (1, 'ann', 1);
         CREATE TABLE items(id int PRIMARY KEY, code int NOT NULL UNIQUE, v text);
         ALTER TABLE items REPLICA IDENTITY USING INDEX items_code_key;
         INSERT INTO items VALUES (1, 10, 'a');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("unkeyed");
    run(
        &db.config,
        &run_options(&db, &["orders", "items"], &slot, dir.path()),
    )
    .await
    .unwrap();
    let mut running = streaming(&db, &["orders", "items"], &slot, dir.path(), 10).await;
    db.exec(
        "ALTER TABLE orders DROP CONSTRAINT orders_pkey;
         INSERT INTO orders VALUES (1, 'ann again', 2);
         ALTER TABLE items DROP CONSTRAINT items_pkey;
         INSERT INTO items VALUES (1, 11, 'b');
         UPDATE items SET v = 'a2' WHERE code = 10;",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    running.await.unwrap().unwrap();
    let lake = wal2iceberg::lake::catalog::Lake::open_embedded(dir.path())
        .await
        .unwrap();
    for (table, changes) in [("orders", 2), ("items", 3)] {
        let silver =
            iceberg::TableIdent::new(wal2iceberg::lake::catalog::namespace("shop"), table.into());
        assert!(
            lake.table_if_exists(&silver).await.unwrap().is_none(),
            "{table}: silver outlived its primary key"
        );
        let bronze = pyiceberg(dir.path(), &format!("shop.{table}_changes"), "rows").await;
        assert_eq!(
            bronze.as_array().unwrap().len(),
            changes,
            "{table}'s bronze: {bronze}"
        );
    }
}

/// The `(id, body)` rows of `table` as pyiceberg reads them, sorted.
async fn id_body_rows(lake: &std::path::Path, table: &str) -> Vec<(i64, String)> {
    let mut rows: Vec<(i64, String)> = pyiceberg(lake, table, "rows")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    rows.sort();
    rows
}

/// The current rows of silver as DuckDB reads them: `(id, customer, qty)`
/// as text, sorted.
async fn duck_rows(lake: &std::path::Path) -> Vec<[String; 3]> {
    let mut rows: Vec<[String; 3]> = duckdb(lake, SILVER)
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|r| ["id", "customer", "qty"].map(|c| r[c].to_string()))
        .collect();
    rows.sort();
    rows
}

/// A changed primary key, while a run streams, and a key column retyped
/// to a type Iceberg cannot promote to, while stopped: silver is loaded
/// anew under the new key (a new required field for a column that becomes
/// one), the old files removed, while the run keeps running.
#[tokio::test]
async fn a_changed_or_retyped_primary_key_reloads_silver_and_the_run_goes_on() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, customer text NOT NULL, qty int);
         INSERT INTO orders VALUES (1, 'ann', 1), (2, 'bob', 2);",
    )
    .await;
    let (dir, opts) = loaded(&db, "rekey").await;
    let before = schema(dir.path(), SILVER).await;
    let slot = opts.capture.slot.clone();

    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 30).await;
    db.exec(
        "UPDATE orders SET qty = 3 WHERE id = 1;
         ALTER TABLE orders DROP CONSTRAINT orders_pkey, ADD PRIMARY KEY (customer);
         INSERT INTO orders VALUES (3, 'cy', 5);
         UPDATE orders SET qty = 4 WHERE customer = 'bob';",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    running.await.unwrap().unwrap();
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    let rekeyed = schema(dir.path(), SILVER).await;
    assert_eq!(rekeyed["identifier"], json!(["customer"]), "{rekeyed}");
    assert!(rekeyed["ids"]["customer"].as_i64() > before["ids"]["qty"].as_i64());
    assert!(
        !rekeyed["required"]
            .as_array()
            .unwrap()
            .contains(&json!("id"))
    );
    assert_eq!(
        duck_rows(dir.path()).await,
        [
            ["1", "\"ann\"", "3"],
            ["2", "\"bob\"", "4"],
            ["3", "\"cy\"", "5"]
        ]
        .map(|r| r.map(str::to_owned))
    );

    // The automatic reload dies between silver's commit and bronze's; the
    // next run does it again, once.
    db.exec(
        "ALTER TABLE orders ALTER COLUMN customer TYPE int USING id;
         UPDATE orders SET qty = 9 WHERE customer = 2;",
    )
    .await;
    crash_at(
        &binary_run(&db, &opts, dir.path()),
        "between-resync-silver-and-bronze",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    let retyped = schema(dir.path(), SILVER).await;
    assert_eq!(retyped["identifier"], json!(["customer"]), "{retyped}");
    assert_eq!(retyped["types"]["customer"], json!("int"));
    assert_eq!(
        duck_rows(dir.path()).await,
        [["1", "1", "3"], ["2", "2", "9"], ["3", "3", "5"]].map(|r| r.map(str::to_owned))
    );
    // The load, the changes, each reload's reads once.
    assert_eq!(bronze_ops(dir.path(), BRONZE).await, "rrucurrrurrr");
    assert_verified(&db, &slot, dir.path()).await;
}

/// The values of `v` in a silver table, sorted.
async fn values_of(lake: &std::path::Path, table: &str) -> Vec<String> {
    let mut values: Vec<String> = pyiceberg(lake, table, "rows")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["v"].as_str().unwrap().to_owned())
        .collect();
    values.sort();
    values
}

/// Two tables whose names were swapped while stopped: each goes on into
/// its own Iceberg tables, found by its OID. Then one renamed and a new
/// table created under its old name: a `--tables` naming that old name is
/// refused before anything changes.
#[tokio::test]
async fn swapped_table_names_keep_each_table_in_its_own_iceberg_tables() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE a(id int PRIMARY KEY, v text); CREATE TABLE b(id int PRIMARY KEY, v text);
         INSERT INTO a VALUES (1, 'a1'); INSERT INTO b VALUES (1, 'b1');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("swap");
    let opts = run_options(&db, &["a", "b"], &slot, dir.path());
    run(&db.config, &opts).await.unwrap();

    db.exec(
        "ALTER TABLE a RENAME TO tmp; ALTER TABLE b RENAME TO a; ALTER TABLE tmp RENAME TO b;
         INSERT INTO b VALUES (2, 'was a'); INSERT INTO a VALUES (2, 'was b');",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_eq!(values_of(dir.path(), "shop.a").await, ["a1", "was a"]);
    assert_eq!(values_of(dir.path(), "shop.b").await, ["b1", "was b"]);
    assert_success(&verify_lake(&db, &slot, dir.path(), "public.a,public.b").await);

    db.exec(
        "ALTER TABLE b RENAME TO c; CREATE TABLE b(id int PRIMARY KEY, v text);
         INSERT INTO c VALUES (3, 'c');",
    )
    .await;
    let confirmed = db.confirmed_flush(&slot).await;
    let err = run(&db.config, &opts).await.unwrap_err().to_string();
    assert!(err.contains("renamed") && err.contains("public.b"), "{err}");
    assert_eq!(db.confirmed_flush(&slot).await, confirmed);
}

/// A retype whose `USING` rewrites every row, with no change to the table
/// after it: no Relation message comes, and only the event trigger's mark
/// of the rewrite tells the run to reload silver.
#[tokio::test]
async fn a_retype_using_an_expression_with_no_change_after_it_reloads_silver() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "{TWO_ORDERS} INSERT INTO orders VALUES (3, 'cy', 3);"
    ))
    .await;
    let (dir, opts) = loaded(&db, "using").await;
    db.exec("ALTER TABLE orders ALTER qty TYPE bigint USING qty * 100;")
        .await;
    let ran = cli(&binary_run(&db, &opts, dir.path())).await;
    assert_success(&ran);
    assert_verified(&db, &opts.capture.slot, dir.path()).await;
}

/// The same while the run streams, on a partitioned table: each
/// partition's rewrite names the table captured, and one reload of its
/// silver follows. A table without a key keeps its history, and the run
/// says the rewrite is not in it.
#[tokio::test]
async fn a_rewrite_of_a_partitioned_table_while_streaming_reloads_its_silver_once() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE parts(id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);
         CREATE TABLE parts_a PARTITION OF parts FOR VALUES FROM (0) TO (10);
         CREATE TABLE parts_b PARTITION OF parts FOR VALUES FROM (10) TO (20);
         INSERT INTO parts SELECT i, i % 20, repeat('v', i) FROM generate_series(1, 40) i;
         CREATE TABLE notes(at int, what text);
         ALTER TABLE notes REPLICA IDENTITY FULL;
         INSERT INTO notes VALUES (1, 'abc');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("rewrite");
    let mut running = streaming(&db, &["parts", "notes"], &slot, dir.path(), 30).await;
    db.exec(
        "ALTER TABLE parts ALTER v TYPE int USING length(v);
         ALTER TABLE notes ALTER what TYPE int USING length(what);",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    running
        .await
        .unwrap()
        .expect("the run keeps running through the rewrites");
    assert_reconciled(&db, "parts", dir.path(), "shop.parts").await;
    let rows = pyiceberg(dir.path(), "shop.parts_changes", "rows").await;
    let reads = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] == "r")
        .count();
    assert_eq!(reads, 80, "the load and one reload of 40 rows");
    // Bronze took the retype at the DDL, though no change followed it:
    // the reload's values are under the column's own name.
    let bronze = schema(dir.path(), "shop.parts_changes").await;
    assert_eq!(bronze["types"]["v"], json!("int"), "{bronze}");
    let verified = verify_lake(&db, &slot, dir.path(), "public.parts,public.notes").await;
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stdout)
    );
    let notes = pyiceberg(dir.path(), "shop.notes_changes", "rows").await;
    assert_eq!(notes.as_array().unwrap().len(), 1, "{notes}");
}

/// Each ALTER TABLE is followed where it stands in the stream, though no
/// change of the table comes after it: verify finds the lake in step after
/// each one, and silver holds what the source shows.
#[tokio::test]
async fn ddl_with_no_change_after_it_is_followed_at_its_place_in_the_stream() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "{TWO_ORDERS} INSERT INTO orders SELECT i, 'c' || i, i FROM generate_series(3, 40) i;"
    ))
    .await;
    let (dir, opts) = loaded(&db, "atddl").await;
    let slot = opts.capture.slot.clone();
    // Stopped when done: a verify between the steps may outlast an idle
    // exit on a loaded machine.
    let (mut running, stop) = streaming_until_stopped(&db, &["orders"], &slot, dir.path()).await;
    for step in [
        "ALTER TABLE orders ADD COLUMN x int",
        "ALTER TABLE orders ADD COLUMN c int DEFAULT 42",
        "ALTER TABLE orders RENAME COLUMN qty TO quantity",
        "ALTER TABLE orders DROP COLUMN customer; ALTER TABLE orders ADD COLUMN customer text",
        "BEGIN; ALTER TABLE orders ALTER quantity TYPE bigint USING quantity * 2;
         ALTER TABLE orders RENAME COLUMN quantity TO qty; COMMIT;",
    ] {
        db.exec(step).await;
        applied(&db, &slot, &mut running).await;
        let verified = verify_lake(&db, &slot, dir.path(), "public.orders").await;
        assert!(
            verified.status.success(),
            "after {step}: {}{}",
            String::from_utf8_lossy(&verified.stdout),
            String::from_utf8_lossy(&verified.stderr)
        );
    }
    stop.request();
    running.await.unwrap().unwrap();
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    let silver = schema(dir.path(), SILVER).await;
    for name in ["x", "c", "qty", "customer"] {
        assert!(silver["ids"].get(name).is_some(), "{name}: {silver}");
    }
    let bronze = schema(dir.path(), BRONZE).await;
    let retired = bronze["ids"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("customer__"))
        .count();
    assert_eq!(retired, 1, "the dropped customer's field: {bronze}");
}

/// A value kept as text (`_cdc_verbatim`, under the name its column had
/// when the row was written) still compares equal after a rename.
#[tokio::test]
async fn a_value_kept_verbatim_verifies_under_its_columns_new_name() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, price numeric(12,2));
         INSERT INTO orders VALUES (1, 'NaN'), (2, 2.5);",
    )
    .await;
    let (dir, opts) = loaded(&db, "verbatim").await;
    db.exec(
        "ALTER TABLE orders RENAME COLUMN price TO cost; UPDATE orders SET cost = 3 WHERE id = 2;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    let silver = pyiceberg(dir.path(), SILVER, "rows").await;
    let nan = silver
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == json!(1))
        .unwrap()
        .clone();
    assert_eq!(nan["cost"], json!(null), "{nan}");
    assert_verified(&db, &opts.capture.slot, dir.path()).await;
}

/// A column dropped and added again with a default in one transaction:
/// silver is reloaded for the default, and bronze, which took the DDL at
/// its place first, gets the reload's values under the new column.
#[tokio::test]
async fn a_column_dropped_and_added_again_with_a_default_reloads_into_the_new_field() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, c int);
         INSERT INTO orders SELECT g, g FROM generate_series(1, 50) g;",
    )
    .await;
    let (dir, opts) = loaded(&db, "dropadd").await;
    let slot = opts.capture.slot.clone();
    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 30).await;
    db.exec("BEGIN; ALTER TABLE orders DROP COLUMN c; ALTER TABLE orders ADD COLUMN c int DEFAULT 5; COMMIT;")
        .await;
    applied(&db, &slot, &mut running).await;
    running.await.unwrap().unwrap();
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    assert_verified(&db, &slot, dir.path()).await;

    // Again while stopped, and a resync asked for before the next run,
    // whose snapshot is then ahead of bronze's stream by the drop and add:
    // the reload's values wait in a field of their own until the stream
    // reaches the add, never in the dropped column's.
    db.exec(
        "BEGIN; ALTER TABLE orders DROP COLUMN c; ALTER TABLE orders ADD COLUMN c int; COMMIT;
         UPDATE orders SET c = 100 + id WHERE id <= 3;",
    )
    .await;
    request_resync(&db, dir.path(), "public.orders").await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    assert_verified(&db, &slot, dir.path()).await;
    let bronze = schema(dir.path(), BRONZE).await;
    assert_eq!(
        bronze["ids"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with("c__"))
            .count(),
        2,
        "the two dropped columns' fields: {bronze}"
    );
}
