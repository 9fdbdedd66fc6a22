//! A seeded random sequence of ALTER TABLEs under writes: some while a run
//! streams, some while none does, one with a run that crashes between the
//! schema changes of bronze and silver. A writer of its own keeps changing
//! rows on another connection the whole time, pausing only for the
//! instant of each ALTER, so each change is known to come before or after
//! it. Every streaming run is still running when its round's ALTERs are
//! done, and ends on its own only when idle; at the end `verify` passes,
//! silver equals the source, bronze holds every audited change, value by
//! value and before image by before image, each column's values in the
//! field that held it then (`bronze.rs`), and each column keeps the field
//! id it had (docs/tables.md, Schema changes). `DDL_SCENARIO_SEED` repeats
//! a seed.

mod bronze;
mod writer;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::process::{Child, Command};
use tokio::sync::RwLock;

use crate::support::*;
use writer::Writer;

const SILVER: &str = "shop.items";
/// Repeats a scenario. Not under `WAL2ICEBERG_`, which the binary
/// reserves for its settings.
const SEED: &str = "DDL_SCENARIO_SEED";
const BRONZE: &str = "shop.items_changes";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    SmallInt,
    Int,
    BigInt,
    Real,
    Double,
    Text,
    Varchar(u8),
    Numeric(u8, u8),
    IntList,
    Mood,
}

impl Kind {
    fn sql(self) -> String {
        match self {
            Kind::SmallInt => "int2".into(),
            Kind::Int => "int".into(),
            Kind::BigInt => "bigint".into(),
            Kind::Real => "float4".into(),
            Kind::Double => "float8".into(),
            Kind::Text => "text".into(),
            Kind::Varchar(n) => format!("varchar({n})"),
            Kind::Numeric(p, s) => format!("numeric({p},{s})"),
            Kind::IntList => "int[]".into(),
            Kind::Mood => "mood".into(),
        }
    }

