//! A lake goes on from another slot of its database when that cannot
//! leave a gap: a copy of its slot, standing within the history the lake
//! holds, resends what the lake has and adds nothing; a slot past it is
//! refused with the gap in bytes (docs/operations.md, Following another
//! slot).

use iceberg::TableIdent;
use wal2iceberg::apply::table_set::SOURCE_SLOT;
use wal2iceberg::lake::catalog::{Lake, namespace};

use crate::support::oracle::Oracle;
use crate::support::*;

/// The slot the bronze table of `table` records.
async fn recorded_slot(lake: &std::path::Path, table: &str) -> Option<String> {
    let lake = Lake::open_embedded(lake).await.unwrap();
    let ident = TableIdent::new(namespace("shop"), format!("{table}_changes"));
    let bronze = lake.catalog_table(&ident).await.unwrap();
    bronze.metadata().properties().get(SOURCE_SLOT).cloned()
}

async fn customers(db: &TestDb) {
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text);
         INSERT INTO customers VALUES (1, 'free'), (2, 'pro'), (3, 'free');",
    )
    .await;
}

#[tokio::test]
async fn a_replay_from_a_copy_of_the_slot_adds_nothing_and_the_lake_follows_the_copy() {
    let db = TestDb::new().await;
    customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("adopted");
    let copy = format!("{slot}_replay");
    let opts = run_options(&db, &["customers"], &slot, dir.path());
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    db.exec(&format!(
        "SELECT pg_copy_logical_replication_slot('{slot}', '{copy}')"
    ))
    .await;
    db.exec(
        "UPDATE customers SET plan = 'team' WHERE id = 1;
         DELETE FROM customers WHERE id = 3;
         INSERT INTO customers VALUES (4, 'free');",
    )
    .await;
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    let bronze = bronze_ops(dir.path(), "shop.customers_changes").await;
    let silver = id_plan_rows(dir.path(), "shop.customers").await;
    assert_eq!(bronze, "rrrudc");

    // The copy resends the three changes; the lake holds them already.
    let replay = run_options(&db, &["customers"], &copy, dir.path());
    let report = wal2iceberg::apply::run(&db.config, &replay).await.unwrap();
    assert_eq!(report.changes_applied, 3, "the copy resent the changes");
    assert_eq!(
        bronze_ops(dir.path(), "shop.customers_changes").await,
        bronze
    );
    assert_eq!(id_plan_rows(dir.path(), "shop.customers").await, silver);
    assert_eq!(
        recorded_slot(dir.path(), "customers").await,
        Some(copy.clone())
    );

    // From here the lake follows the copy; the old slot, behind the lake
    // now, may be taken up again, and resends what the lake holds.
    db.exec("UPDATE customers SET plan = 'pro' WHERE id = 4")
        .await;
    wal2iceberg::apply::run(&db.config, &replay).await.unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
    let bronze = format!("{bronze}u");
    assert_eq!(
        bronze_ops(dir.path(), "shop.customers_changes").await,
        bronze
    );
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    assert_eq!(
        bronze_ops(dir.path(), "shop.customers_changes").await,
        bronze
    );
    assert_eq!(recorded_slot(dir.path(), "customers").await, Some(slot));
    db.exec(&format!("SELECT pg_drop_replication_slot('{copy}')"))
        .await;
}

#[tokio::test]
async fn a_slot_made_after_the_lake_moved_on_is_refused_with_the_gap_in_bytes() {
    let db = TestDb::new().await;
    customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("gapped");
    let fresh = format!("{slot}_fresh");
    let opts = run_options(&db, &["customers"], &slot, dir.path());
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    db.exec("UPDATE customers SET plan = 'team' WHERE id = 1")
        .await;
    // Made while the lake's slot holds the update back: it never sends it.
    db.exec(&format!(
        "SELECT pg_create_logical_replication_slot('{fresh}', 'pgoutput')"
    ))
    .await;
    let confirmed = db.confirmed_flush(&fresh).await;
    let bronze = bronze_ops(dir.path(), "shop.customers_changes").await;
    let other = run_options(&db, &["customers"], &fresh, dir.path());
    let err = wal2iceberg::apply::run(&db.config, &other)
        .await
        .expect_err("a slot past the lake's history leaves a gap");
    let message = err.to_string();
    assert!(
        message.contains(&format!("replication slot {fresh:?} stands at"))
            && message.contains("bytes past")
            && message.contains(&format!("from slot {slot:?} ends"))
            && message.contains("gap_bytes="),
        "{message}"
    );
    assert_eq!(
        db.confirmed_flush(&fresh).await,
        confirmed,
        "the slot stays"
    );
    assert_eq!(
        recorded_slot(dir.path(), "customers").await,
        Some(slot.clone())
    );
    assert_eq!(
        bronze_ops(dir.path(), "shop.customers_changes").await,
        bronze
    );

    // The lake's own slot still brings the update.
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
}

#[tokio::test]
async fn a_copy_taken_mid_stream_and_used_after_a_kill_loses_and_doubles_nothing() {
    let mut o = Oracle::new(200).await;
    let mut run = o.spawn();
    o.wait_loaded(&mut run).await;
    o.start_workload();
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let copy = format!("{}_copy", o.slot);
    o.db.exec(&format!(
        "SELECT pg_copy_logical_replication_slot('{}', '{copy}')",
        o.slot
    ))
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    run.kill().await.unwrap();
    let old = o.slot.clone();
    o.slot = copy;
    let (changes, rows) = o.finish().await;
    assert!(changes > 0 && rows > 0, "{changes} changes, {rows} rows");
    o.db.exec(&format!("SELECT pg_drop_replication_slot('{old}')"))
        .await;
}
