//! One focused test for each kind of schema change the rows of
//! docs/tables.md's DDL table name and the tests of schema_changes.rs do
//! not: every promotion, a scale made unconstrained, NOT NULL, an enum
//! column and its new values, the replica identity switched both ways
//! while running, and a crash inside the reload a retype asks for.

use serde_json::{Value, json};

use crate::schema_changes::{
    BRONZE, SILVER, applied, assert_verified, binary_run, crash_at, loaded, reads_of, schema,
    streaming,
};
use crate::support::*;

/// Bronze's changes (no reads), oldest first.
async fn changes(lake: &std::path::Path) -> Vec<Value> {
    let rows = pyiceberg(lake, BRONZE, "rows").await;
    rows.as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] != "r")
        .cloned()
        .collect()
}

/// How many reads (`r`: the load's and any reload's) bronze holds.
async fn reads(lake: &std::path::Path) -> usize {
    let rows = pyiceberg(lake, BRONZE, "rows").await;
    let rows = rows.as_array().unwrap();
    rows.iter().filter(|r| r["_cdc_op"] == "r").count()
}

/// Each promotion Iceberg allows, made while the run streams: the fields
/// keep their ids in silver, bronze and bronze's before image, widen in
/// place, and the wider values reach both tables.
#[tokio::test]
async fn every_promotion_iceberg_allows_widens_in_place_in_both_tables() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, small int2, qty int, ratio float4,
                             code varchar(5), label varchar(5), price numeric(8,2));
         ALTER TABLE orders REPLICA IDENTITY FULL;
         INSERT INTO orders VALUES (1, 1, 1, 0.5, 'a', 'b', 1.25), (2, 2, 2, 1.5, 'c', 'd', 2.5);",
    )
    .await;
    let (dir, opts) = loaded(&db, "promote").await;
    let before = [
        schema(dir.path(), SILVER).await,
        schema(dir.path(), BRONZE).await,
    ];
    let slot = opts.capture.slot.clone();
    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 30).await;
    for step in [
        // No rewrite, no change of the Iceberg type.
        "ALTER TABLE orders ALTER small TYPE int4, ALTER code TYPE varchar(20);
         UPDATE orders SET code = 'twenty chars long..' WHERE id = 1;",
        // Rewrites (int4 to int8, float4 to float8) and widenings.
        "ALTER TABLE orders ALTER small TYPE int8, ALTER qty TYPE int8,
                            ALTER ratio TYPE float8, ALTER label TYPE text,
                            ALTER price TYPE numeric(10,2);
         INSERT INTO orders VALUES (3, 5000000000, 6000000000, 1e300,
                                    'e', repeat('long ', 10), 12345678.12);
         UPDATE orders SET ratio = 0.1, price = 99999999.99 WHERE id = 2;",
    ] {
        db.exec(step).await;
        applied(&db, &slot, &mut running).await;
    }
    running
        .await
        .unwrap()
        .expect("the run keeps running through the promotions");

    let after = [
        schema(dir.path(), SILVER).await,
        schema(dir.path(), BRONZE).await,
    ];
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(new["ids"], old["ids"], "every field keeps its id: {new}");
        for (column, wanted) in [
            ("small", "long"),
            ("qty", "long"),
            ("ratio", "double"),
            ("code", "string"),
            ("label", "string"),
            ("price", "decimal(10, 2)"),
        ] {
            assert_eq!(new["types"][column], json!(wanted), "{column}: {new}");
        }
    }
    assert_eq!(after[1]["before_ids"], before[1]["before_ids"]);
    let changes = changes(dir.path()).await;
    let ops: String = changes
        .iter()
        .map(|r| r["_cdc_op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, "ucu");
    assert_eq!(changes[1]["small"], json!(5_000_000_000i64));
    assert_eq!(changes[1]["qty"], json!(6_000_000_000i64));
    assert_eq!(changes[1]["ratio"], json!(1e300));
    assert_eq!(changes[2]["_cdc_before"]["ratio"], json!(1.5));
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    let duck = duckdb(dir.path(), SILVER).await;
    assert_eq!(duck.as_array().unwrap().len(), 3, "{duck}");
    assert_verified(&db, &slot, dir.path()).await;
}

/// `numeric(p,s)` to unconstrained `numeric` is no promotion: the value
/// becomes the exact text (docs/values.md), so bronze retires the decimal
/// field under `price__<id>` with its history, and silver is reloaded,
/// NaN and the infinities included.
#[tokio::test]
async fn a_numeric_made_unconstrained_retires_its_field_in_bronze_and_reloads_silver() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, price numeric(12,2));
         INSERT INTO orders VALUES (1, 1.25), (2, 'NaN');",
    )
    .await;
    let (dir, opts) = loaded(&db, "unconstrained").await;
    let old_id = schema(dir.path(), BRONZE).await["ids"]["price"].clone();
    let slot = opts.capture.slot.clone();
    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 30).await;
    db.exec(
        "UPDATE orders SET price = 2.5 WHERE id = 1;
         ALTER TABLE orders ALTER price TYPE numeric;
         INSERT INTO orders VALUES (3, 'Infinity'), (4, 1.000000000000000000000000000000000001);",
    )
    .await;
    applied(&db, &slot, &mut running).await;
    running
        .await
        .unwrap()
        .expect("the run keeps running through the retype");

    let bronze = schema(dir.path(), BRONZE).await;
    let retired = format!("price__{old_id}");
    assert_eq!(bronze["ids"][&retired], old_id, "{bronze}");
    assert_eq!(bronze["types"][&retired], json!("decimal(12, 2)"));
    assert_eq!(bronze["types"]["price"], json!("string"), "{bronze}");
    assert_ne!(bronze["ids"]["price"], old_id);
    let silver = schema(dir.path(), SILVER).await;
    assert_eq!(silver["types"]["price"], json!("string"), "{silver}");

    let changes = changes(dir.path()).await;
    assert_eq!(changes[0][&retired], json!("2.50"), "{:?}", changes[0]);
    assert_eq!(changes[1]["price"], json!("Infinity"));
    assert_eq!(
        changes[2]["price"],
        json!("1.000000000000000000000000000000000001")
    );
    // The reload's reads hold the values under the new field.
    let rows = pyiceberg(dir.path(), BRONZE, "rows").await;
    let reread = reads_of(&rows, 2);
    assert_eq!(reread.len(), 2, "the load and the reload: {reread:?}");
    assert_eq!(reread[1]["price"], json!("NaN"));
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    assert_verified(&db, &slot, dir.path()).await;
}

