//! The crash-safety oracle (docs/reliability.md). A trigger writes every
//! change of the replicated table `accounts` into an audit table that is
//! not published; a randomized workload writes while `wal2iceberg run` is
//! crashed, killed, cut off or starved in some way. Afterwards silver must
//! equal the source (read through pyiceberg) and bronze must hold every
//! audited change exactly once, in order, with the same values.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use wal2iceberg::lake::catalog::{CatalogChoice, Lake, LakeLocation, namespace};
use wal2iceberg::lake::files::writer::Position;
use wal2iceberg::pg::source::SourceClient;

use super::readers::RemoteLake;
use super::reconcile::assert_reconciled_through;
use super::{TestDb, assert_success, config_for, unique};

const SCHEMA: &str = "
    CREATE TABLE accounts(id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL, note text);
    ALTER TABLE accounts ALTER COLUMN note SET STORAGE EXTERNAL;
    CREATE TABLE audit(seq bigserial PRIMARY KEY, op text NOT NULL, old jsonb, new jsonb);
    -- An update is recorded before it happens: one that moves a row to
    -- another partition reaches the AFTER triggers as a delete and an
    -- insert (CREATE TRIGGER), which the statement's list of updates,
    -- `(old id>new id)`, then tells from a delete and an insert.
    CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      updates text := coalesce(current_setting('audit.updates', true), '');
    BEGIN
      IF TG_WHEN = 'BEFORE' THEN
        INSERT INTO audit(op, old, new) VALUES ('u', to_jsonb(OLD), to_jsonb(NEW));
        PERFORM set_config('audit.updates', updates || format('(%s>%s)', OLD.id, NEW.id), true);
        RETURN NEW;
      ELSIF TG_OP = 'UPDATE' THEN
        PERFORM set_config('audit.updates', replace(updates, format('(%s>%s)', OLD.id, NEW.id), ''), true);
      ELSIF TG_OP = 'DELETE' AND strpos(updates, format('(%s>', OLD.id)) > 0 THEN
        NULL;
      ELSIF TG_OP = 'INSERT' AND strpos(updates, format('>%s)', NEW.id)) > 0 THEN
        PERFORM set_config('audit.updates', regexp_replace(updates, format('\\(-?\\d+>%s\\)', NEW.id), ''), true);
      ELSE
        INSERT INTO audit(op, old, new) VALUES (
          CASE TG_OP WHEN 'INSERT' THEN 'c' ELSE 'd' END,
          CASE WHEN TG_OP = 'DELETE' THEN to_jsonb(OLD) END,
          CASE WHEN TG_OP = 'INSERT' THEN to_jsonb(NEW) END);
      END IF;
      RETURN NULL;
    END $$;
    CREATE FUNCTION audit_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO audit(op) VALUES ('t');
      RETURN NULL;
    END $$;";

/// `accounts` as a partitioned table, at two levels and with a default
/// partition; the workload's key updates move rows between partitions.
/// [`SCHEMA`] with this in place of its `accounts`.
const PARTITIONED_ACCOUNTS: &str = "
    CREATE TABLE accounts(id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL, note text)
      PARTITION BY RANGE (id);
    CREATE TABLE accounts_low PARTITION OF accounts FOR VALUES FROM (MINVALUE) TO (300)
      PARTITION BY HASH (id);
    CREATE TABLE accounts_low_0 PARTITION OF accounts_low FOR VALUES WITH (MODULUS 2, REMAINDER 0);
    CREATE TABLE accounts_low_1 PARTITION OF accounts_low FOR VALUES WITH (MODULUS 2, REMAINDER 1);
    CREATE TABLE accounts_mid PARTITION OF accounts FOR VALUES FROM (300) TO (2000);
    CREATE TABLE accounts_rest PARTITION OF accounts DEFAULT;";

/// The triggers go on after the rows of the initial load are in: the load
/// is checked by count, the audit holds only what the stream must carry.
const TRIGGERS: &str = "
    CREATE TRIGGER accounts_audit AFTER INSERT OR UPDATE OR DELETE ON accounts
      FOR EACH ROW EXECUTE FUNCTION audit_row();
    CREATE TRIGGER accounts_audit_update BEFORE UPDATE ON accounts
      FOR EACH ROW EXECUTE FUNCTION audit_row();
    CREATE TRIGGER accounts_truncate AFTER TRUNCATE ON accounts
      FOR EACH STATEMENT EXECUTE FUNCTION audit_truncate();";