    fn value(self, rng: &mut impl Rng, moods: &[String]) -> String {
        match self {
            Kind::SmallInt => rng.random_range(-1000..1000).to_string(),
            Kind::Int => rng.random_range(-100_000..100_000).to_string(),
            Kind::BigInt => rng.random_range(-(1i64 << 40)..(1i64 << 40)).to_string(),
            // Quarters: exact in a float4 and in JSON.
            Kind::Real | Kind::Double => {
                format!("{}", f64::from(rng.random_range(-400..400)) / 4.0)
            }
            Kind::Text => format!("'v{}'", rng.random_range(0..10_000)),
            Kind::Varchar(_) => format!("'w{}'", rng.random_range(0..1000)),
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

    /// The kind Iceberg holds it as: a change of it is no promotion.
    fn iceberg(self) -> String {
        match self {
            Kind::SmallInt | Kind::Int => "int".into(),
            Kind::BigInt => "long".into(),
            Kind::Real => "float".into(),
            Kind::Double => "double".into(),
            Kind::Text | Kind::Varchar(_) | Kind::Mood => "string".into(),
            Kind::Numeric(_, s) => format!("decimal(_, {s})"),
            Kind::IntList => "list".into(),
        }
    }

    /// The type a promotion widens it to (itself when none).
    fn wider(self) -> Kind {
        match self {
            Kind::SmallInt => Kind::Int,
            Kind::Int => Kind::BigInt,
            Kind::Real => Kind::Double,
            Kind::Varchar(n) => Kind::Varchar(n + 10),
            Kind::Numeric(p, s) => Kind::Numeric(p + 2, s),
            other => other,
        }
    }
}

/// A source column, as the scenario changed it.
#[derive(Clone, Debug)]
struct Column {
    name: String,
    /// Every name it had, the first first: the scenario never gives a
    /// name twice.
    names: Vec<String>,
    kind: Kind,
    /// Bronze's field id for it and silver's, once a run made them;
    /// `None` again after a retype gave it new fields.
    field: [Option<i64>; 2],
    /// The audit seq before each retype that gave it a new field.
    retypes: Vec<i64>,
}

impl Column {
    fn new(name: String, kind: Kind) -> Column {
        Column {
            names: vec![name.clone()],
            name,
            kind,
            field: [None; 2],
            retypes: Vec::new(),
        }
    }

    fn rename(&mut self, new: &str) {
        self.name = new.to_owned();
        self.names.push(new.to_owned());
    }
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
    dropped: Vec<usize>,
    alters: usize,
    /// Whether the primary key is `(id, k)` now, else `(id)`.
    composite_key: bool,
    /// The audit seq before each change of the replica identity, and
    /// whether it became FULL.
    identities: Vec<(i64, bool)>,
    /// ReplicatedTable by the writer for each of its transactions, and by the
    /// scenario for each ALTER and while a run idles out.
    gate: Arc<RwLock<()>>,
}

/// Each change with its transaction's id as pgoutput sends it (32 bits):
/// bronze's order of transactions is their commit order.
const AUDIT: &str = "
    CREATE TABLE audit(seq bigserial PRIMARY KEY, op text NOT NULL, old jsonb, new jsonb,
      xid bigint NOT NULL DEFAULT txid_current() % 4294967296);
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
               d int2, e float4, f varchar(6), k int NOT NULL DEFAULT 0);
             INSERT INTO items SELECT i, i, 'b' || i, i / 4.0, i, i / 4.0, 'f' || i, i % 3
               FROM generate_series(1, 500) i;
             {AUDIT}"
        ))
        .await;
        let column = |name: &str, kind| Column::new(name.into(), kind);
        Scenario {
            db,
            lake: tempfile::tempdir().unwrap(),
            slot: unique("ddl"),
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            columns: vec![
                column("a", Kind::Int),
                column("b", Kind::Text),
                column("c", Kind::Numeric(10, 2)),
                column("d", Kind::SmallInt),
                column("e", Kind::Real),
                column("f", Kind::Varchar(6)),
            ],
            moods: vec!["happy".into(), "sad".into()],
            next_id: 501,
            next_name: 0,
            dropped: Vec::new(),
            alters: 0,
            composite_key: false,
            identities: Vec::new(),
            gate: Arc::new(RwLock::new(())),
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

    /// Waits for `child`, a run, to end on its own once idle, the writer
    /// held meanwhile.
    async fn ends_well(&self, child: Child) {
        let _quiet = self.gate.write().await;
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

    /// One random ALTER, its writes before and after; the writer waits
    /// while it lands.
    async fn alter(&mut self, forced: Option<u32>) {
        self.write().await;
        let gate = self.gate.clone();
        let _alone = gate.write().await;
        let before = self.audit_seq().await;
        let live = self.live();
        let i = live[self.rng.random_range(0..live.len())];
        let name = self.columns[i].name.clone();
        let kind = self.columns[i].kind;
        let sql = match forced.unwrap_or_else(|| self.rng.random_range(0..10)) {
            0 | 1 => {
                let new = self.fresh_name();
                self.columns[i].rename(&new);
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
                    Kind::SmallInt,
                    Kind::Real,
                ];
                let kind = kinds[self.rng.random_range(0..kinds.len())];
                let default = match self.rng.random_range(0..3) {
                    0 => format!(" DEFAULT {}", kind.value(&mut self.rng, &self.moods)),
                    // A volatile default: PostgreSQL rewrites the table.
                    1 if kind == Kind::Int => " DEFAULT (random() * 1000)::int".to_owned(),
                    _ => String::new(),
                };
                self.columns.push(Column::new(new.clone(), kind));
                format!("ALTER TABLE items ADD COLUMN {new} {}{default}", kind.sql())
            }
            3 if live.len() > 1 => {
                self.dropped.push(i);
                format!("ALTER TABLE items DROP COLUMN {name}")
            }
            4 => {
                self.columns[i].kind = kind.wider();
                format!(
                    "ALTER TABLE items ALTER COLUMN {name} TYPE {}",
                    kind.wider().sql()
                )
            }
            5 => {
                let other = match kind {
                    Kind::Numeric(p, s) => Kind::Numeric(p + 1, s + 1),
                    _ => Kind::Text,
                };
                if other.iceberg() != kind.iceberg() {
                    self.columns[i].retypes.push(before);
                    self.columns[i].field = [None; 2];
                }
                self.columns[i].kind = other;
                format!("ALTER TABLE items ALTER COLUMN {name} TYPE {}", other.sql())
            }
            6 => {
                let change = match self.rng.random_range(0..4) {
                    // `k` is never null; a key column cannot drop NOT NULL.
                    0 => "k SET NOT NULL".to_owned(),
                    1 if !self.composite_key => "k DROP NOT NULL".to_owned(),
                    2 => format!("{name} SET DEFAULT NULL"),
                    _ => format!("{name} DROP DEFAULT"),
                };
                format!("ALTER TABLE items ALTER COLUMN {change}")
            }
            7 => {
                let full = self.rng.random_bool(0.5);
                self.identities.push((before, full));
                format!(
                    "ALTER TABLE items REPLICA IDENTITY {}",
                    ["DEFAULT", "FULL"][usize::from(full)]
                )
            }
            // The primary key, between `id` and `(id, k)`; `k` is left
            // out of the scenario's columns: only the writer changes it.
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
        drop(_alone);
        self.write().await;
    }

    /// Bronze's and silver's field ids, by the columns' current names,
    /// read by pyiceberg: each column keeps the one it had across renames
    /// and promotions (a retyped one's old field in bronze keeps its id
    /// under the retired name).
    async fn check_field_ids(&mut self) {
        for (t, table) in [BRONZE, SILVER].into_iter().enumerate() {
            let schema = pyiceberg(self.lake.path(), table, "schema").await;
            for i in self.live() {
                let column = &mut self.columns[i];
                let id = schema["ids"][&column.name].as_i64();
                assert!(id.is_some(), "{} is in {table}: {schema}", column.name);
                match column.field[t] {
                    None => column.field[t] = id,
                    Some(field) => assert_eq!(
                        id,
                        Some(field),
                        "{} keeps its field id in {table}: {schema}",
                        column.name
                    ),
                }
            }
        }
    }
}

/// How many fresh seeds the seeded test tries when `DDL_SCENARIO_SEED`
/// names none; `DDL_SCENARIO_RUNS` sets another number.
const FRESH_SEEDS: usize = 2;

#[tokio::test]
async fn a_seeded_random_sequence_of_alters_under_writes_never_stops_a_run_and_loses_nothing() {
    if let Some(seed) = std::env::var(SEED).ok().and_then(|s| s.parse().ok()) {
        return scenario(seed).await;
    }
    let runs = std::env::var("DDL_SCENARIO_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(FRESH_SEEDS);
    for _ in 0..runs {
        scenario(rand::random()).await;
    }
}

/// The seed that stopped a run in session 30: a primary key changed from
/// (id, k) to (id), k made nullable, then (id, k) again, with a restart
/// whose replay met the changes of (id) while the catalog said (id, k):
/// a DELETE's key-only image lacked k.
#[tokio::test]
async fn a_primary_key_changed_and_changed_back_before_a_restart_is_followed_in_the_replay() {
    scenario(9_106_524_099_863_057_726).await;
}

async fn scenario(seed: u64) {
    println!("DDL scenario: seed {seed} ({SEED}={seed} repeats it)");
    let mut s = Scenario::new(seed).await;
    s.ends_well(s.command("2s").spawn().unwrap()).await;
    s.check_field_ids().await;
    let writer = Writer::start(&s.db, s.gate.clone(), seed ^ 1).await;

    for round in 0..6 {
        println!("ROUND {round}");
        match round {
            // While a run streams, which is still running when they are
            // done.
            1 | 2 | 5 => {
                let mut child = s.command("6s").spawn().unwrap();
                if let Some(status) = s.streaming(&mut child).await {
                    panic!("a run exited ({status}) before it streamed: {}", s.log());
                }
                for _ in 0..4 {
                    s.alter(None).await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("a run exited ({status}) amid the ALTERs: {}", s.log());
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
    let written = writer.stop().await;
    assert!(written > 0, "the writer wrote beside the ALTERs");
    // What the writer wrote last.
    s.ends_well(s.command("3s").spawn().unwrap()).await;

    let verified = verify_lake(&s.db, &s.slot, s.lake.path(), "public.items").await;
    assert!(
        verified.status.success(),
        "verify: {}\n{}\nthe runs logged:\n{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr),
        s.log()
    );
    assert_reconciled(&s.db, "items", s.lake.path(), SILVER).await;
    bronze::assert_holds_the_audit(&s, seed).await;
}