/// NOT NULL set and dropped, an enum column added, and a value added to
/// the enum while it is in use: no field changes its id or type, nothing
/// is reloaded, and the new label reaches both tables.
#[tokio::test]
async fn not_null_and_enum_changes_leave_the_fields_as_they_are() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TYPE mood AS ENUM ('happy', 'sad');
         CREATE TABLE orders(id int PRIMARY KEY, customer text, qty int);
         INSERT INTO orders VALUES (1, 'ann', 1), (2, 'bob', 2);",
    )
    .await;
    let (dir, opts) = loaded(&db, "enum").await;
    let loaded_ids = schema(dir.path(), SILVER).await["ids"].clone();
    let slot = opts.capture.slot.clone();
    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 20).await;
    for step in [
        "ALTER TABLE orders ALTER customer SET NOT NULL; UPDATE orders SET qty = 3 WHERE id = 1;",
        "ALTER TABLE orders ADD COLUMN feeling mood; UPDATE orders SET feeling = 'sad' WHERE id = 2;",
        // ADD VALUE commits before its label is used.
        "ALTER TYPE mood ADD VALUE 'calm'",
        "UPDATE orders SET feeling = 'calm' WHERE id = 1; INSERT INTO orders VALUES (3, 'cy', 3, 'calm');",
        "ALTER TABLE orders ALTER customer DROP NOT NULL; UPDATE orders SET customer = NULL WHERE id = 2;",
    ] {
        db.exec(step).await;
        applied(&db, &slot, &mut running).await;
    }
    running
        .await
        .unwrap()
        .expect("the run keeps running through the changes");

    for table in [SILVER, BRONZE] {
        let now = schema(dir.path(), table).await;
        assert_eq!(now["types"]["feeling"], json!("string"), "{now}");
        assert_eq!(now["types"]["customer"], json!("string"));
        assert!(
            !now["required"]
                .as_array()
                .unwrap()
                .contains(&json!("customer")),
            "a source column stays optional: {now}"
        );
    }
    let mut ids = schema(dir.path(), SILVER).await["ids"].clone();
    ids.as_object_mut().unwrap().remove("feeling");
    assert_eq!(ids, loaded_ids, "the other fields keep their ids");
    assert_eq!(reads(dir.path()).await, 2, "nothing was reloaded");
    let feelings: Vec<Value> = changes(dir.path())
        .await
        .iter()
        .map(|r| r["feeling"].clone())
        .collect();
    assert_eq!(
        feelings,
        [
            json!(null),
            json!("sad"),
            json!("calm"),
            json!("calm"),
            json!("sad")
        ]
    );
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    assert_verified(&db, &slot, dir.path()).await;
}

