//! A seeded random sequence of ALTER TABLEs under writes: some while a run
//! streams, some while none does, one with a run that crashes between the
//! schema changes of bronze and silver. Every run ends on its own only
//! when idle; at the end `verify` passes, silver equals the source, bronze
//! holds every audited change with its values under the columns' current
//! names, and each column keeps the field id it had (docs/tables.md,
//! Schema changes). `DDL_SCENARIO_SEED` repeats a seed.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::support::*;

const SILVER: &str = "shop.items";
/// Repeats a scenario. Not under `WAL2ICEBERG_`, which the binary
/// reserves for its settings.
const SEED: &str = "DDL_SCENARIO_SEED";
const BRONZE: &str = "shop.items_changes";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Int,
    BigInt,
    Text,
    Numeric(u8, u8),
    IntList,
    Mood,
}

impl Kind {
    fn sql(self) -> String {
        match self {
            Kind::Int => "int".into(),
            Kind::BigInt => "bigint".into(),
            Kind::Text => "text".into(),
            Kind::Numeric(p, s) => format!("numeric({p},{s})"),
            Kind::IntList => "int[]".into(),
            Kind::Mood => "mood".into(),
        }
    }

    fn value(self, rng: &mut impl Rng, moods: &[String]) -> String {
        match self {
            Kind::Int => rng.random_range(-1000..1000).to_string(),
            Kind::BigInt => rng.random_range(-(1i64 << 40)..(1i64 << 40)).to_string(),
            Kind::Text => format!("'v{}'", rng.random_range(0..10_000)),
            // Two integer digits fit every precision the scenario makes.
            Kind::Numeric(_, s) => {
                let scale = 10i64.pow(u32::from(s));
                let n = rng.random_range(-99 * scale..99 * scale);
                format!("{n}e-{s}")
            }
            Kind::IntList => format!(
                "ARRAY[{}, {}]::int[]",
                rng.random_range(0..9),
                rng.random_range(0..9)
            ),
            Kind::Mood => format!("'{}'", moods[rng.random_range(0..moods.len())]),
        }
    }
}

/// A source column, as the scenario changed it.
#[derive(Clone, Debug)]
struct Column {
    name: String,
    kind: Kind,
    /// Bronze's field id for it, once a run made one; `None` again after a
    /// retype gave it a new field.
    field: Option<i64>,
    /// Retyped since the scenario began: its history is split.
    retyped: bool,
}

struct Scenario {
    db: TestDb,
    lake: tempfile::TempDir,
    slot: String,
    rng: rand::rngs::StdRng,
    /// Every column ever made, in order; those dropped are in `dropped`.
    columns: Vec<Column>,
    /// The values of the enum `mood`.
    moods: Vec<String>,
    next_id: i64,
    next_name: usize,
    /// For each ALTER, the last audit seq before it and the names of the
    /// live columns (by index into `columns`) then.
    eras: Vec<(i64, HashMap<usize, String>)>,
    dropped: Vec<usize>,
    alters: usize,
    /// Whether the primary key is `(id, k)` now, else `(id)`.
    composite_key: bool,
}

const AUDIT: &str = "
    CREATE TABLE audit(seq bigserial PRIMARY KEY, op text NOT NULL, old jsonb, new jsonb);
    CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO audit(op, old, new) VALUES (
        CASE TG_OP WHEN 'INSERT' THEN 'c' WHEN 'UPDATE' THEN 'u' ELSE 'd' END,
        CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
        CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END);
      RETURN NULL;
    END $$;
    CREATE TRIGGER items_audit AFTER INSERT OR UPDATE OR DELETE ON items
      FOR EACH ROW EXECUTE FUNCTION audit_row();";

impl Scenario {
    async fn new(seed: u64) -> Scenario {
        let db = TestDb::new().await;
        db.exec(&format!(
            "CREATE TYPE mood AS ENUM ('happy', 'sad');
             CREATE TABLE items(id int PRIMARY KEY, a int, b text, c numeric(10,2),
               k int NOT NULL DEFAULT 0);
             INSERT INTO items SELECT i, i, 'b' || i, i / 4.0, i % 3 FROM generate_series(1, 500) i;
             {AUDIT}"
        ))
        .await;
        let column = |name: &str, kind| Column {
            name: name.into(),
            kind,
            field: None,
            retyped: false,
        };
        Scenario {
            db,
            lake: tempfile::tempdir().unwrap(),
            slot: unique("ddl"),
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            columns: vec![
                column("a", Kind::Int),
                column("b", Kind::Text),
                column("c", Kind::Numeric(10, 2)),
            ],
            moods: vec!["happy".into(), "sad".into()],
            next_id: 501,
            next_name: 0,
            eras: Vec::new(),
            dropped: Vec::new(),
            alters: 0,
            composite_key: false,
        }
    }

