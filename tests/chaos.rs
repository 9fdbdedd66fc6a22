//! Crash safety against an independent record. A trigger writes every
//! change of the replicated table into an audit table that is not
//! published; while a randomized workload runs, `wal2iceberg run` is
//! killed with SIGKILL at random moments and started again, many times.
//! Afterwards silver must equal the source (read through pyiceberg) and
//! bronze must hold every audited change exactly once, in order, with the
//! same values. `CHAOS_KILLS` sets the number of kills (default 30; the
//! longer runs of docs/reliability.md use hundreds).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::process::Command;

use crate::support::*;

const SCHEMA: &str = "
    CREATE TABLE accounts(id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL, note text);
    ALTER TABLE accounts ALTER COLUMN note SET STORAGE EXTERNAL;
    INSERT INTO accounts SELECT i, 'owner ' || i, i, NULL FROM generate_series(1, 500) i;
    CREATE TABLE audit(seq bigserial PRIMARY KEY, op text NOT NULL, old jsonb, new jsonb);
    CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO audit(op, old, new) VALUES (
        CASE TG_OP WHEN 'INSERT' THEN 'c' WHEN 'UPDATE' THEN 'u' ELSE 'd' END,
        CASE WHEN TG_OP IN ('UPDATE', 'DELETE') THEN to_jsonb(OLD) END,
        CASE WHEN TG_OP IN ('INSERT', 'UPDATE') THEN to_jsonb(NEW) END);
      RETURN NULL;
    END $$;
    CREATE FUNCTION audit_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO audit(op) VALUES ('t');
      RETURN NULL;
    END $$;
    CREATE TRIGGER accounts_audit AFTER INSERT OR UPDATE OR DELETE ON accounts
      FOR EACH ROW EXECUTE FUNCTION audit_row();
    CREATE TRIGGER accounts_truncate AFTER TRUNCATE ON accounts
      FOR EACH STATEMENT EXECUTE FUNCTION audit_truncate();";

/// One random transaction of the workload.
fn transaction(rng: &mut impl Rng, next_id: &mut i64) -> String {
    let pick = "(SELECT id FROM accounts ORDER BY random() LIMIT 1)";
    let mut statement = |rng: &mut dyn rand::RngCore| -> String {
        match rng.random_range(0..100) {
            0..30 => {
                *next_id += 1;
                format!(
                    "INSERT INTO accounts VALUES ({next_id}, 'owner {next_id}', {}.25, NULL);",
                    rng.random_range(0..1000)
                )
            }
            30..60 => format!("UPDATE accounts SET balance = balance + 1 WHERE id = {pick};"),
            60..70 => format!(
                "UPDATE accounts SET note = repeat(md5(random()::text), 100) WHERE id = {pick};"
            ),
            70..80 => {
                *next_id += 1;
                format!("UPDATE accounts SET id = {next_id} WHERE id = {pick};")
            }
            _ => format!("DELETE FROM accounts WHERE id = {pick};"),
        }
    };
    let body = match rng.random_range(0..100) {
        0..60 => statement(rng),
        60..95 => (0..rng.random_range(2..8))
            .map(|_| statement(rng))
            .collect::<String>(),
        95..99 => {
            let from = *next_id + 1;
            *next_id += 3000;
            format!(
                "INSERT INTO accounts SELECT i, 'bulk ' || i, 1, NULL FROM generate_series({from}, {next_id}) i;"
            )
        }
        _ => "TRUNCATE accounts;".to_owned(),
    };
    format!("BEGIN; {body} COMMIT;")
}

async fn workload(db: Arc<TestDb>, stop: Arc<AtomicBool>, commits: Arc<AtomicU64>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut next_id = 1_000;
    while !stop.load(Ordering::Relaxed) {
        db.exec(&transaction(&mut rng, &mut next_id)).await;
        commits.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
}

fn run_args<'a>(url: &'a str, slot: &'a str, lake: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--source",
        url,
        "--tables",
        "public.accounts",
        "--slot",
        slot,
        "--lake",
        lake,
        "--namespace",
        "shop",
        "--flush-interval",
        "200ms",
    ]
}

