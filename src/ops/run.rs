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
use std::path::PathBuf;
use std::time::Duration;

use iceberg::TableIdent;
use tokio::time::Instant;

use crate::cdc::capture::{self, Capture, CaptureOptions};
use crate::cdc::event::{Change, Event};
use crate::cdc::stream::{ChangeStream, Next};
use crate::error::{Error, ErrorKind, Result};
use crate::lake::bronze::bronze_batch;
use crate::lake::catalog::{Lake, namespace};
use crate::lake::schema::bronze_schema;
use crate::lake::silver::SilverTable;
use crate::lake::writer::{append, arrow_schema, committed_lsn, write_data_files};
use crate::pg::config::PgConfig;
use crate::pg::lsn::Lsn;
use crate::pg::source::TableName;

/// Flush a batch at least this often while changes arrive.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Flush once a batch holds this many changes (at the next transaction end).
pub const DEFAULT_MAX_BATCH_ROWS: usize = 100_000;

pub struct RunOptions {
    pub capture: CaptureOptions,
    /// The embedded lake's folder: `catalog.db` and `warehouse/`.
    pub lake: PathBuf,
    /// Iceberg namespace; the source database's name when unset.
    pub namespace: Option<String>,
    pub flush_interval: Duration,
    pub max_batch_rows: usize,
    /// Drain, commit, confirm and return once no change came for this long.
    pub exit_when_idle: Option<Duration>,
}

/// What a run did, for the caller to print.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub changes_applied: u64,
    pub batches: u64,
    /// The position the slot was left at.
    pub confirmed: Lsn,
}

/// The Iceberg names of a source table: `customers` and `customers_changes`
/// for `public.customers`; `sales__orders` for `sales.orders`.
pub fn iceberg_name(table: &TableName) -> String {
    if table.schema == "public" {
        table.name.clone()
    } else {
        format!("{}__{}", table.schema, table.name)
    }
}

/// The two Iceberg tables of one source table.
struct TableSink {
    bronze: TableIdent,
    silver: SilverTable,
    /// What each table already holds (skip transactions at or below).
    bronze_lsn: Option<Lsn>,
    silver_lsn: Option<Lsn>,
}

struct Pipeline {
    lake: Lake,
    namespace: iceberg::NamespaceIdent,
    sinks: HashMap<TableName, TableSink>,
    batch: Vec<Change>,
    /// The end LSN of the last transaction in the batch.
    batch_end: Option<Lsn>,
    /// The commit LSN of the last transaction in the batch.
    batch_commit: Lsn,
    report: RunReport,
}

pub async fn run(config: &PgConfig, options: &RunOptions) -> Result<RunReport> {
    check_names(&options.capture.tables)?;
    let lake = Lake::open_embedded(&options.lake).await?;
    let namespace = namespace(options.namespace.as_deref().unwrap_or(&config.dbname));
    let mut pipeline = Pipeline {
        lake,
        namespace,
        sinks: HashMap::new(),
        batch: Vec::new(),
        batch_end: None,
        batch_commit: Lsn::ZERO,
        report: RunReport::default(),
    };
    let mut stream = match capture::open(config, &options.capture).await? {
        Capture::Fresh { mut load, pending } => {
            while let Some(event) = load.next_event().await? {
                pipeline.take(event).await?;
            }
            pipeline.flush().await?;
            let mut stream = pending.start().await?;
            stream.confirm(load.consistent_point()).await?;
            pipeline.report.confirmed = load.consistent_point();
            stream
        }
        Capture::Resume(stream) => stream,
    };
    pipeline.stream(&mut stream, options).await?;
    // Keepalives may have moved the slot past the last batch while idle.
    pipeline.report.confirmed = stream.confirmed();
    stream.stop().await?;
    Ok(pipeline.report)
}

/// Two source tables must never land in one Iceberg table.
fn check_names(tables: &[TableName]) -> Result<()> {
    let mut seen: BTreeMap<String, &TableName> = BTreeMap::new();
    for table in tables {
        if let Some(other) = seen.insert(iceberg_name(table), table) {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "tables {other} and {table} would both become Iceberg table {}",
                    iceberg_name(table)
                ),
            ));
        }
    }
    Ok(())
}

