//! `wal2iceberg run`: the pipeline. Change events are batched at
//! transaction boundaries and each batch becomes one bronze and one silver
//! snapshot per table; the slot is confirmed only once every table's
//! commits of the batch have landed.
//!
//! Exactly once: every snapshot records the highest source commit LSN it
//! fully contains. At start each table's recorded LSN is read back, and a
//! transaction at or below it is skipped for that table, so a crash between
//! the Iceberg commits and the confirmation replays nothing twice.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use futures_util::TryStreamExt;
use iceberg::TableIdent;
use tokio::time::Instant;

use super::monitor::{self, MonitorOptions};
use super::shutdown::Shutdown;
use crate::cdc::capture::{self, Capture, CaptureOptions, preflight_error};
use crate::cdc::event::{Change, Event, Op, TxInfo};
use crate::cdc::relation::RelationInfo;
use crate::cdc::snapshot::{LoadRows, SnapshotLoad};
use crate::cdc::stream::{ChangeStream, Next};
use crate::config::DEFAULT_RETAINED_WAL_WARN_BYTES;
use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;
use crate::lake::arrow::{Verbatim, load_columns};
use crate::lake::bronze::BronzeTable;
use crate::lake::catalog::{Lake, LakeLocation, namespace};
use crate::lake::compaction::{DEFAULT_AFTER_FILES, Merge, merge_small_files};
use crate::lake::evolve::{self, Mode};
use crate::lake::expire::{DEFAULT_RETENTION, Retention, expire_snapshots};
use crate::lake::gap::Gap;
use crate::lake::lock::WriterLock;
use crate::lake::schema::{
    HISTORY_ONLY, bronze_schema, has_silver, history_only, silver_schema, source_arrow_fields,
};
use crate::lake::silver::SilverTable;
use crate::lake::writer::{Position, summary_total};
use crate::metrics::{metrics, now_micros};
use crate::ops::{resync, table_set};
use crate::pg::config::PgConfig;
use crate::pg::lsn::Lsn;
use crate::pg::source::{self, SourceClient, TableName};

/// Flush a batch at least this often while changes arrive.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Flush once a batch holds this many changes (at the next transaction end).
pub const DEFAULT_MAX_BATCH_ROWS: usize = 100_000;
/// Flush once a batch holds about this many bytes of values.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 128 << 20;
/// Connections reading the initial load, when there are that many tables.
pub const DEFAULT_LOAD_CONNECTIONS: usize = 2;
/// Snapshots are expired at least this often, in silver commits.
pub const EXPIRE_EVERY_COMMITS: usize = 100;

pub struct RunOptions {
    pub capture: CaptureOptions,
    /// The embedded lake: its catalog file and warehouse.
    pub lake: LakeLocation,
    /// Iceberg namespace; the source database's name when unset.
    pub namespace: Option<String>,
    /// Iceberg names chosen for source tables instead of [`iceberg_name`].
    pub table_names: BTreeMap<TableName, String>,
    pub flush_interval: Duration,
    pub max_batch_rows: usize,
    pub max_batch_bytes: usize,
    /// Compact silver after a commit once this many data files were
    /// committed since its last compaction, or it holds this many delete
    /// files, and bronze every this many commits; 0 never
    /// (src/lake/compaction.rs, src/lake/silver/compaction.rs).
    pub compact_after_files: usize,
    /// Which snapshots the automatic expiry keeps; it runs for both tables
    /// of a source table after silver's compaction, and every
    /// [`EXPIRE_EVERY_COMMITS`] commits.
    pub retention: Retention,
    /// Drain, commit, confirm and return once no change came for this long.
    pub exit_when_idle: Option<Duration>,
    /// Heartbeat and retained-WAL warnings while streaming.
    pub heartbeat_interval: Option<Duration>,
    pub retained_wal_warn_bytes: u64,
    /// How often the slot's state is read for metrics and warnings.
    pub monitor_interval: Duration,
    /// Connections that read the initial load's tables in parallel, each a
    /// table at a time, all in the slot's snapshot.
    pub load_connections: usize,
    /// Stop at the next safe point once requested: commit the batch if it
    /// holds only complete transactions, abandon it (to be streamed again
    /// after a restart) if a transaction is still arriving.
    pub shutdown: Shutdown,
}

impl RunOptions {
    /// The defaults: namespace from the database, flush every second or
    /// at the batch limits, run until stopped.
    pub fn new(capture: CaptureOptions, lake: impl Into<LakeLocation>) -> RunOptions {
        RunOptions {
            capture,
            lake: lake.into(),
            namespace: None,
            table_names: BTreeMap::new(),
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            max_batch_rows: DEFAULT_MAX_BATCH_ROWS,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            compact_after_files: DEFAULT_AFTER_FILES,
            retention: DEFAULT_RETENTION,
            exit_when_idle: None,
            heartbeat_interval: None,
            retained_wal_warn_bytes: DEFAULT_RETAINED_WAL_WARN_BYTES,
            monitor_interval: monitor::DEFAULT_INTERVAL,
            load_connections: DEFAULT_LOAD_CONNECTIONS,
            shutdown: Shutdown::default(),
        }
    }
}

/// What a run did, for the caller to print.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub changes_applied: u64,
    pub batches: u64,
    /// The position the slot was left at.
    pub confirmed: Lsn,
}

/// The default Iceberg name of a source table: `customers` (and
/// `customers_changes`) for `public.customers`; `sales__orders` for
/// `sales.orders`. `table_names` in the settings can choose others.
pub fn iceberg_name(table: &TableName) -> String {
    if table.schema == "public" {
        table.name.clone()
    } else {
        format!("{}__{}", table.schema, table.name)
    }
}

/// The two Iceberg tables of one source table.
struct TableSink {
    /// The source table's columns as each table last followed them.
    bronze_relation: Option<Arc<RelationInfo>>,
    silver_relation: Option<Arc<RelationInfo>>,
    /// Silver asked to be reloaded for a schema change it cannot take in
    /// place, and takes no more changes until then.
    reloading: bool,
    bronze: BronzeTable,
    /// None for a table without a primary key: its history only.
    silver: Option<SilverTable>,
    /// What each table already holds; `None` until its initial load landed.
    bronze_at: Option<Position>,
    silver_at: Option<Position>,
    /// The request this start's load resyncs the table for.
    resync: Option<String>,
    /// The changes bronze took alone, silver being ahead of it.
    gap: Gap,
    /// Whether the open batch staged anything for each table.
    bronze_dirty: bool,
    silver_dirty: bool,
    /// The open batch's changes by op, for the metrics.
    ops: HashMap<&'static str, u64>,
    /// Silver commits since the last snapshot expiry, bronze commits since
    /// its last compaction.
    commits_since_expiry: usize,
    bronze_commits: usize,
}

