//! The embedded lake, read back through pyiceberg.

use iceberg::TableIdent;
use serde_json::{Value, json};
use wal2iceberg::lake::catalog::{Lake, namespace};
use wal2iceberg::lake::schema::{bronze_schema, silver_schema};

use crate::support::*;

/// Runs the pyiceberg reader; its output as JSON.
pub async fn pyiceberg(lake: &std::path::Path, table: &str, mode: &str) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/read_lake.py");
    let out = tokio::process::Command::new("python3")
        .args([script, &lake.display().to_string(), table, mode])
        .output()
        .await
        .expect("run python3");
    assert!(
        out.status.success(),
        "pyiceberg reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from the reader")
}

#[tokio::test]
async fn silver_and_bronze_tables_are_created_as_pyiceberg_reads_them() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL, amount numeric(12,2), tags text[])")
        .await;
    db.exec("INSERT INTO customers VALUES (1, 'Ada', 1.50, '{a}')")
        .await;
    let mut options = db.options(&["customers"]);
    options.temporary_slot = true;
    let (load, stream) = open_fresh(&db, &options).await;
    stream.stop().await.unwrap();
    let relation = changes(&load)[0].relation.clone();

    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open_embedded(dir.path()).await.unwrap();
    let shop = namespace("shop");
    let silver = TableIdent::new(shop.clone(), "customers".into());
    let bronze = TableIdent::new(shop, "customers_changes".into());
    lake.ensure_table(&silver, silver_schema(&relation).unwrap())
        .await
        .unwrap();
    lake.ensure_table(&bronze, bronze_schema(&relation).unwrap())
        .await
        .unwrap();
    // Opening again finds them instead of failing.
    let again = Lake::open_embedded(dir.path()).await.unwrap();
    again
        .ensure_table(&silver, silver_schema(&relation).unwrap())
        .await
        .unwrap();

    let s = pyiceberg(dir.path(), "shop.customers", "schema").await;
    assert_eq!(
        s["fields"],
        json!([
            "id",
            "name",
            "amount",
            "tags",
            "_cdc_commit_lsn",
            "_cdc_commit_ts"
        ])
    );
    assert_eq!(s["identifier"], json!(["id"]));
    assert_eq!(s["types"]["amount"], json!("decimal(12, 2)"));
    assert_eq!(s["format_version"], json!(2));
    assert_eq!(s["compression"], json!("zstd"));
    let b = pyiceberg(dir.path(), "shop.customers_changes", "schema").await;
    assert_eq!(b["fields"][5], json!("_cdc_op"));
    assert_eq!(
        b["fields"].as_array().unwrap().last(),
        Some(&json!("_cdc_before"))
    );
    assert_eq!(
        pyiceberg(dir.path(), "shop.customers", "rows").await,
        json!([])
    );
}