impl Pipeline {
    async fn stream(&mut self, stream: &mut ChangeStream, options: &RunOptions) -> Result<()> {
        let mut last_event = Instant::now();
        let mut flush_at: Option<Instant> = None;
        loop {
            let idle_at = options.exit_when_idle.map(|d| last_event + d);
            let deadline = [flush_at, idle_at].into_iter().flatten().min();
            match stream.next_before(deadline).await? {
                Next::Event(event) => {
                    last_event = Instant::now();
                    let is_commit = matches!(event, Event::Commit { .. });
                    self.take(event).await?;
                    if is_commit && self.batch_end.is_some() {
                        flush_at.get_or_insert(Instant::now() + options.flush_interval);
                        if self.batch.len() >= options.max_batch_rows {
                            self.flush_and_confirm(stream).await?;
                            flush_at = None;
                        }
                    }
                }
                Next::Idle => {
                    if self.batch_end.is_some() {
                        self.flush_and_confirm(stream).await?;
                        flush_at = None;
                    } else if idle_at.is_some_and(|t| Instant::now() >= t) {
                        return Ok(());
                    }
                }
                Next::Closed => {
                    return Err(Error::new(
                        ErrorKind::Connection,
                        "the server ended the replication stream",
                    ));
                }
            }
        }
    }

    /// Adds an event to the batch. Batches end at transaction boundaries:
    /// only a Commit makes the batch flushable.
    async fn take(&mut self, event: Event) -> Result<()> {
        match event {
            Event::Change(change) => {
                self.ensure_sink(&change).await?;
                self.batch.push(change);
            }
            Event::Commit { tx, end_lsn } => {
                self.batch_end = Some(end_lsn);
                self.batch_commit = tx.commit_lsn;
            }
            Event::Begin(_) | Event::Message { .. } => {}
        }
        Ok(())
    }

    async fn ensure_sink(&mut self, change: &Change) -> Result<()> {
        if self.sinks.contains_key(&change.relation.name) {
            return Ok(());
        }
        let name = iceberg_name(&change.relation.name);
        let bronze = TableIdent::new(self.namespace.clone(), format!("{name}_changes"));
        let bronze_table = self
            .lake
            .ensure_table(&bronze, bronze_schema(&change.relation)?)
            .await?;
        let silver_ident = TableIdent::new(self.namespace.clone(), name);
        let silver = SilverTable::open(&self.lake, silver_ident, &change.relation).await?;
        let silver_table = self.lake.catalog_table(silver.ident()).await?;
        let sink = TableSink {
            bronze,
            bronze_lsn: committed_lsn(&bronze_table)?,
            silver_lsn: committed_lsn(&silver_table)?,
            silver,
        };
        self.sinks.insert(change.relation.name.clone(), sink);
        Ok(())
    }

    /// Commits the batch: per table, bronze then silver, each skipping what
    /// the table already holds.
    async fn flush(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            self.batch_end = None;
            return Ok(());
        }
        let commit_lsn = self.batch_commit;
        let mut by_table: HashMap<&TableName, Vec<&Change>> = HashMap::new();
        for change in &self.batch {
            by_table
                .entry(&change.relation.name)
                .or_default()
                .push(change);
        }
        for (table, changes) in by_table {
            let sink = self
                .sinks
                .get_mut(table)
                .expect("ensure_sink ran for every change");
            let new_for = |held: Option<Lsn>| -> Vec<&Change> {
                changes
                    .iter()
                    .copied()
                    .filter(|c| held.is_none_or(|h| c.tx.commit_lsn > h))
                    .collect()
            };
            let bronze_changes = new_for(sink.bronze_lsn);
            if !bronze_changes.is_empty() {
                let table = self.lake.catalog_table(&sink.bronze).await?;
                let batch = bronze_batch(&arrow_schema(&table)?, &bronze_changes)?;
                let files = write_data_files(&table, batch).await?;
                append(self.lake.catalog(), &table, files, commit_lsn).await?;
                sink.bronze_lsn = Some(commit_lsn);
            }
            let silver_changes = new_for(sink.silver_lsn);
            if !silver_changes.is_empty() {
                sink.silver
                    .apply(&self.lake, &silver_changes, commit_lsn)
                    .await?;
                sink.silver_lsn = Some(commit_lsn);
            }
        }
        self.report.changes_applied += self.batch.len() as u64;
        self.report.batches += 1;
        self.batch.clear();
        Ok(())
    }

    async fn flush_and_confirm(&mut self, stream: &mut ChangeStream) -> Result<()> {
        let end = self.batch_end;
        self.flush().await?;
        if let Some(end) = end {
            stream.confirm(end).await?;
            self.report.confirmed = end;
            tracing::info!(lsn = %end, "batch committed and confirmed");
        }
        self.batch_end = None;
        Ok(())
    }
}