impl TableSink {
    /// Takes up a schema change of the source table (docs/tables.md,
    /// Schema changes) in the tables that take a change or load row of
    /// `relation`, each in its mode: a table follows the relations of
    /// what it takes, never one of an earlier or later point. True when
    /// that asked for a resync.
    async fn follow(
        &mut self,
        lake: &Lake,
        relation: &Arc<RelationInfo>,
        bronze: Option<Mode>,
        silver: Option<Mode>,
    ) -> Result<bool> {
        let same = |followed: &Option<Arc<RelationInfo>>| {
            followed
                .as_ref()
                .is_some_and(|r| Arc::ptr_eq(r, relation) || r.columns == relation.columns)
        };
        let bronze = bronze.filter(|_| !same(&self.bronze_relation));
        let silver = silver.filter(|_| self.silver.is_some() && !same(&self.silver_relation));
        if bronze.is_none() && silver.is_none() {
            return Ok(false);
        }
        // The changes staged name their columns as the schema does now.
        if bronze.is_some() && self.bronze_relation.is_some() {
            self.bronze.write_staged(lake).await?;
        }
        if let Some(table) = self.silver.as_mut().filter(|_| silver.is_some()) {
            table.write_staged(lake).await?;
        }
        let bronze_table = self.bronze.table(lake).await?;
        let silver_table = match (&self.silver, silver) {
            (Some(table), Some(_)) => Some(table.table(lake).await?),
            _ => None,
        };
        let mut tables = Vec::new();
        tables.extend(bronze.map(|mode| (&bronze_table, mode)));
        tables.extend(silver_table.as_ref().zip(silver));
        let mut followed = evolve::follow(&tables, relation)?;
        // Staged, the updates land with the batch's rows or not at all.
        let mut updates = std::mem::take(&mut followed.updates).into_iter();
        if bronze.is_some() {
            let staged = updates.next().unwrap_or_default();
            self.bronze.stage_schema(&bronze_table, staged);
        }
        if let (Some(table), Some(planned_on)) = (self.silver.as_mut(), &silver_table) {
            table.stage_schema(planned_on, updates.next().unwrap_or_default());
        }
        if followed.changed {
            failpoint::hit("schema-staged");
        }
        // Ahead of its stream, bronze took new columns only: the stream's
        // relation of the same columns still has the rest to bring.
        if bronze.is_some_and(|mode| mode != Mode::BronzeAhead) {
            self.bronze_relation = Some(relation.clone());
        }
        if silver.is_some() {
            self.silver_relation = Some(relation.clone());
        }
        if let Some(table) = self.silver.as_mut().filter(|_| followed.changed) {
            table.refresh_schema(lake).await?;
        }
        if followed.reload_silver {
            let id = resync::request_on(lake, self.bronze.ident()).await?;
            tracing::info!(
                table = %relation.name, request = %id,
                "silver cannot take the schema change in place: it takes no more changes and is reloaded (resync) at the next transaction boundary"
            );
            self.reloading = true;
            return Ok(true);
        }
        // A table being resynced reads the new columns' values anyway.
        Ok(self.resync.is_none()
            && silver.is_some()
            && resync_for_defaults(lake, self.bronze.ident(), relation, &followed).await?)
    }

    /// Whether every table of the sink holds its initial load.
    fn loaded(&self) -> bool {
        self.bronze_at.is_some() && (self.silver.is_none() || self.silver_at.is_some())
    }

    /// The sink's Iceberg tables: bronze, then silver when there is one.
    fn idents(&self) -> Vec<&TableIdent> {
        std::iter::once(self.bronze.ident())
            .chain(self.silver.as_ref().map(SilverTable::ident))
            .collect()
    }
}

/// Requests a resync of a table whose silver just gained a column with a
/// default: the rows no change touched hold that default at the source,
/// and read null in silver until it is loaded again (docs/tables.md,
/// Schema changes).
async fn resync_for_defaults(
    lake: &Lake,
    bronze: &TableIdent,
    relation: &RelationInfo,
    followed: &evolve::Followed,
) -> Result<bool> {
    let defaulted: Vec<&str> = relation
        .columns
        .iter()
        .filter(|c| c.has_default && followed.added_to_silver.contains(&c.name))
        .map(|c| c.name.as_str())
        .collect();
    if !defaulted.is_empty() {
        let id = resync::request_on(lake, bronze).await?;
        tracing::info!(
            table = %relation.name, columns = ?defaulted, request = %id,
            "new columns with a default: silver is reloaded (resync) so that the rows before them hold it"
        );
    }
    Ok(!defaulted.is_empty())
}

/// Whether a table holding `held` still needs a streamed `change`: one not
/// yet loaded takes none (its load, [`Pipeline::take_load`], holds them),
/// a loaded one the transactions it does not hold.
fn wants(held: Option<Position>, change: &Change) -> bool {
    held.is_some_and(|at| !at.holds(change.tx.commit_lsn))
}

/// A run of the initial load's rows, decoded into silver-typed Arrow
/// columns on its connection's task.
struct LoadBatch {
    relation: Arc<RelationInfo>,
    first_seq: u64,
    fields: Vec<FieldRef>,
    columns: Vec<ArrayRef>,
    /// The values `columns` cannot hold.
    verbatim: Verbatim,
    rows: usize,
    /// Bytes of COPY data the rows came in.
    bytes: usize,
    /// Rows of the table read so far, these included, and its estimate.
    table_rows: u64,
    estimate: Option<u64>,
}

impl LoadBatch {
    fn decode(rows: LoadRows, lsn: Lsn) -> Result<LoadBatch> {
        let fields = source_arrow_fields(&rows.relation)?;
        let (columns, verbatim) = load_columns(&fields, &rows, lsn)?;
        Ok(LoadBatch {
            first_seq: rows.first_seq,
            fields,
            columns,
            verbatim,
            rows: rows.rows.len(),
            bytes: rows.rows.bytes(),
            table_rows: rows.table_rows,
            estimate: rows.estimate,
            relation: rows.relation,
        })
    }
}

/// Log lines on the initial load's progress: rows done of the estimate,
/// rate and time left, every few seconds.
struct ProgressLog {
    next: Instant,
    /// Per table: when its first run came, and the rows read by then (its
    /// runs interleave with other tables' when loads run in parallel).
    since: HashMap<TableName, (Instant, u64)>,
}

impl ProgressLog {
    const EVERY: Duration = Duration::from_secs(5);

    fn new() -> ProgressLog {
        ProgressLog {
            next: Instant::now() + Self::EVERY,
            since: HashMap::new(),
        }
    }