/// The namespace the runs write to.
pub const NAMESPACE: &str = "shop";

/// One random transaction of the workload; with `truncates`, one in a
/// hundred is a TRUNCATE. With a `focus`, half its picks of a row take one
/// of the thousand keys after it.
fn transaction(rng: &mut impl Rng, next_id: &mut i64, truncates: bool, focus: i64) -> String {
    let mut statement = |rng: &mut dyn rand::RngCore| -> String {
        let pick = match focus > 0 && rng.random_bool(0.5) {
            true => format!(
                "(SELECT id FROM accounts WHERE id > {} ORDER BY id LIMIT 1)",
                focus + rng.random_range(0..1000)
            ),
            false => "(SELECT id FROM accounts ORDER BY random() LIMIT 1)".to_owned(),
        };
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
        _ if truncates => "TRUNCATE accounts;".to_owned(),
        _ => statement(rng),
    };
    format!("BEGIN; {body} COMMIT;")
}

/// Writes random transactions until stopped, on a connection of its own.
/// A lost connection (a server restart) is opened again and the workload
/// goes on: whether the interrupted transaction committed does not matter,
/// since the audit, not the workload, is the record. Returns the next
/// unused id.
async fn workload(
    url: String,
    stop: Arc<AtomicBool>,
    commits: Arc<AtomicU64>,
    seed: u64,
    mut next_id: i64,
    truncates: bool,
    focus: Arc<AtomicI64>,
) -> i64 {
    let config = config_for(&url);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut client = SourceClient::connect(&config).await.expect("connect");
    while !stop.load(Ordering::Relaxed) {
        match client
            .batch_execute(&transaction(
                &mut rng,
                &mut next_id,
                truncates,
                focus.load(Ordering::Relaxed),
            ))
            .await
        {
            Ok(()) => {
                commits.fetch_add(1, Ordering::Relaxed);
            }
            // A lost connection, or the server shutting down (57P01-57P03).
            Err(e)
                if e.is_closed()
                    || e.as_db_error()
                        .is_none_or(|d| d.code().code().starts_with("57P")) =>
            {
                let give_up = std::time::Instant::now() + Duration::from_secs(60);
                client = loop {
                    match SourceClient::connect(&config).await {
                        Ok(c) => break c,
                        Err(e) => {
                            assert!(std::time::Instant::now() < give_up, "reconnect: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                };
            }
            Err(e) => panic!("workload transaction failed: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
    next_id
}

struct Workload {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<i64>,
}

/// Where a lake other than the embedded one is, as a run's settings.
#[derive(Debug, Default)]
pub struct RemoteSettings {
    /// `--catalog-type`, where the URI does not tell it.
    pub catalog_type: Option<&'static str>,
    pub catalog_uri: Option<String>,
    pub warehouse: Option<String>,
    /// `key=value` catalog properties.
    pub properties: Vec<String>,
}

impl RemoteSettings {
    fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if let Some(kind) = self.catalog_type {
            flags.extend(["--catalog-type".to_owned(), kind.to_owned()]);
        }
        for (flag, value) in [
            ("--catalog-uri", &self.catalog_uri),
            ("--warehouse", &self.warehouse),
        ] {
            if let Some(value) = value {
                flags.extend([flag.to_owned(), value.clone()]);
            }
        }
        for property in &self.properties {
            flags.extend(["--catalog-property".to_owned(), property.clone()]);
        }
        flags
    }
}

/// One scenario's source database, lake and slot.
pub struct Oracle {
    pub db: TestDb,
    pub lake: tempfile::TempDir,
    pub slot: String,
    /// Rows in the table before the first run: bronze must hold them
    /// once, as its initial load.
    initial_rows: u64,
    workload: Option<Workload>,
    next_id: i64,
    seed: u64,
    commits: Arc<AtomicU64>,
    /// Values that replace those of [`Self::run_args`], by flag.
    settings: Vec<(&'static str, String)>,
    /// Whether a resync reloaded the table: bronze then also holds the
    /// reload's reads, which the audit knows nothing of.
    pub reloaded: bool,
    /// A lake other than the embedded one, and the readers' settings for
    /// it (tests/support/lake_catalog.py).
    remote: RemoteSettings,
    readers: Vec<(&'static str, String)>,
    /// Flags every run gets after [`Self::run_args`]'.
    run_flags: Vec<String>,
    /// Environment every run gets (failpoint stalls).
    run_env: Vec<(&'static str, String)>,
    /// The table is loaded by the chunked backfill: its reads come
    /// among the changes, one per key read, and the workload truncates
    /// nothing (a TRUNCATE would leave no row to read).
    chunked: bool,
    /// A key the workload's picks favour the keys after, 0 for none: a
    /// test points it where a backfill reads.
    pub focus: Arc<AtomicI64>,
}

impl Oracle {
    /// A scenario in a new database of the shared server.
    pub async fn new(initial_rows: u64) -> Oracle {
        Oracle::in_db(TestDb::new().await, initial_rows).await
    }

    /// A scenario whose `accounts` is partitioned ([`PARTITIONED_ACCOUNTS`]).
    pub async fn partitioned(initial_rows: u64) -> Oracle {
        let (_, rest) = SCHEMA
            .split_once("note text);")
            .expect("SCHEMA creates accounts first");
        Oracle::with_schema(
            TestDb::new().await,
            &format!("{PARTITIONED_ACCOUNTS}{rest}"),
            initial_rows,
        )
        .await
    }

    /// A scenario in `db`, whose table starts with `initial_rows` rows.
    pub async fn in_db(db: TestDb, initial_rows: u64) -> Oracle {
        Oracle::with_schema(db, SCHEMA, initial_rows).await
    }

    async fn with_schema(db: TestDb, schema: &str, initial_rows: u64) -> Oracle {
        db.exec(schema).await;
        db.exec(&format!(
            "INSERT INTO accounts SELECT i, 'owner ' || i, i, NULL FROM generate_series(1, {initial_rows}) i;"
        ))
        .await;
        db.exec(TRIGGERS).await;
        Oracle {
            db,
            lake: tempfile::tempdir().expect("lake folder"),
            slot: unique("oracle"),
            initial_rows,
            workload: None,
            next_id: i64::try_from(initial_rows).unwrap() + 1_000,
            seed: 42,
            commits: Arc::new(AtomicU64::new(0)),
            settings: Vec::new(),
            reloaded: false,
            remote: RemoteSettings::default(),
            readers: Vec::new(),
            run_flags: Vec::new(),
            run_env: Vec::new(),
            chunked: false,
            focus: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Runs from now on load the table by the chunked backfill
    /// (docs/backfill.md), `chunk_rows` rows a chunk, each chunk's read
    /// waiting about `read_wait` (none to twice it, at random) between taking its snapshot and reading
    /// (`chunk-read`, src/failpoint.rs), so that the workload's changes
    /// fall inside chunks' windows after their snapshots. The table and
    /// its partitions get `REPLICA IDENTITY FULL`, which its out-of-line
    /// `note` needs for that.
    pub async fn load_in_chunks(&mut self, chunk_rows: u64, read_wait: Duration) {
        self.db
            .exec(
                "ALTER TABLE accounts REPLICA IDENTITY FULL;
                 DO $$ DECLARE r record; BEGIN
                   FOR r IN SELECT relid FROM pg_partition_tree('accounts') LOOP
                     EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', r.relid::regclass);
                   END LOOP;
                 END $$",
            )
            .await;
        self.run_flags.extend([
            "--backfill".to_owned(),
            "chunked".to_owned(),
            "--backfill-chunk-rows".to_owned(),
            chunk_rows.to_string(),
        ]);
        self.run_env.extend([
            (
                wal2iceberg::failpoint::STALL_VARIABLE,
                format!("chunk-read:~{}", read_wait.as_millis()),
            ),
            // Each chunk's line, which the checks read.
            (
                "RUST_LOG",
                "wal2iceberg=info,wal2iceberg::apply::backfill=debug,wal2iceberg::cdc::backfill=debug".to_owned(),
            ),
        ]);
        self.chunked = true;
    }

    /// Runs from now on commit table by table (`--atomic-commits=false`),
    /// for the crash points between two tables' commits.
    pub fn table_by_table(&mut self) {
        self.run_flags.push("--atomic-commits=false".to_owned());
    }

    /// Runs from now on stream large transactions (`--streaming`); the
    /// test server streams any transaction past 64 kB of changes.
    pub fn streaming(&mut self) {
        self.run_flags.push("--streaming".to_owned());
    }

    /// Runs from now on write the lake `remote` names, and the checks
    /// read it with the readers' settings `readers`.
    pub fn on_remote_lake(&mut self, remote: RemoteSettings, readers: Vec<(&'static str, String)>) {
        self.remote = remote;
        self.readers = readers;
    }

    /// A new connection for the checks, after the server restarted.
    pub async fn reconnect(&mut self) {
        self.db = TestDb::connect(self.db.config_url()).await;
    }

    /// `wal2iceberg run` on the scenario, flushing every 200 ms,
    /// compacting silver every third data file and then expiring all but
    /// the last three snapshots, so every scenario crosses compactions and
    /// expiries.
    pub fn run_args(&self) -> Vec<String> {
        let mut args = vec!["run".to_owned()];
        args.extend(self.place_args());
        args.extend(
            [
                "--tables",
                "public.accounts",
                "--flush-interval",
                "200ms",
                "--compact-after-files",
                "3",
                "--snapshot-retention",
                "0s",
                "--retain-snapshots",
                "3",
            ]
            .map(str::to_owned),
        );
        for (flag, value) in &self.settings {
            let at = args
                .iter()
                .position(|a| a == flag)
                .expect("a flag run_args gives");
            args[at + 1] = value.clone();
        }
        args.extend(self.run_flags.iter().cloned());
        args
    }

    /// Where the scenario's source, slot and lake are, as flags.
    pub fn place_args(&self) -> Vec<String> {
        [
            "--source",
            &self.db.config_url(),
            "--slot",
            &self.slot,
            "--lake",
            &self.lake.path().display().to_string(),
            "--namespace",
            NAMESPACE,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(self.remote.flags())
        .collect()
    }

    /// A second table, `other` with one row, that runs from now on capture
    /// beside `accounts`.
    pub async fn add_other_table(&mut self) {
        self.db
            .exec("CREATE TABLE other(id int PRIMARY KEY, v int); INSERT INTO other VALUES (1, 1);")
            .await;
        self.set("--tables", "public.accounts,public.other");
    }

    /// Runs from now on use `value` for `flag`, one of [`Self::run_args`].
    pub fn set(&mut self, flag: &'static str, value: &str) {
        self.settings.retain(|(f, _)| *f != flag);
        self.settings.push((flag, value.to_owned()));
    }

    /// The binary with [`Self::run_args`] and `extra`; warnings and errors
    /// go to `stderr`, which the caller chooses.
    pub fn command(&self, extra: &[&str]) -> Command {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("the runs' log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"));
        command
            .args(self.run_args())
            .args(extra)
            .env("RUST_LOG", "wal2iceberg=info")
            .envs(self.run_env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        command
    }

    /// Where the runs [`Self::command`] starts log, beside the lake.
    fn log_path(&self) -> std::path::PathBuf {
        self.lake.path().join("runs.log")
    }

    /// The last lines the runs logged, for a failure's message.
    pub fn run_log(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Starts a run to be killed later.
    pub fn spawn(&self) -> Child {
        self.command(&[]).spawn().expect("start wal2iceberg")
    }

    /// Starts a run that aborts at the `n`th time through failpoint
    /// `point` (src/failpoint.rs); [`Self::expect_crash`] waits for it.
    pub fn spawn_crashing_at(&self, point: &str, n: u32) -> Child {
        self.command(&[])
            .env(wal2iceberg::failpoint::VARIABLE, format!("{point}:{n}"))
            .stderr(Stdio::piped())
            .spawn()
            .expect("start wal2iceberg")
    }

    /// Waits for a run started by [`Self::spawn_crashing_at`] to die
    /// there.
    pub async fn expect_crash(&self, child: Child, point: &str) {
        let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("the run never reached failpoint {point}"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("failpoint {point} reached")),
            "the run ended otherwise: {stderr}"
        );
    }

    /// What each of the two tables holds, `None` for a table that does not
    /// exist or holds no initial load yet.
    pub async fn positions(&self) -> [Option<Position>; 2] {
        let mut held = [None, None];
        let choice = CatalogChoice {
            kind: self.remote.catalog_type,
            uri: self.remote.catalog_uri.as_deref(),
            warehouse: self.remote.warehouse.as_deref(),
            properties: &self.remote.properties,
            ..CatalogChoice::default()
        };
        let location =
            LakeLocation::configure(self.lake.path(), &choice).expect("the lake's place");
        let Ok(lake) = Lake::open_existing(&location).await else {
            return held;
        };
        for (slot, name) in held.iter_mut().zip(["accounts_changes", "accounts"]) {
            let ident = iceberg::TableIdent::new(namespace(NAMESPACE), name.into());
            if let Ok(Some(table)) = lake.table_if_exists(&ident).await {
                *slot = Position::of(&table).ok().flatten();
            }
        }
        held
    }

    /// Waits until both tables hold their initial load, failing at once
    /// when `run` exits first and after three minutes (a loaded CI
    /// machine's S3 server can be slow) otherwise.
    pub async fn wait_loaded(&self, run: &mut Child) {
        let give_up = std::time::Instant::now() + Duration::from_secs(180);
        while self.positions().await.iter().any(Option::is_none) {
            if let Some(status) = run.try_wait().expect("the run's status") {
                panic!(
                    "the run exited ({status}) before its initial load landed; it logged:\n{}",
                    self.run_log()
                );
            }
            assert!(
                std::time::Instant::now() < give_up,
                "the initial load never landed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts the random workload on a connection of its own.
    pub fn start_workload(&mut self) {
        assert!(self.workload.is_none(), "one workload at a time");
        let stop = Arc::new(AtomicBool::new(false));
        self.seed += 1;
        let handle = tokio::spawn(workload(
            self.db.config_url(),
            stop.clone(),
            self.commits.clone(),
            self.seed,
            self.next_id,
            !self.chunked,
            self.focus.clone(),
        ));
        self.workload = Some(Workload { stop, handle });
    }

    /// Stops the workload after its current transaction.
    pub async fn stop_workload(&mut self) {
        let workload = self.workload.take().expect("a workload runs");
        workload.stop.store(true, Ordering::Relaxed);
        self.next_id = workload.handle.await.expect("the workload");
    }

    /// A first run loads; then, while the workload runs from when the load
    /// landed, `kills` runs are killed with SIGKILL at random moments
    /// (100 ms to 1.5 s in, from `seed`).
    pub async fn kill_at_random(&mut self, kills: usize, seed: u64) {
        // The workload starts once the load landed, so that every audited
        // change must appear in bronze as a change (a table whose load a
        // kill interrupts is loaded again from a later snapshot, which then
        // holds the changes made before it).
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut child = self.spawn();
        self.wait_loaded(&mut child).await;
        self.start_workload();
        for kill in 0..kills {
            if kill > 0 {
                child = self.spawn();
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
            child.kill().await.unwrap();
        }
    }

    /// Transactions the workloads committed so far.
    pub fn transactions(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// A run until the stream has been quiet for `idle` (e.g. `3s`), or
    /// until it fails; its output, stderr included. A run still going after
    /// ten minutes fails the test rather than CI's whole time budget.
    pub async fn run_until_idle(&self, idle: &str) -> std::process::Output {
        let run = self
            .command(&["--exit-when-idle", idle])
            .stderr(Stdio::piped())
            .output();
        tokio::time::timeout(Duration::from_secs(600), run)
            .await
            .expect("the run was still going after ten minutes")
            .unwrap()
    }

    /// A run until the stream has been quiet for 3 s; it must succeed.
    pub async fn drain(&self) {
        assert_success(&self.run_until_idle("3s").await);
    }

    /// The usual end of a scenario: a run picks up while the workload goes
    /// on for a second and is killed, the workload stops, a last run
    /// drains the slot, and the check. A last insert after the workload
    /// keeps a row to compare even when its last transaction truncated.
    pub async fn finish(&mut self) -> (usize, u64) {
        let mut next = self.spawn();
        tokio::time::sleep(Duration::from_secs(1)).await;
        next.kill().await.unwrap();
        self.stop_workload().await;
        self.next_id += 1;
        let id = self.next_id;
        self.db
            .exec(&format!(
                "INSERT INTO accounts VALUES ({id}, 'last', 1, NULL)"
            ))
            .await;
        self.drain().await;
        self.check().await
    }

    /// Silver equals the source; bronze holds the initial load once and
    /// then every audited change once, in commit order, with its values.
    /// Returns (changes checked, live rows).
    pub async fn check(&self) -> (usize, u64) {
        let reader = RemoteLake::with_env(self.lake.path(), self.readers.clone());
        let digest = assert_reconciled_through(
            &self.db,
            "accounts",
            &reader,
            &format!("{NAMESPACE}.accounts"),
        )
        .await;
        // One writer connection at a time, so audit order is commit order.
        let audit: Vec<(String, Option<Value>, Option<Value>)> = self
            .db
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
        let bronze = reader
            .pyiceberg(&format!("{NAMESPACE}.accounts_changes"), "rows")
            .await;
        let rows = bronze.as_array().unwrap();
        let changes: Vec<Value> = match self.chunked {
            true => self.backfill_reads(rows, &audit),
            false => {
                // The load comes first, at the slot's consistent point; later
                // reads are rows of attached partitions, which the audit
                // records as `r`.
                let (load, changes) = rows.split_at(rows.len().min(self.initial_rows as usize));
                assert!(
                    load.len() as u64 == self.initial_rows
                        && load.iter().all(|r| r["_cdc_op"] == "r"),
                    "the initial load, once"
                );
                changes.to_vec()
            }
        };
        // A resync's reads, all at its snapshot's position, once (none
        // when the workload's TRUNCATE had left the table empty then).
        let (reads, changes): (Vec<&Value>, Vec<&Value>) = changes
            .iter()
            .partition(|r| self.reloaded && r["_cdc_op"] == "r");
        assert!(
            reads
                .iter()
                .all(|r| r["_cdc_commit_lsn"] == reads[0]["_cdc_commit_lsn"]),
            "one reload; the runs logged:\n{}",
            self.run_log()
        );
        let first_difference = changes
            .iter()
            .zip(&audit)
            .position(|(row, (op, ..))| row["_cdc_op"] != op.as_str());
        assert_eq!(
            changes.len(),
            audit.len(),
            "bronze has {} changes, the audit {} ({} transactions); the first op that differs: {:?}",
            changes.len(),
            audit.len(),
            self.transactions(),
            first_difference.map(|i| {
                let near = |n: usize| i.saturating_sub(3)..(i + 24).min(n);
                let bronze: Vec<String> = changes[near(changes.len())]
                    .iter()
                    .map(|r| format!("{} {} {}", r["_cdc_op"], r["id"], r["_cdc_seq"]))
                    .collect();
                let audited: Vec<String> = audit[near(audit.len())]
                    .iter()
                    .map(|(op, old, new)| {
                        let id = |v: &Option<Value>| v.as_ref().map(|v| v["id"].to_string());
                        format!("{op} {:?} {:?}", id(old), id(new))
                    })
                    .collect();
                (i, bronze, audited)
            })
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
            // A before image, when bronze has one, is of the row changed:
            // a moved row's is the key it moved from.
            if op == "u" && row["_cdc_before"].is_object() {
                assert_eq!(
                    row["_cdc_before"]["id"],
                    old.as_ref().unwrap()["id"],
                    "change {i} (u), its before image"
                );
            }
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
        (audit.len(), digest.rows)
    }
}

impl Oracle {
    /// Bronze's changes without the chunked backfill's reads, which come
    /// among them: at most one read of a key (two after a resync, one of
    /// each backfill), and one of every key of the first rows that no
    /// audited change touched (a key the workload changed before its chunk
    /// was read may be read once or never).
    fn backfill_reads(
        &self,
        rows: &[Value],
        audit: &[(String, Option<Value>, Option<Value>)],
    ) -> Vec<Value> {
        let (reads, changes): (Vec<&Value>, Vec<&Value>) =
            rows.iter().partition(|r| r["_cdc_op"] == "r");
        let mut read = std::collections::HashMap::<String, usize>::new();
        let most = 1 + usize::from(self.reloaded);
        for row in &reads {
            let times = read.entry(row["id"].to_string()).or_default();
            *times += 1;
            assert!(
                *times <= most,
                "key {} read {times} times; the runs logged:\n{}",
                row["id"],
                self.run_log()
            );
        }
        let mut touched = std::collections::HashSet::new();
        let mut truncated = false;
        for (op, old, new) in audit {
            truncated |= op == "t";
            for image in [old, new].into_iter().flatten() {
                touched.insert(image["id"].to_string());
            }
        }
        if !truncated {
            for id in 1..=self.initial_rows {
                let id = id.to_string();
                assert!(
                    touched.contains(&id) || read.contains_key(&id),
                    "key {id}, never changed, was never read; the runs logged:\n{}",
                    self.run_log()
                );
            }
        }
        changes.into_iter().cloned().collect()
    }
}

/// A number as the audit's JSON and pyiceberg's JSON both can write it.
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}