    fn live(&self) -> Vec<usize> {
        (0..self.columns.len())
            .filter(|i| !self.dropped.contains(i))
            .collect()
    }

    fn fresh_name(&mut self) -> String {
        self.next_name += 1;
        format!("col{}", self.next_name)
    }

    fn command(&self, idle: &str) -> Command {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.lake.path().join("runs.log"))
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"));
        command
            .args([
                "run",
                "--source",
                &self.db.config_url(),
                "--slot",
                &self.slot,
            ])
            .args(["--lake", &self.lake.path().display().to_string()])
            .args(["--namespace", "shop", "--tables", "public.items"])
            .args(["--flush-interval", "200ms", "--exit-when-idle", idle])
            .env("RUST_LOG", "wal2iceberg=info")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        command
    }

    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.lake.path().join("runs.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Waits until `child`, a run, streams, or exits first (its status
    /// then); one that takes more than a minute fails the test.
    async fn streaming(&self, child: &mut Child) -> Option<std::process::ExitStatus> {
        let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if self.db.streams(&self.slot).await {
                return None;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "a run never streamed; the runs logged:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn ends_well(&self, child: Child) {
        let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
            .await
            .expect("the run ended within five minutes")
            .unwrap();
        assert!(
            out.status.success(),
            "a run stopped on its own; the runs logged:\n{}",
            self.log()
        );
    }

    async fn audit_seq(&self) -> i64 {
        self.db
            .client
            .query_one("SELECT coalesce(max(seq), 0) FROM audit", &[])
            .await
            .unwrap()
            .get(0)
    }

    /// A few random writes in one transaction, on the columns as they are.
    async fn write(&mut self) {
        let live = self.live();
        let mut sql = String::from("BEGIN;");
        for _ in 0..self.rng.random_range(1..6) {
            let pick = "(SELECT id FROM items ORDER BY random() LIMIT 1)";
            match self.rng.random_range(0..10) {
                0..4 => {
                    let names: Vec<String> =
                        live.iter().map(|&i| self.columns[i].name.clone()).collect();
                    let values: Vec<String> = live
                        .iter()
                        .map(|&i| self.columns[i].kind.value(&mut self.rng, &self.moods))
                        .collect();
                    sql.push_str(&format!(
                        "INSERT INTO items (id, {}) VALUES ({}, {});",
                        names.join(", "),
                        self.next_id,
                        values.join(", ")
                    ));
                    self.next_id += 1;
                }
                4..9 => {
                    let i = live[self.rng.random_range(0..live.len())];
                    let value = self.columns[i].kind.value(&mut self.rng, &self.moods);
                    sql.push_str(&format!(
                        "UPDATE items SET {} = {value} WHERE id = {pick};",
                        self.columns[i].name
                    ));
                }
                _ => sql.push_str(&format!("DELETE FROM items WHERE id = {pick};")),
            }
        }
        sql.push_str("COMMIT;");
        self.db.exec(&sql).await;
    }

    /// One random ALTER, its writes before and after.
    async fn alter(&mut self, forced: Option<u32>) {
        self.write().await;
        let names = self
            .live()
            .into_iter()
            .map(|i| (i, self.columns[i].name.clone()))
            .collect();
        self.eras.push((self.audit_seq().await, names));
        let live = self.live();
        let i = live[self.rng.random_range(0..live.len())];
        let name = self.columns[i].name.clone();
        let kind = self.columns[i].kind;
        let sql = match forced.unwrap_or_else(|| self.rng.random_range(0..10)) {
            0 | 1 => {
                let new = self.fresh_name();
                self.columns[i].name = new.clone();
                format!("ALTER TABLE items RENAME COLUMN {name} TO {new}")
            }
            2 => {
                let new = self.fresh_name();
                let kinds = [
                    Kind::Int,
                    Kind::Text,
                    Kind::Numeric(8, 2),
                    Kind::IntList,
                    Kind::Mood,
                ];
                let kind = kinds[self.rng.random_range(0..kinds.len())];
                let default = match self.rng.random_bool(0.5) {
                    true => format!(" DEFAULT {}", kind.value(&mut self.rng, &self.moods)),
                    false => String::new(),
                };
                self.columns.push(Column {
                    name: new.clone(),
                    kind,
                    field: None,
                    retyped: false,
                });
                format!("ALTER TABLE items ADD COLUMN {new} {}{default}", kind.sql())
            }
            3 if live.len() > 1 => {
                self.dropped.push(i);
                format!("ALTER TABLE items DROP COLUMN {name}")
            }
            4 => {
                let wider = match kind {
                    Kind::Int => Kind::BigInt,
                    Kind::Numeric(p, s) => Kind::Numeric(p + 2, s),
                    other => other,
                };
                self.columns[i].kind = wider;
                format!("ALTER TABLE items ALTER COLUMN {name} TYPE {}", wider.sql())
            }
            5 => {
                let other = match kind {
                    Kind::Numeric(p, s) => Kind::Numeric(p + 1, s + 1),
                    _ => Kind::Text,
                };
                if other != kind {
                    self.columns[i].kind = other;
                    self.columns[i].retyped = true;
                    self.columns[i].field = None;
                }
                format!("ALTER TABLE items ALTER COLUMN {name} TYPE {}", other.sql())
            }
            6 => format!(
                "ALTER TABLE items ALTER COLUMN {name} {}",
                ["DROP NOT NULL", "SET DEFAULT NULL", "DROP DEFAULT"][self.rng.random_range(0..3)]
            ),
            7 => format!(
                "ALTER TABLE items REPLICA IDENTITY {}",
                ["FULL", "DEFAULT"][self.rng.random_range(0..2)]
            ),
            // The primary key, between `id` and `(id, k)`; `k` is left
            // out of the scenario's columns, whose writes leave it alone.
            8 => {
                self.composite_key = !self.composite_key;
                let key = ["id", "id, k"][usize::from(self.composite_key)];
                format!("ALTER TABLE items DROP CONSTRAINT items_pkey, ADD PRIMARY KEY ({key})")
            }
            _ => {
                let value = format!("m{}", self.moods.len());
                self.moods.push(value.clone());
                format!("ALTER TYPE mood ADD VALUE '{value}'")
            }
        };
        println!("ALTER {sql}");
        self.db.exec(&sql).await;
        self.alters += 1;
        self.write().await;
    }

    /// Bronze's field ids, by the columns' current names: each column
    /// keeps the one it had, a retyped one's old field keeps its id under
    /// the retired name.
    async fn check_field_ids(&mut self) {
        let schema = pyiceberg(self.lake.path(), BRONZE, "schema").await;
        for i in self.live() {
            let column = &mut self.columns[i];
            let id = schema["ids"][&column.name].as_i64();
            assert!(id.is_some(), "{} is in bronze: {schema}", column.name);
            match column.field {
                None => column.field = id,
                Some(field) => assert_eq!(
                    id,
                    Some(field),
                    "{} keeps its field id: {schema}",
                    column.name
                ),
            }
        }
    }
}

/// Whether two values are the same, numbers by their value.
fn same(lake: &Value, audited: &Value) -> bool {
    let number = |v: &Value| match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse::<f64>().ok(),
        _ => None,
    };
    match (lake, audited) {
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::String(a), Value::String(b)) => a == b,
        _ => lake == audited || (number(lake).is_some() && number(lake) == number(audited)),
    }
}