    fn tick(&mut self, load: &LoadBatch) {
        let now = Instant::now();
        let table = &load.relation.name;
        let (since, rows_at_since) = *self
            .since
            .entry(table.clone())
            .or_insert((now, load.table_rows));
        if now < self.next {
            return;
        }
        self.next = now + Self::EVERY;
        let seconds = (now - since).as_secs_f64().max(0.001);
        let rate = (load.table_rows - rows_at_since) as f64 / seconds;
        let left = load
            .estimate
            .map(|e| e.saturating_sub(load.table_rows) as f64 / rate.max(1.0));
        tracing::info!(
            %table,
            rows = load.table_rows,
            estimate = load.estimate,
            rows_per_second = rate.round(),
            seconds_left = left.map(f64::round),
            "initial load progress"
        );
    }
}

/// What the stream loop does next.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Wait,
    Flush,
    Exit,
    FlushAndExit,
    /// Stop without committing the open batch.
    Abandon,
}

/// How often a stop request is looked at while the stream is quiet.
const SHUTDOWN_POLL: Duration = Duration::from_millis(250);

/// A stream quiet for this many flush intervals, with nothing staged, gets
/// a full compaction (see `Pipeline::compact_idle`).
const IDLE_COMPACTION_FLUSHES: u32 = 5;

/// When to commit the open batch and when to stop: a batch is committed
/// at a transaction's end once it reached a limit or its interval, or when
/// the stream goes quiet between transactions; never inside a transaction,
/// however long its changes take to arrive, so a snapshot never holds part
/// of one. The stream is never idle while a streamed transaction is open:
/// its chunks are changes arriving, though they become events only at its
/// Stream Commit.
struct FlushPolicy {
    interval: Duration,
    max_rows: usize,
    max_bytes: usize,
    exit_when_idle: Option<Duration>,
    in_tx: bool,
    /// Whether the server is streaming a transaction not yet ended
    /// ([`ChangeStream::in_streamed_transaction`]).
    in_streamed_tx: bool,
    /// When the complete transactions waiting in the batch are due.
    flush_at: Option<Instant>,
    last_event: Instant,
}

impl FlushPolicy {
    fn new(options: &RunOptions, now: Instant) -> FlushPolicy {
        FlushPolicy {
            interval: options.flush_interval,
            max_rows: options.max_batch_rows,
            max_bytes: options.max_batch_bytes,
            exit_when_idle: options.exit_when_idle,
            in_tx: false,
            in_streamed_tx: false,
            flush_at: None,
            last_event: now,
        }
    }

    /// How long to wait for the next event before [`Self::on_idle`]: at
    /// most [`SHUTDOWN_POLL`], so a stop request is seen while idle.
    fn deadline(&self, now: Instant) -> Instant {
        let poll = now + SHUTDOWN_POLL;
        if self.in_tx {
            return poll;
        }
        let idle_at = self
            .exit_when_idle
            .filter(|_| !self.in_streamed_tx)
            .map(|d| self.last_event + d);
        [self.flush_at, idle_at, Some(poll)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(poll)
    }

    /// What a stop request means now: commit what is complete, or abandon
    /// a batch a transaction is still arriving into.
    fn on_shutdown(&self, complete: bool) -> Step {
        if self.in_tx {
            Step::Abandon
        } else if complete {
            Step::FlushAndExit
        } else {
            Step::Exit
        }
    }

    /// After each wait for the stream: while a streamed transaction is
    /// open, and when it ends, changes were arriving just now.
    fn streamed(&mut self, open: bool, now: Instant) {
        if open || self.in_streamed_tx {
            self.last_event = now;
        }
        self.in_streamed_tx = open;
    }

    fn saw(&mut self, event: &Event, now: Instant) {
        self.last_event = now;
        match event {
            Event::Begin(_) => self.in_tx = true,
            Event::Commit { .. } => self.in_tx = false,
            Event::Change(_) | Event::Message { .. } => {}
        }
    }

    /// After an event went into the batch; `complete` says whether the
    /// batch holds a finished transaction.
    fn after_event(&mut self, now: Instant, complete: bool, rows: usize, bytes: usize) -> Step {
        if self.in_tx || !complete {
            return Step::Wait;
        }
        let due = *self.flush_at.get_or_insert(now + self.interval);
        if rows >= self.max_rows || bytes >= self.max_bytes || now >= due {
            Step::Flush
        } else {
            Step::Wait
        }
    }

    fn on_idle(&mut self, now: Instant, complete: bool) -> Step {
        if self.in_tx {
            Step::Wait
        } else if complete {
            Step::Flush
        } else if !self.in_streamed_tx
            && self
                .exit_when_idle
                .is_some_and(|d| now >= self.last_event + d)
        {
            Step::Exit
        } else {
            Step::Wait
        }
    }

    fn flushed(&mut self) {
        self.flush_at = None;
    }
}

struct Pipeline<'r> {
    lake: Lake,
    namespace: iceberg::NamespaceIdent,
    /// Iceberg name of each source table.
    names: HashMap<TableName, String>,
    /// The slot, which each bronze table records ([`table_set`]).
    slot: String,
    sinks: HashMap<TableName, TableSink>,
    /// Changes staged in the open batch, and roughly their bytes.
    batch_changes: usize,
    batch_bytes: usize,
    /// The source commit times of the open batch's streamed transactions,
    /// for the metrics.
    batch_commit_times: Vec<i64>,
    /// The last transaction in the batch; `None` while the batch holds no
    /// complete transaction.
    batch_end: Option<Position>,
    /// `RunOptions::compact_after_files` and `retention`.
    compact_after_files: usize,
    retention: Retention,
    /// The tables this start resyncs ([`resync`]), by request.
    resyncing: HashMap<TableName, String>,
    /// Whether this run asked for a resync itself (a new column with a
    /// default), to be done at the next transaction boundary.
    resync_asked: bool,
    /// What all runs of this process did so far.
    report: &'r mut RunReport,
}

/// How a stream ended: for good, or to start over for a resync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamEnd {
    Done,
    Resync,
}