/// The replica identity switched from DEFAULT to FULL and back, and to
/// FULL again, while the run streams: each change's before image is what
/// the identity of its time sent, and says which it is.
#[tokio::test]
async fn the_replica_identity_switched_both_ways_while_running_shows_in_each_before_image() {
    let db = TestDb::new().await;
    db.exec(crate::schema_changes::TWO_ORDERS).await;
    let (dir, opts) = loaded(&db, "identity").await;
    let ids = schema(dir.path(), BRONZE).await["ids"].clone();
    let slot = opts.capture.slot.clone();
    let mut running = streaming(&db, &["orders"], &slot, dir.path(), 20).await;
    for step in [
        "UPDATE orders SET qty = 10 WHERE id = 1;",
        "ALTER TABLE orders REPLICA IDENTITY FULL;
         UPDATE orders SET qty = 11 WHERE id = 1; DELETE FROM orders WHERE id = 2;",
        "ALTER TABLE orders REPLICA IDENTITY DEFAULT;
         UPDATE orders SET qty = 12 WHERE id = 1;
         INSERT INTO orders VALUES (3, 'cy', 3); DELETE FROM orders WHERE id = 3;",
        "ALTER TABLE orders REPLICA IDENTITY FULL; UPDATE orders SET customer = 'anna' WHERE id = 1;",
    ] {
        db.exec(step).await;
        applied(&db, &slot, &mut running).await;
    }
    running
        .await
        .unwrap()
        .expect("the run keeps running through the switches");

    let images: Vec<(String, Value)> = changes(dir.path())
        .await
        .iter()
        .map(|r| {
            let before = &r["_cdc_before"];
            let image = match before {
                Value::Null => json!(null),
                b => json!([b["_cdc_image"], b["id"], b["customer"], b["qty"]]),
            };
            (r["_cdc_op"].as_str().unwrap().to_owned(), image)
        })
        .collect();
    let expected = [
        ("u", json!(null)),
        ("u", json!(["full", 1, "ann", 10])),
        ("d", json!(["full", 2, "bob", 2])),
        ("u", json!(null)),
        ("c", json!(null)),
        ("d", json!(["key", 3, null, null])),
        ("u", json!(["full", 1, "ann", 12])),
    ]
    .map(|(op, image)| (op.to_owned(), image));
    assert_eq!(images, expected);
    assert_eq!(schema(dir.path(), BRONZE).await["ids"], ids);
    assert_eq!(reads(dir.path()).await, 2, "nothing was reloaded");
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    assert_verified(&db, &slot, dir.path()).await;
}

/// A crash while the reload a retype asks for is loading rows, before
/// its commits: the next run does the reload again from a new snapshot,
/// and bronze holds each row's reads once for the load and once for the
/// reload that landed, never the aborted one's.
#[tokio::test]
async fn a_crash_inside_the_reload_a_retype_asks_for_is_finished_by_the_next_run() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, customer text, qty int);
         INSERT INTO orders SELECT i, 'c' || i, i FROM generate_series(1, 300) i;",
    )
    .await;
    let (dir, opts) = loaded(&db, "reloadcrash").await;
    db.exec(
        "ALTER TABLE orders ALTER customer TYPE int USING length(customer);
         UPDATE orders SET qty = -qty WHERE id <= 5;",
    )
    .await;
    let args = binary_run(&db, &opts, dir.path());
    crash_at(&args, "initial-load").await;
    assert_eq!(
        reads(dir.path()).await,
        300,
        "the aborted reload left nothing"
    );
    assert_success(&cli(&args).await);

    assert_eq!(reads(dir.path()).await, 600, "the load and one reload");
    let rows = pyiceberg(dir.path(), BRONZE, "rows").await;
    let reread = reads_of(&rows, 123);
    assert_eq!(reread[1]["customer"], json!(4), "{reread:?}");
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    assert_verified(&db, &opts.capture.slot, dir.path()).await;
}