#[tokio::test]
async fn a_seeded_random_sequence_of_alters_under_writes_never_stops_a_run_and_loses_nothing() {
    let seed = std::env::var(SEED)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    scenario(seed).await;
}

/// A seed CI met: a column with a default added (which resyncs silver)
/// just before another column's numeric scale changed, so the resync's
/// snapshot was ahead of bronze's stream by a retype; bronze's copy of
/// the resync's rows then lost that column's values (docs/tables.md,
/// Schema changes: a column retyped ahead of bronze's stream).
#[tokio::test]
async fn a_resync_ahead_of_bronze_by_a_retype_keeps_the_columns_values_in_bronze() {
    scenario(10_825_685_706_631_488_913).await;
}

/// A seed CI met: a primary key widened to a column while a retype's
/// resync was pending; the resync's snapshot keyed silver by the new key,
/// and the changes bronze then took alone, from before the key had that
/// column, were told apart by silver's key and stopped the run.
#[tokio::test]
async fn changes_bronze_takes_alone_are_told_apart_by_their_own_key_not_silvers_newer_one() {
    scenario(13_496_065_753_142_525_062).await;
}

async fn scenario(seed: u64) {
    println!("DDL scenario: seed {seed} ({SEED}={seed} repeats it)");
    let mut s = Scenario::new(seed).await;
    s.ends_well(s.command("2s").spawn().unwrap()).await;
    s.check_field_ids().await;

    for round in 0..6 {
        println!("ROUND {round}");
        match round {
            // While a run streams.
            1 | 2 | 5 => {
                let mut child = s.command("6s").spawn().unwrap();
                if let Some(status) = s.streaming(&mut child).await {
                    panic!("a run exited ({status}) before it streamed: {}", s.log());
                }
                for _ in 0..4 {
                    s.alter(None).await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                s.ends_well(child).await;
            }
            // A run that dies between the schema changes of the two tables
            // of an added column; the next one finishes the job.
            3 => {
                let mut child = s
                    .command("6s")
                    .arg("--atomic-commits=false")
                    .env(wal2iceberg::failpoint::VARIABLE, "mid-schema-change:1")
                    .spawn()
                    .unwrap();
                // A schema change left from before (a reload's at start)
                // may meet the failpoint before the stream does.
                let status = match s.streaming(&mut child).await {
                    Some(status) => status,
                    None => {
                        s.alter(Some(2)).await;
                        let out = tokio::time::timeout(
                            Duration::from_secs(120),
                            child.wait_with_output(),
                        )
                        .await
                        .expect("the run reached the failpoint")
                        .unwrap();
                        out.status
                    }
                };
                assert!(
                    !status.success() && s.log().contains("failpoint mid-schema-change reached"),
                    "the run crashed at the failpoint: {}",
                    s.log()
                );
                for _ in 0..3 {
                    s.alter(None).await;
                }
                s.ends_well(s.command("3s").spawn().unwrap()).await;
            }
            // While none does.
            _ => {
                for _ in 0..4 {
                    s.alter(None).await;
                }
                s.ends_well(s.command("3s").spawn().unwrap()).await;
            }
        }
        s.check_field_ids().await;
    }
    assert!(s.alters >= 20);

    let verified = verify_lake(&s.db, &s.slot, s.lake.path(), "public.items").await;
    assert!(
        verified.status.success(),
        "verify: {}\n{}\nthe runs logged:\n{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr),
        s.log()
    );
    assert_reconciled(&s.db, "items", s.lake.path(), SILVER).await;

    // Bronze's changes are the audit's, in order, each column's value
    // under its current name (a retyped column's history is split, a
    // dropped one's is under its last name: both left out here).
    let rows = pyiceberg(s.lake.path(), BRONZE, "rows").await;
    let changes: Vec<&Value> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] != "r")
        .collect();
    let audit: Vec<(i64, String, Option<Value>)> =
        s.db.client
            .query("SELECT seq, op, new::text FROM audit ORDER BY seq", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| {
                let new: Option<String> = r.get(2);
                (
                    r.get(0),
                    r.get(1),
                    new.map(|t| serde_json::from_str(&t).unwrap()),
                )
            })
            .collect();
    assert_eq!(
        changes.len(),
        audit.len(),
        "one bronze change per audited one"
    );
    for (k, (row, (seq, op, new))) in changes.iter().zip(&audit).enumerate() {
        assert_eq!(row["_cdc_op"], op.as_str(), "change {k}");
        let Some(new) = new else {
            continue;
        };
        // The names of the era the change was written in: before the
        // first ALTER after it, or the last ones.
        let current: HashMap<usize, String> = s
            .live()
            .into_iter()
            .map(|i| (i, s.columns[i].name.clone()))
            .collect();
        let names = s
            .eras
            .iter()
            .find(|(at, _)| at >= seq)
            .map_or(&current, |(_, names)| names);
        for (&i, then) in names {
            let column = &s.columns[i];
            if column.retyped || s.dropped.contains(&i) {
                continue;
            }
            assert!(
                same(&row[&column.name], &new[then]),
                "change {k} ({op}), column {then} now {}: lake {} audit {} (seed {seed})",
                column.name,
                row[&column.name],
                new[then]
            );
        }
        assert_eq!(row["id"], new["id"], "change {k}");
    }
}