/// The longest wait between reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs the pipeline. Once it has streamed, a lost connection or a server
/// restart is not the end: it reconnects with capped exponential backoff
/// and resumes from the slot (nothing committed is repeated, nothing
/// unconfirmed is lost). An error before the first stream started (a wrong
/// host, a refused password, a failed check) ends the run at once.
pub async fn run(config: &PgConfig, options: &RunOptions) -> Result<RunReport> {
    let mut total = RunReport::default();
    let mut backoff = Duration::from_millis(250);
    let mut streamed = false;
    loop {
        let mut started = false;
        if streamed {
            wait_for_slot_release(config, &options.capture.slot).await;
        }
        match run_once(config, options, &mut started, &mut total).await {
            Ok(StreamEnd::Done) => return Ok(total),
            Ok(StreamEnd::Resync) if options.shutdown.is_requested() => return Ok(total),
            Ok(StreamEnd::Resync) => {
                streamed = true;
                backoff = Duration::from_millis(250);
            }
            Err(err) if err.is_retryable() && (started || streamed) => {
                if options.shutdown.is_requested() {
                    return Ok(total);
                }
                if started {
                    backoff = Duration::from_millis(250);
                }
                streamed = true;
                tracing::warn!(error = %err, retry_in = ?backoff, "the connection was lost; reconnecting");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            // A TRUNCATE or rewrite of a table between a load's snapshot
            // and its lock, or another writer's schema change under a
            // batch's: nothing of either was committed, and the next start
            // does it again, from a new snapshot or from the stream.
            Err(err) if err.kind() == ErrorKind::Concurrent => {
                if options.shutdown.is_requested() {
                    return Ok(total);
                }
                streamed |= started;
                tracing::warn!(error = %err, retry_in = ?backoff, "a table changed under the load or the batch; starting again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(err) => return Err(err),
        }
    }
}

/// How long a restart waits for the server to let go of the slot.
const SLOT_RELEASE_WAIT: Duration = Duration::from_secs(60);

/// Waits, up to [`SLOT_RELEASE_WAIT`], until no process holds `slot`: the
/// walsender of this process's last replication connection outlives it
/// for a moment (until `wal_sender_timeout` when the connection was cut),
/// and the next start's preflight would find the slot in use. Errors are
/// left to that preflight.
async fn wait_for_slot_release(config: &PgConfig, slot: &str) {
    let Ok(client) = SourceClient::connect(config).await else {
        return;
    };
    let give_up = Instant::now() + SLOT_RELEASE_WAIT;
    let mut told = false;
    while let Ok(Some(info)) = source::slot_info(&client, slot).await {
        let Some(pid) = info.active_pid else {
            return;
        };
        if Instant::now() >= give_up {
            return;
        }
        if !told {
            tracing::info!(
                slot,
                pid,
                "waiting for the server to release the slot the last connection held"
            );
            told = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One connection's worth of the pipeline; `started` is set once the
/// stream runs, and `total` gathers what was applied.
async fn run_once(
    config: &PgConfig,
    options: &RunOptions,
    started: &mut bool,
    total: &mut RunReport,
) -> Result<StreamEnd> {
    let namespace = namespace(options.namespace.as_deref().unwrap_or(&config.dbname));
    // Every table the lake holds from this slot, named or not: the slot's
    // position is shared, and confirming past a table's changes loses them.
    let mut tables = options.capture.tables.clone();
    let mut chosen = options.table_names.clone();
    let held = table_set::held(
        config,
        &options.lake,
        &namespace,
        &options.capture.slot,
        &options.capture.publication,
    )
    .await?;
    // A table renamed since is the same table under its new name, whatever
    // `--tables` calls it; its old name, if another table has it now, is
    // not that one (names may have been swapped among held tables).
    for (old, taken) in held
        .iter()
        .filter_map(|h| Some((h.renamed_from.as_ref()?, h.old_name_taken)))
    {
        if taken && tables.contains(old) && !held.iter().any(|h| h.table == *old) {
            return Err(Error::new(
                ErrorKind::Preflight,
                "tables names a table the lake holds under another name now: it was renamed, \
                 and another table has its old name; name the renamed one as it is now",
            )
            .with_context("table", old));
        }
        tables.retain(|t| t != old);
        chosen.remove(old);
    }
    for held in held {
        if !tables.contains(&held.table) {
            if held.renamed_from.is_none() {
                tracing::warn!(
                    table = %held.table,
                    "not named in tables, but the lake replicates it from this slot: applied \
                     too, since the slot's position is shared (docs/tables.md, The table set)"
                );
            }
            tables.push(held.table.clone());
        }
        // The Iceberg tables it is in are the ones its bronze recorded.
        chosen.insert(held.table, held.iceberg);
    }
    let names = names(&tables, &chosen)?;
    // Every check before anything is created or changed at the source or
    // in the lake: a run refused here leaves no slot, publication, lake
    // folder or table behind; `check` gives the same answer. A second run
    // on the same slot and lake is told about the lake too.
    let mut capture_options = options.capture.clone();
    capture_options.to_lake = true;
    capture_options.tables = tables;
    let failures = capture::check(config, &capture_options).await?;
    if !failures.is_empty() {
        return Err(preflight_error(&failures));
    }
    let _writer = WriterLock::acquire(&options.lake, &namespace)?;
    let lake = Lake::open(&options.lake).await?;
    let mut pipeline = Pipeline {
        lake,
        namespace,
        names,
        slot: options.capture.slot.clone(),
        sinks: HashMap::new(),
        batch_changes: 0,
        batch_bytes: 0,
        batch_commit_times: Vec::new(),
        batch_end: None,
        compact_after_files: options.compact_after_files,
        retention: options.retention,
        resyncing: HashMap::new(),
        resync_asked: false,
        report: total,
    };
    capture_options.held_tables = Some(pipeline.loaded_tables(&capture_options.tables).await?);
    let (load, mut pending, new_slot) = match capture::open(config, &capture_options).await? {
        Capture::Fresh { load, pending } => (Some(load), pending, true),
        Capture::Resume { load, pending } => (load, pending, false),
    };
    let load_end = load.as_ref().map(SnapshotLoad::consistent_point);
    if let Some(load) = load {
        let mut progress = ProgressLog::new();
        let tx = load.tx();
        let mut load = load
            .in_parallel(config, options.load_connections, move |rows| {
                LoadBatch::decode(rows, tx.commit_lsn)
            })
            .await?;
        while let Some(batch) = load.next().await? {
            progress.tick(&batch);
            if options.shutdown.is_requested() {
                tracing::info!("stopping during the initial load: nothing of it is committed");
                return Ok(StreamEnd::Done);
            }
            pipeline.take_load(tx, &batch).await?;
            let m = metrics();
            m.initial_load_rows
                .fetch_add(batch.rows as u64, Ordering::Relaxed);
            m.initial_load_bytes
                .fetch_add(batch.bytes as u64, Ordering::Relaxed);
            failpoint::hit("initial-load");
        }
        for relation in load.relations() {
            pipeline.ensure_sink(relation).await?;
        }
        pipeline.batch_end = Some(Position {
            commit_lsn: tx.commit_lsn,
            end_lsn: tx.commit_lsn,
            commit_ts: tx.commit_ts,
        });
        pipeline.flush().await?;
    }
    // Open every table (rebuilding silver's key index) while the
    // replication connection may still idle.
    for relation in pending.describe_tables().await? {
        pipeline.ensure_sink(&relation).await?;
    }
    for sink in pipeline.sinks.values_mut() {
        if let (Some(at), None, Some(_)) = (sink.bronze_at, sink.silver_at, &sink.silver)
            && at.is_load()
        {
            sink.load_silver_from_bronze(&pipeline.lake, at).await?;
        }
    }
    let _monitor = monitor::start(
        config,
        MonitorOptions {
            slot: options.capture.slot.clone(),
            interval: options.monitor_interval,
            heartbeat: options.heartbeat_interval,
            retained_wal_warn_bytes: options.retained_wal_warn_bytes,
        },
    )
    .await?;
    let mut stream = pending.start().await?;
    *started = true;
    if let Some(point) = load_end.filter(|_| new_slot) {
        stream.confirm(point).await?;
        pipeline.report.confirmed = point;
    }
    let end = pipeline.stream(&mut stream, options).await?;
    // Keepalives may have moved the slot past the last batch while idle.
    pipeline.report.confirmed = stream.confirmed();
    stream.stop().await?;
    Ok(end)
}

/// Bronze and silver of `table`, named as `names` (from [`names`]) says.
pub(crate) fn idents(
    namespace: &iceberg::NamespaceIdent,
    names: &HashMap<TableName, String>,
    table: &TableName,
) -> (TableIdent, TableIdent) {
    let name = names
        .get(table)
        .cloned()
        .unwrap_or_else(|| iceberg_name(table));
    (
        TableIdent::new(namespace.clone(), format!("{name}_changes")),
        TableIdent::new(namespace.clone(), name),
    )
}

impl TableSink {
    /// Commits a resync's load at `position` ([`resync`]): silver first,
    /// every row it held deleted in the same snapshot; then bronze, the
    /// reload's reads with bronze's own position kept, so the changes
    /// before `position` still reach it, recording request `id`; then the
    /// request done. True when silver was compacted after.
    async fn commit_resync(
        &mut self,
        lake: &Lake,
        position: Position,
        id: &str,
        compact_after_files: usize,
    ) -> Result<bool> {
        let (Some(silver), Some(kept)) = (&mut self.silver, self.bronze_at) else {
            return Err(Error::new(
                ErrorKind::Lake,
                "a resync needs a loaded bronze and a silver table",
            )
            .with_context("table", self.bronze.ident()));
        };
        silver.commit(lake, position).await?;
        self.silver_at = Some(position);
        self.silver_dirty = false;
        failpoint::hit("between-resync-silver-and-bronze");
        self.bronze
            .commit_recording(lake, kept, (resync::RESYNCED, id))
            .await?;
        self.bronze_dirty = false;
        resync::mark_done(lake, self.bronze.ident(), id).await?;
        tracing::info!(table = %silver.ident(), request = %id, lsn = %position.commit_lsn, "resynced");
        Ok(silver.compact(lake, compact_after_files).await?.is_some())
    }

    /// Loads silver from bronze's initial load at `at`, all bronze holds:
    /// what a crash between the two load commits leaves to do. Loaded from
    /// a newer snapshot instead, silver would hold the changes in between
    /// while bronze streams them, and their unchanged TOAST values would
    /// have no row to be filled from as it was then.
    async fn load_silver_from_bronze(&mut self, lake: &Lake, at: Position) -> Result<()> {
        let Some(silver) = &mut self.silver else {
            return Ok(());
        };
        tracing::info!(table = %silver.ident(), lsn = %at.commit_lsn, "loading silver from bronze's initial load");
        let tx = TxInfo {
            xid: 0,
            commit_lsn: at.commit_lsn,
            commit_ts: at.commit_ts,
        };
        let mut rows = std::pin::pin!(self.bronze.load_rows(lake, at).await?);
        while let Some((batch, verbatim)) = rows.try_next().await? {
            silver
                .stage_load(
                    lake,
                    tx,
                    batch.schema().fields(),
                    batch.columns(),
                    &verbatim,
                )
                .await?;
        }
        silver.commit(lake, at).await?;
        self.silver_at = Some(at);
        Ok(())
    }

    /// After a commit or an idle compaction: the metrics, and snapshot
    /// expiry for both tables once silver compacted or
    /// [`EXPIRE_EVERY_COMMITS`] commits went by. An expiry that fails
    /// (another writer kept committing) costs nothing but time and runs
    /// again later.
    async fn housekeeping(
        &mut self,
        lake: &Lake,
        table: &TableName,
        compacted: bool,
        retention: Retention,
    ) {
        let m = metrics();
        if compacted {
            m.compactions.fetch_add(1, Ordering::Relaxed);
            m.last_compaction_micros
                .store(now_micros(), Ordering::Relaxed);
        }
        if compacted || self.commits_since_expiry >= EXPIRE_EVERY_COMMITS {
            let mut expired_all = true;
            for ident in self.idents() {
                match expire_snapshots(lake, ident, retention).await {
                    Ok(expired) => {
                        m.snapshots_expired
                            .fetch_add(expired.snapshots as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        expired_all = false;
                        tracing::warn!(table = %ident, error = %e, "snapshot expiry failed; it runs again later");
                    }
                }
            }
            if expired_all {
                m.last_expiry_micros.store(now_micros(), Ordering::Relaxed);
            }
            self.commits_since_expiry = 0;
            for ident in self.idents() {
                match lake.catalog_table(ident).await {
                    Ok(t) => {
                        let total = |key: &str| summary_total(&t, key);
                        m.set_lake_table(
                            &ident.to_string(),
                            total("total-data-files"),
                            total("total-delete-files"),
                            total("total-files-size"),
                        );
                    }
                    Err(e) => {
                        tracing::warn!(table = %ident, error = %e, "cannot read the table's file counts for the metrics")
                    }
                }
            }
        }
        if let Some(silver) = &self.silver {
            let (data, deletes) = silver.file_counts();
            m.set_silver_files(&table.to_string(), data, deletes);
        }
    }
}

/// The Iceberg name of each table; two source tables must never land in
/// one Iceberg table.
pub(crate) fn names(
    tables: &[TableName],
    chosen: &BTreeMap<TableName, String>,
) -> Result<HashMap<TableName, String>> {
    let mut seen: BTreeMap<String, &TableName> = BTreeMap::new();
    let mut names = HashMap::new();
    for table in tables {
        let name = chosen
            .get(table)
            .cloned()
            .unwrap_or_else(|| iceberg_name(table));
        let bronze = format!("{name}_changes");
        for taken in [&name, &bronze] {
            if let Some(other) = seen.get(taken.as_str()) {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("tables {other} and {table} would both use Iceberg table {taken}"),
                ));
            }
        }
        seen.insert(name.clone(), table);
        seen.insert(bronze, table);
        names.insert(table.clone(), name);
    }
    Ok(names)
}

impl Pipeline<'_> {
    async fn stream(
        &mut self,
        stream: &mut ChangeStream,
        options: &RunOptions,
    ) -> Result<StreamEnd> {
        let mut policy = FlushPolicy::new(options, Instant::now());
        // Whether a full compaction found nothing left to do since the
        // last change.
        let mut settled = false;
        let mut resync_checked = Instant::now();
        loop {
            let next = stream
                .next_before(Some(policy.deadline(Instant::now())))
                .await?;
            policy.streamed(stream.in_streamed_transaction(), Instant::now());
            let step = match next {
                Next::Event(event) => {
                    let now = Instant::now();
                    settled &= !matches!(event, Event::Change(_));
                    policy.saw(&event, now);
                    self.take(event).await?;
                    policy.after_event(
                        now,
                        self.batch_end.is_some(),
                        self.batch_changes,
                        self.batch_bytes,
                    )
                }
                Next::Idle => {
                    let now = Instant::now();
                    let quiet = self.compact_after_files > 0
                        && !settled
                        && self.batch_changes == 0
                        && self.batch_end.is_none()
                        && now
                            >= policy.last_event + options.flush_interval * IDLE_COMPACTION_FLUSHES;
                    if quiet {
                        settled = !self.compact_idle().await?;
                    }
                    policy.on_idle(now, self.batch_end.is_some())
                }
                Next::Closed => {
                    return Err(Error::new(
                        ErrorKind::Connection,
                        "the server ended the replication stream",
                    ));
                }
            };
            let step = if options.shutdown.is_requested() {
                policy.on_shutdown(self.batch_end.is_some())
            } else {
                step
            };
            match step {
                Step::Wait => {}
                Step::Flush => {
                    self.flush_and_confirm(stream).await?;
                    policy.flushed();
                }
                Step::Exit => return self.end(),
                Step::FlushAndExit => {
                    self.flush_and_confirm(stream).await?;
                    return self.end();
                }
                Step::Abandon => {
                    tracing::info!(
                        changes = self.batch_changes,
                        "stopping inside a transaction: the open batch is not committed and will be streamed again"
                    );
                    return Ok(StreamEnd::Done);
                }
            }
            // Between transactions, with nothing staged: where a resync
            // may end the stream.
            if self.batch_end.is_none() && self.batch_changes == 0 {
                if self.resync_asked {
                    return Ok(StreamEnd::Resync);
                }
                if resync_checked.elapsed() >= resync::POLL {
                    resync_checked = Instant::now();
                    if self.resync_requested().await? {
                        return Ok(StreamEnd::Resync);
                    }
                }
            }
        }
    }

    /// How a stream that ends for good ends: a resync this run asked for
    /// comes first.
    fn end(&self) -> Result<StreamEnd> {
        Ok(if self.resync_asked {
            StreamEnd::Resync
        } else {
            StreamEnd::Done
        })
    }

    /// Whether a table's bronze holds a resync request not done yet.
    async fn resync_requested(&self) -> Result<bool> {
        for (table, sink) in &self.sinks {
            if sink.silver.is_none() {
                continue;
            }
            let bronze = self.lake.catalog_table(sink.bronze.ident()).await?;
            if let Some(id) = resync::pending(&bronze) {
                tracing::info!(%table, request = %id, "resync requested: committing, then starting over to reload the table");
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// One round of full compaction of each table, as `wal2iceberg
    /// compact` does, while the stream is quiet and nothing is staged:
    /// every small file merged and every deleted row dropped, so readers
    /// of a table that stopped changing scan no delete at all. True when
    /// a table was compacted (another round may follow).
    async fn compact_idle(&mut self) -> Result<bool> {
        let mut any = false;
        for (table, sink) in &mut self.sinks {
            if !sink.loaded() {
                continue;
            }
            let mut compacted = merge_small_files(&self.lake, sink.bronze.ident(), Merge::All)
                .await?
                .is_some();
            if let Some(silver) = &mut sink.silver {
                compacted |= silver.compact_now(&self.lake, Merge::All).await?.is_some();
            }
            if compacted {
                tracing::info!(table = %table, "compacted while the stream is quiet");
                sink.housekeeping(&self.lake, table, true, self.retention)
                    .await;
            }
            any |= compacted;
        }
        Ok(any)
    }

    /// Adds an event to the batch. Batches end at transaction boundaries:
    /// only a Commit makes the batch flushable.
    /// Stages an event; for a change, returns its approximate size.
    async fn take(&mut self, event: Event) -> Result<usize> {
        let mut taken = 0;
        match event {
            Event::Change(mut change) => {
                self.ensure_sink(&change.relation).await?;
                let sink = self
                    .sinks
                    .get_mut(&change.relation.name)
                    .expect("ensure_sink just ran");
                let to_bronze = wants(sink.bronze_at, &change);
                let to_silver =
                    sink.silver.is_some() && !sink.reloading && wants(sink.silver_at, &change);
                self.resync_asked |= sink
                    .follow(
                        &self.lake,
                        &change.relation,
                        to_bronze.then_some(Mode::Bronze),
                        to_silver.then_some(Mode::Silver),
                    )
                    .await?;
                let to_silver = to_silver && !sink.reloading;
                match &mut sink.silver {
                    Some(silver) if to_silver => {
                        sink.gap = Gap::default();
                        silver.fill_unchanged(&self.lake, &mut change).await?;
                    }
                    // History only: a complete before image (FULL) holds them.
                    None => change.fill_unchanged_from_before_image(),
                    // Silver, about to be reloaded, may be keyed otherwise
                    // than the change: what a before image holds, else the
                    // values stay marked not sent.
                    Some(_) if sink.reloading => change.fill_unchanged_from_before_image(),
                    Some(silver) if to_bronze => {
                        sink.gap
                            .fill_unchanged(&self.lake, &sink.bronze, silver, &mut change)
                            .await?;
                    }
                    Some(_) => {}
                }
                let change_bytes = change.approx_bytes();
                let op = change.op.code();
                let change = Arc::new(change);
                if to_bronze {
                    sink.bronze
                        .stage(&self.lake, change.clone(), change_bytes)
                        .await?;
                    sink.bronze_dirty = true;
                    if let Some(silver) = sink
                        .silver
                        .as_ref()
                        .filter(|_| !to_silver && !sink.reloading)
                    {
                        sink.gap.record(silver, &change)?;
                    }
                }
                if let Some(silver) = sink.silver.as_mut().filter(|_| to_silver) {
                    silver.stage(&self.lake, change, change_bytes).await?;
                    sink.silver_dirty = true;
                }
                self.batch_changes += 1;
                self.batch_bytes += change_bytes;
                if to_bronze || to_silver {
                    *sink.ops.entry(op).or_default() += 1;
                }
                taken = change_bytes;
            }
            Event::Commit { tx, end_lsn } => {
                if tx.xid != 0 {
                    if self.batch_commit_times.is_empty() {
                        metrics()
                            .oldest_pending_commit_micros
                            .store(tx.commit_ts, Ordering::Relaxed);
                    }
                    self.batch_commit_times.push(tx.commit_ts);
                }
                self.batch_end = Some(Position {
                    commit_lsn: tx.commit_lsn,
                    end_lsn,
                    commit_ts: tx.commit_ts,
                });
            }
            Event::Begin(_) | Event::Message { .. } => {}
        }
        Ok(taken)
    }

    /// Stages a run of the initial load's rows, whose columns bronze and
    /// silver both take.
    async fn take_load(&mut self, tx: TxInfo, load: &LoadBatch) -> Result<()> {
        let relation = &load.relation;
        self.ensure_sink(relation).await?;
        let sink = self
            .sinks
            .get_mut(&relation.name)
            .expect("ensure_sink just ran");
        let to_bronze = sink.bronze_at.is_none() || sink.resync.is_some();
        let to_silver = sink.silver.is_some() && sink.silver_at.is_none();
        // A resync's relation may be ahead of bronze's stream.
        let bronze_mode = match sink.bronze_at {
            None => Mode::Bronze,
            Some(_) => Mode::BronzeAhead,
        };
        self.resync_asked |= sink
            .follow(
                &self.lake,
                relation,
                to_bronze.then_some(bronze_mode),
                to_silver.then_some(Mode::SilverReload),
            )
            .await?;
        if !to_bronze && !to_silver {
            return Ok(());
        }
        if to_bronze {
            let renamed;
            let fields = match bronze_mode {
                Mode::BronzeAhead => {
                    let table = sink.bronze.table(&self.lake).await?;
                    renamed = evolve::held_names(&table, relation)
                        .iter()
                        .zip(&load.fields)
                        .map(|(name, f)| Arc::new(f.as_ref().clone().with_name(name)))
                        .collect::<Vec<FieldRef>>();
                    &renamed
                }
                _ => &load.fields,
            };
            sink.bronze
                .stage_load(
                    &self.lake,
                    tx,
                    load.first_seq,
                    fields,
                    &load.columns,
                    &load.verbatim,
                )
                .await?;
            sink.bronze_dirty = true;
        }
        if let Some(silver) = sink.silver.as_mut().filter(|_| to_silver) {
            silver
                .stage_load(&self.lake, tx, &load.fields, &load.columns, &load.verbatim)
                .await?;
            sink.silver_dirty = true;
        }
        let n = load.rows;
        self.batch_changes += n;
        self.batch_bytes += load.bytes;
        *sink.ops.entry(Op::Read.code()).or_default() += n as u64;
        Ok(())
    }

    fn idents(&self, table: &TableName) -> (TableIdent, TableIdent) {
        idents(&self.namespace, &self.names, table)
    }

    /// The tables whose bronze holds its initial load, and silver too, or
    /// can take it from bronze ([`TableSink::load_silver_from_bronze`]), or
    /// has none (a table without a key). A table with a resync pending
    /// counts as not loaded, and is noted in `resyncing` for its load; one
    /// whose resync's bronze commit landed is recorded done.
    async fn loaded_tables(&mut self, tables: &[TableName]) -> Result<Vec<TableName>> {
        let mut loaded = Vec::new();
        for table in tables {
            let (bronze_ident, silver) = self.idents(table);
            let Some(bronze) = self.lake.table_if_exists(&bronze_ident).await? else {
                continue;
            };
            let Some(at) = Position::of(&bronze)? else {
                continue;
            };
            if let Some(id) = resync::pending(&bronze).filter(|_| !history_only(&bronze)) {
                if !resync::committed(&bronze, &id) {
                    tracing::info!(%table, request = %id, "resyncing: silver is loaded again from a new snapshot");
                    self.resyncing.insert(table.clone(), id);
                    continue;
                }
                resync::mark_done(&self.lake, &bronze_ident, &id).await?;
            }
            let silver_at = match self.lake.table_if_exists(&silver).await? {
                Some(t) => Position::of(&t)?,
                None => None,
            };
            if history_only(&bronze) || silver_at.is_some() || at.is_load() {
                loaded.push(table.clone());
            }
        }
        Ok(loaded)
    }

    async fn ensure_sink(&mut self, relation: &RelationInfo) -> Result<()> {
        if self.sinks.contains_key(&relation.name) {
            return Ok(());
        }
        let (bronze, silver_ident) = self.idents(&relation.name);
        // A table without a primary key keeps its history only, which its
        // bronze says once made.
        let keyless = match self.lake.table_if_exists(&bronze).await? {
            Some(table) => history_only(&table),
            None => !has_silver(relation),
        };
        let source = table_set::source_properties(&relation.name, relation.oid, &self.slot);
        let mut properties: Vec<(&str, &str)> =
            source.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if keyless {
            properties.push(HISTORY_ONLY);
        }
        let bronze_table = self
            .lake
            .ensure_table_with(&bronze, bronze_schema(relation)?, &properties)
            .await?;
        table_set::record_source(
            &self.lake,
            &bronze_table,
            &relation.name,
            relation.oid,
            &self.slot,
        )
        .await?;
        // The tables follow the source's schema, and record its column
        // numbers, from the first change or load row that reaches them
        // ([`TableSink::follow`]): `relation` may be the catalog's of now,
        // ahead of the stream.
        let silver_table = match keyless {
            true => None,
            false => Some(
                self.lake
                    .ensure_table(&silver_ident, silver_schema(relation)?)
                    .await?,
            ),
        };
        let mut silver = match &silver_table {
            Some(_) => Some(SilverTable::open(&self.lake, silver_ident, relation).await?),
            None => None,
        };
        // A resync's load replaces every row silver holds.
        let resync = self.resyncing.get(&relation.name).cloned();
        if let Some(silver) = silver.as_mut().filter(|_| resync.is_some()) {
            silver.delete_all();
        }
        let bronze_at = Position::of(&bronze_table)?;
        if let Some(at) = bronze_at {
            metrics()
                .last_source_commit_micros
                .fetch_max(at.commit_ts, Ordering::Relaxed);
        }
        let sink = TableSink {
            bronze_relation: None,
            silver_relation: None,
            reloading: false,
            bronze: BronzeTable::new(bronze),
            bronze_at,
            silver_at: match resync {
                Some(_) => None,
                None => silver_table
                    .as_ref()
                    .map(Position::of)
                    .transpose()?
                    .flatten(),
            },
            silver,
            resync,
            gap: Gap::default(),
            bronze_dirty: false,
            silver_dirty: false,
            ops: HashMap::new(),
            commits_since_expiry: 0,
            // Half a cycle ahead of silver's count, so that the two
            // compactions fall on different flushes and the stream waits
            // for one at a time.
            bronze_commits: self.compact_after_files / 2,
        };
        self.sinks.insert(relation.name.clone(), sink);
        Ok(())
    }

    /// Commits the open batch: per table, bronze then silver. A table not
    /// yet loaded gets a snapshot even when its load was empty, which marks
    /// it loaded.
    async fn flush(&mut self) -> Result<()> {
        let Some(position) = self.batch_end.take() else {
            return Ok(());
        };
        let m = metrics();
        for (table, sink) in &mut self.sinks {
            let mut compacted = false;
            if let Some(id) = sink.resync.take() {
                compacted |= sink
                    .commit_resync(&self.lake, position, &id, self.compact_after_files)
                    .await?;
                sink.commits_since_expiry += 1;
                sink.housekeeping(&self.lake, table, compacted, self.retention)
                    .await;
                continue;
            }
            if sink.bronze_dirty || sink.bronze_at.is_none() {
                let evolved = sink.bronze.schema_staged();
                sink.bronze.commit(&self.lake, position).await?;
                sink.bronze_at = Some(position);
                sink.bronze_dirty = false;
                if evolved {
                    failpoint::hit("mid-schema-change");
                }
                failpoint::hit("between-bronze-and-silver");
                sink.bronze_commits += 1;
                if self.compact_after_files > 0 && sink.bronze_commits >= self.compact_after_files {
                    compacted |= merge_small_files(&self.lake, sink.bronze.ident(), Merge::Tiered)
                        .await?
                        .is_some();
                    sink.bronze_commits = 0;
                }
            }
            let committed = match &mut sink.silver {
                Some(silver) if sink.silver_dirty || sink.silver_at.is_none() => {
                    silver.commit(&self.lake, position).await?;
                    sink.silver_at = Some(position);
                    sink.silver_dirty = false;
                    compacted |= silver
                        .compact(&self.lake, self.compact_after_files)
                        .await?
                        .is_some();
                    true
                }
                Some(_) => false,
                // History only: bronze's commit is the table's.
                None => sink.bronze_at == Some(position),
            };
            if committed {
                sink.commits_since_expiry += 1;
                sink.housekeeping(&self.lake, table, compacted, self.retention)
                    .await;
            }
        }
        let now = now_micros();
        for commit_ts in self.batch_commit_times.drain(..) {
            let micros = u64::try_from(now - commit_ts).unwrap_or(0);
            m.commit_to_visible.observe(Duration::from_micros(micros));
        }
        m.last_source_commit_micros
            .fetch_max(position.commit_ts, Ordering::Relaxed);
        m.oldest_pending_commit_micros.store(0, Ordering::Relaxed);
        for (table, sink) in &mut self.sinks {
            let table = table.to_string();
            for (op, n) in sink.ops.drain() {
                m.add_changes(&table, op, n);
            }
        }
        if self.batch_changes > 0 {
            self.report.changes_applied += self.batch_changes as u64;
            self.report.batches += 1;
            self.batch_changes = 0;
            self.batch_bytes = 0;
        }
        Ok(())
    }

    async fn flush_and_confirm(&mut self, stream: &mut ChangeStream) -> Result<()> {
        let Some(end) = self.batch_end.map(|p| p.end_lsn) else {
            return Ok(());
        };
        self.flush().await?;
        failpoint::hit("before-confirm");
        stream.confirm(end).await?;
        self.report.confirmed = end;
        tracing::info!(lsn = %end, "batch committed and confirmed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::cdc::event::TxInfo;

    fn policy(now: Instant) -> FlushPolicy {
        let mut options = RunOptions::new(CaptureOptions::new(Vec::new()), PathBuf::new());
        options.flush_interval = Duration::from_secs(1);
        options.max_batch_rows = 100;
        options.exit_when_idle = Some(Duration::from_secs(5));
        FlushPolicy::new(&options, now)
    }

    fn begin() -> Event {
        Event::Begin(TxInfo {
            xid: 7,
            commit_lsn: Lsn(100),
            commit_ts: 0,
        })
    }

    fn commit() -> Event {
        Event::Commit {
            tx: TxInfo {
                xid: 7,
                commit_lsn: Lsn(100),
                commit_ts: 0,
            },
            end_lsn: Lsn(108),
        }
    }

    #[test]
    fn nothing_is_flushed_or_ended_inside_a_transaction() {
        let t0 = Instant::now();
        let mut p = policy(t0);
        p.saw(&begin(), t0);
        assert_eq!(p.after_event(t0, false, 0, 0), Step::Wait);
        p.saw(&commit(), t0);
        assert_eq!(p.after_event(t0, true, 1, 10), Step::Wait, "not due yet");
        // The next transaction starts; its changes stall past the interval
        // and past the idle exit: the complete one before it must wait.
        p.saw(&begin(), t0);
        assert_eq!(
            p.deadline(t0),
            t0 + SHUTDOWN_POLL,
            "only the stop request is polled"
        );
        assert_eq!(p.on_shutdown(true), Step::Abandon);
        assert_eq!(p.on_idle(t0 + Duration::from_secs(9), true), Step::Wait);
        p.saw(&commit(), t0 + Duration::from_secs(10));
        assert_eq!(
            p.after_event(t0 + Duration::from_secs(10), true, 2, 20),
            Step::Flush,
            "due at the first transaction end past the interval"
        );
        p.flushed();
        assert_eq!(p.on_idle(t0 + Duration::from_secs(12), false), Step::Wait);
        assert_eq!(p.on_idle(t0 + Duration::from_secs(15), false), Step::Exit);
        assert_eq!(p.on_shutdown(false), Step::Exit);
        p.saw(&commit(), t0);
        assert_eq!(p.on_shutdown(true), Step::FlushAndExit);
    }

    #[test]
    fn an_open_streamed_transaction_keeps_the_stream_from_going_idle() {
        let t0 = Instant::now();
        let mut p = policy(t0);
        p.streamed(true, t0 + Duration::from_secs(1));
        assert_eq!(
            p.deadline(t0 + Duration::from_secs(1)),
            t0 + Duration::from_secs(1) + SHUTDOWN_POLL
        );
        // Its chunks stall far past the idle exit; it is still open.
        assert_eq!(p.on_idle(t0 + Duration::from_secs(60), false), Step::Wait);
        // It ended (aborted: no event): the idle clock starts there.
        let ended = t0 + Duration::from_secs(61);
        p.streamed(false, ended);
        assert_eq!(p.on_idle(ended + Duration::from_secs(4), false), Step::Wait);
        assert_eq!(p.deadline(ended), ended + SHUTDOWN_POLL);
        assert_eq!(
            p.deadline(ended + Duration::from_millis(4900)),
            ended + Duration::from_secs(5)
        );
        assert_eq!(p.on_idle(ended + Duration::from_secs(5), false), Step::Exit);
    }

    #[test]
    fn limits_flush_at_the_transaction_end_and_quiet_flushes_what_is_complete() {
        let t0 = Instant::now();
        let mut p = policy(t0);
        p.saw(&commit(), t0);
        assert_eq!(p.after_event(t0, true, 100, 0), Step::Flush, "row limit");
        p.flushed();
        p.saw(&commit(), t0);
        assert_eq!(p.after_event(t0, true, 1, 0), Step::Wait);
        assert_eq!(p.deadline(t0), t0 + SHUTDOWN_POLL);
        assert_eq!(
            p.deadline(t0 + Duration::from_millis(900)),
            t0 + Duration::from_secs(1)
        );
        assert_eq!(p.on_idle(t0 + Duration::from_secs(1), true), Step::Flush);
    }
}