fn spawn(args: &[&str]) -> tokio::process::Child {
    Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(args)
        .env("RUST_LOG", "wal2iceberg=warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start wal2iceberg")
}

/// Whether both tables hold their initial load.
async fn loaded(lake: &std::path::Path) -> bool {
    use wal2iceberg::lake::catalog::{Lake, namespace};
    use wal2iceberg::lake::writer::Position;
    if !lake.join("catalog.db").is_file() {
        return false;
    }
    let Ok(lake) = Lake::open_embedded(lake).await else {
        return false;
    };
    for name in ["accounts", "accounts_changes"] {
        let ident = iceberg::TableIdent::new(namespace("shop"), name.into());
        match lake.table_if_exists(&ident).await {
            Ok(Some(table)) if matches!(Position::of(&table), Ok(Some(_))) => {}
            _ => return false,
        }
    }
    true
}

/// A number as the audit's JSON and pyiceberg's JSON both can write it.
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

#[tokio::test]
async fn random_kills_during_a_random_workload_lose_and_repeat_nothing() {
    let kills: usize = std::env::var("CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let db = Arc::new(TestDb::new().await);
    db.exec(SCHEMA).await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("chaos");
    let args = run_args(&url, &slot, &lake_path);

    // The first run loads; the workload starts once the load landed, so
    // that every audited change must appear in bronze as a change (a table
    // whose load a kill interrupts is loaded again from a later snapshot,
    // which then holds the changes made before it).
    let mut first = spawn(&args);
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while !loaded(lake.path()).await {
        assert!(
            std::time::Instant::now() < give_up,
            "the first run never loaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (stop, commits) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writer = tokio::spawn(workload(db.clone(), stop.clone(), commits.clone(), 42));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
    first.kill().await.unwrap();
    for _ in 1..kills {
        let mut child = spawn(&args);
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
        child.kill().await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let mut drain = run_args(&url, &slot, &lake_path);
    drain.extend(["--exit-when-idle", "3s"]);
    let out = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(&drain)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Silver equals the source.
    let digest = assert_reconciled(&db, "accounts", lake.path(), "shop.accounts").await;

    // Bronze holds every audited change once, in commit order, with its
    // values: one writer connection, so audit order is commit order.
    let audit: Vec<(String, Option<Value>, Option<Value>)> = db
        .client
        .query(
            "SELECT op, old::text, new::text FROM audit ORDER BY seq",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let json = |i: usize| {
                r.get::<_, Option<&str>>(i)
                    .map(|t| serde_json::from_str(t).unwrap())
            };
            (r.get(0), json(1), json(2))
        })
        .collect();
    let bronze = pyiceberg(lake.path(), "shop.accounts_changes", "rows").await;
    let changes: Vec<&Value> = bronze
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] != "r")
        .collect();
    let loaded = bronze.as_array().unwrap().len() - changes.len();
    assert_eq!(loaded, 500, "the initial load, once");
    assert_eq!(
        changes.len(),
        audit.len(),
        "bronze has {} changes, the audit {} ({} transactions, {kills} kills)",
        changes.len(),
        audit.len(),
        commits.load(Ordering::Relaxed)
    );
    for (i, (row, (op, old, new))) in changes.iter().zip(&audit).enumerate() {
        assert_eq!(row["_cdc_op"], op.as_str(), "change {i}");
        let image = match op.as_str() {
            "t" => continue,
            // REPLICA IDENTITY DEFAULT: a delete carries the key only.
            "d" => {
                assert_eq!(row["id"], old.as_ref().unwrap()["id"], "change {i} (d)");
                continue;
            }
            _ => new.as_ref().unwrap(),
        };
        for column in ["id", "owner", "note"] {
            assert_eq!(
                row[column], image[column],
                "change {i} ({op}), column {column}"
            );
        }
        assert_eq!(
            number(&row["balance"]),
            number(&image["balance"]),
            "change {i} balance"
        );
    }
    println!(
        "chaos: {kills} kills, {} transactions, {} changes checked, {} live rows, no mismatch",
        commits.load(Ordering::Relaxed),
        audit.len(),
        digest.rows
    );
}