/// The reload a retype asks for runs beside the stream: while it is held
/// up (`load` stalled), another table's changes land in the lake, and a
/// reload that table's own DDL asks for waits for it instead of throwing
/// it away; the retyped table's changes made meanwhile reach it once the
/// reload landed, and nothing is taken twice.
#[tokio::test]
async fn a_reload_runs_beside_the_stream_and_the_other_tables_keep_streaming() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "{} CREATE TABLE customers(id int PRIMARY KEY, name text);
         INSERT INTO customers VALUES (1, 'ann');",
        crate::schema_changes::TWO_ORDERS
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["orders", "customers"], &unique("beside"), dir.path());
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    let mut args = binary_run(&db, &opts, dir.path());
    args.iter_mut()
        .filter(|a| *a == "public.orders")
        .for_each(|a| *a = "public.orders,public.customers".to_owned());
    let running = tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(&args)
        .env(wal2iceberg::failpoint::STALL_VARIABLE, "load:30000")
        .env("RUST_LOG", "wal2iceberg=info")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    db.wait_until_streaming(&opts.capture.slot).await;
    db.exec(
        "ALTER TABLE orders ALTER customer TYPE int USING length(customer);
         UPDATE orders SET qty = 20 WHERE id = 2;",
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    db.exec("INSERT INTO customers VALUES (2, 'bob');").await;
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(25);
    while pyiceberg(dir.path(), "shop.customers", "rows")
        .await
        .as_array()
        .unwrap()
        .len()
        < 2
    {
        assert!(
            std::time::Instant::now() < give_up,
            "customers' change waited for the reload"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert_eq!(reads(dir.path()).await, 2, "the reload has not landed yet");
    db.exec(
        "ALTER TABLE customers ADD COLUMN flag int DEFAULT 5;
         INSERT INTO customers VALUES (3, 'cy');",
    )
    .await;

    let out = running.wait_with_output().await.unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let loads: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("loading beside the stream"))
        .collect();
    assert!(
        loads.len() == 2 && loads[0].contains("public.orders") && !loads[1].contains("orders"),
        "orders loaded once beside the stream, then customers: {loads:?}"
    );
    assert_eq!(reads(dir.path()).await, 4, "the load and one reload");
    let ops: String = changes(dir.path())
        .await
        .iter()
        .map(|r| r["_cdc_op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, "u", "the update made during the reload, once");
    let customers = pyiceberg(dir.path(), "shop.customers_changes", "rows").await;
    let ops: String = customers
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["_cdc_op"].as_str().unwrap())
        .filter(|op| *op != "r")
        .collect();
    assert_eq!(ops, "cc", "customers' changes once, though streamed twice");
    assert_reconciled(&db, "orders", dir.path(), SILVER).await;
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
    let verified = verify_lake(
        &db,
        &opts.capture.slot,
        dir.path(),
        "public.orders,public.customers",
    )
    .await;
    assert_success(&verified);
}

/// A resync whose snapshot is ahead of bronze's stream by a column added,
/// dropped and added again under the same name: when the stream reaches
/// the last add, the column's field in bronze's before image is the one
/// its values go to, as at the top level, so a FULL before image keeps
/// its value.
#[tokio::test]
async fn a_column_added_again_ahead_of_bronzes_stream_keeps_its_before_image_values() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "{} ALTER TABLE orders REPLICA IDENTITY FULL;",
        crate::schema_changes::TWO_ORDERS
    ))
    .await;
    let (dir, opts) = loaded(&db, "again").await;
    request_resync(&db, dir.path(), "public.orders").await;
    db.exec(
        "ALTER TABLE orders ADD b3 text DEFAULT 'd';
         ALTER TABLE orders DROP b3;
         ALTER TABLE orders ADD b3 numeric(8,3);
         UPDATE orders SET b3 = 2.5;",
    )
    .await;
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    db.exec("UPDATE orders SET qty = -2 WHERE id = 2;").await;
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();

    let bronze = schema(dir.path(), BRONZE).await;
    assert!(
        bronze["before_ids"]["b3"].is_i64(),
        "the before image holds b3: {bronze}"
    );
    let last = changes(dir.path()).await.pop().unwrap();
    assert_eq!(last["_cdc_before"]["b3"], json!("2.500"), "{last}");
    assert_eq!(last["b3"], json!("2.500"), "{last}");
    assert_verified(&db, &opts.capture.slot, dir.path()).await;
}
