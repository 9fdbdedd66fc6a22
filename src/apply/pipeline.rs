//! The open batch and the stream loop: events staged into the sinks,
//! flushed when the policy says, confirmed once every commit landed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use iceberg::TableIdent;
use tokio::sync::watch;
use tokio::time::Instant;

use super::backfill::{Plan, Route};
use super::naming::{idents, state_folder};
use super::policy::{FlushPolicy, IDLE_COMPACTION_FLUSHES, Step};
use super::resync;
use super::sink::{TableSink, wants};
use super::tally::Tally;
use super::{RunOptions, RunReport};
use crate::cdc::backfill;
use crate::cdc::event::Event;
use crate::cdc::relation::RelationInfo;
use crate::cdc::stream::{ChangeStream, Next};
use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;
use crate::lake::catalog::Lake;
use crate::lake::files::writer::Position;
use crate::lake::lock::WriterLock;
use crate::lake::maintenance::expire::Retention;
use crate::lake::schema::evolve::Mode;
use crate::lake::schema::history_only;
use crate::lake::table::gap::Gap;
use crate::metrics::metrics;
use crate::model::Lsn;
use crate::model::TableName;

pub struct Pipeline<'r> {
    pub(super) lake: Lake,
    pub(super) namespace: iceberg::NamespaceIdent,
    /// Iceberg name of each source table.
    pub(super) names: HashMap<TableName, String>,
    /// The slot, which each bronze table records (`apply::table_set`).
    pub(super) slot: String,
    pub(super) sinks: HashMap<TableName, TableSink>,
    /// Changes staged in the open batch, and roughly their bytes.
    pub(super) batch_changes: usize,
    pub(super) batch_bytes: usize,
    /// The source commit times of the open batch's streamed transactions,
    /// for the metrics.
    pub(super) batch_commit_times: Vec<i64>,
    /// What the last commit wrote, by source table, for its log line.
    pub(super) committed: BTreeMap<TableName, Tally>,
    /// The last transaction in the batch; `None` while the batch holds no
    /// complete transaction.
    pub(super) batch_end: Option<Position>,
    /// `RunOptions::atomic_commits`, `compact_after_files` and
    /// `retention`.
    pub(super) atomic_commits: bool,
    pub(super) compact_after_files: usize,
    pub(super) retention: Retention,
    /// `RunOptions::state_dir`: each silver's key index keeps its runs in
    /// `<state_dir>/<namespace>/<table>`.
    pub(super) state_dir: std::path::PathBuf,
    /// The tables this start resyncs ([`resync`]), by request.
    pub(super) resyncing: HashMap<TableName, String>,
    /// Those of them a schema change or a rewrite asked for: silver is
    /// loaded in one snapshot, never in chunks.
    pub(crate) reload_whole: Vec<TableName>,
    /// Whether this run asked for a resync itself (a new column with a
    /// default), to be done at the next transaction boundary.
    pub(super) resync_asked: bool,
    /// A change met while its silver waits for a reload carries an
    /// unchanged TOAST value no before image holds: the open batch is
    /// abandoned for the resync, whose start fills it from bronze's
    /// history as it streams the change again.
    pub(super) replay_after_resync: bool,
    /// The tables loading beside the stream (`apply::load_beside_stream`).
    pub(super) beside: Option<Beside>,
    /// When this run last recorded a mark (`apply::slot_marks`).
    pub(super) marked: Option<Instant>,
    /// The lake's writer lock, checked before each batch's commit; none
    /// for a load beside the stream, whose run checks it.
    writer: Option<&'r mut WriterLock>,
    /// What all runs of this process did so far.
    pub(super) report: &'r mut RunReport,
}

/// Where a load beside the stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Load {
    Running,
    Landed,
    /// Stopped before it landed: a stop was asked for.
    Stopped,
}

/// The tables loading beside the stream, and where their load is.
pub(super) struct Beside {
    pub(super) tables: HashSet<TableName>,
    pub(super) load: watch::Receiver<Load>,
}

/// How a stream ended: for good, or to start over for a resync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    Done,
    Resync,
}

impl<'r> Pipeline<'r> {
    /// A pipeline into `lake`, writing `names`' tables in `namespace`;
    /// what it applies is added to `report`.
    pub(crate) fn new(
        lake: Lake,
        namespace: iceberg::NamespaceIdent,
        names: HashMap<TableName, String>,
        options: &RunOptions,
        report: &'r mut RunReport,
    ) -> Pipeline<'r> {
        // Where the catalog has them (docs/configuration.md).
        let atomic_commits = options.run.atomic_commits && lake.commits_tables_together();
        Pipeline {
            lake,
            namespace,
            names,
            slot: options.capture.slot.clone(),
            sinks: HashMap::new(),
            batch_changes: 0,
            batch_bytes: 0,
            batch_commit_times: Vec::new(),
            committed: BTreeMap::new(),
            batch_end: None,
            atomic_commits,
            compact_after_files: options.run.compact_after_files,
            retention: options.run.retention,
            state_dir: options.state_dir.clone(),
            resyncing: HashMap::new(),
            reload_whole: Vec::new(),
            resync_asked: false,
            replay_after_resync: false,
            beside: None,
            marked: None,
            writer: None,
            report,
        }
    }

    /// Checks `lock` before each batch's commit.
    pub(crate) fn commit_under(&mut self, lock: &'r mut WriterLock) {
        self.writer = Some(lock);
    }

    /// Opens the sink of every table `relations` describes, rebuilding
    /// silver's key index, and loads a silver that a crash left without
    /// its load from bronze's ([`TableSink::load_silver_from_bronze`]).
    pub(crate) async fn open(&mut self, relations: &[RelationInfo]) -> Result<()> {
        for relation in relations {
            self.ensure_sink(relation).await?;
        }
        for sink in self.sinks.values_mut() {
            if let (Some(at), None, Some(_)) = (sink.bronze_at, sink.silver_at, &sink.silver)
                && at.is_load()
            {
                sink.load_silver_from_bronze(&self.lake, at).await?;
            }
        }
        Ok(())
    }

    /// Opens the sinks of `relations` as [`Self::open`] does, before the
    /// slot is made: their bronze tables then record the slot, the lake's
    /// claim on it (docs/tables.md, The table set). The Iceberg tables this
    /// made, which [`Self::withdraw`] removes.
    pub(crate) async fn claim(&mut self, relations: &[RelationInfo]) -> Result<Vec<TableIdent>> {
        let mut missing = Vec::new();
        for relation in relations {
            let (bronze, silver) = self.idents(&relation.name);
            for ident in [bronze, silver] {
                if self.lake.table_if_exists(&ident).await?.is_none() {
                    missing.push(ident);
                }
            }
        }
        self.open(relations).await?;
        let mut made = Vec::new();
        for ident in missing {
            if self.lake.table_if_exists(&ident).await?.is_some() {
                made.push(ident);
            }
        }
        Ok(made)
    }

    /// Drops the tables a [`Self::claim`] made, empty still, and closes
    /// every sink.
    pub(crate) async fn withdraw(&mut self, made: &[TableIdent]) -> Result<()> {
        self.sinks.clear();
        for ident in made {
            self.lake.drop_with_files(ident).await?;
        }
        Ok(())
    }

    /// The lake follows `adoption.to` from here ([`super::slot_adoption`]).
    pub(crate) async fn adopt(&self, adoption: &super::slot_adoption::Adoption) -> Result<()> {
        super::slot_adoption::record(&self.lake, &self.namespace, adoption).await
    }

    /// The slot stands at `lsn` (or further, as confirmed before).
    pub(crate) fn confirmed(&mut self, lsn: Lsn) {
        self.report.confirmed = self.report.confirmed.max(lsn);
    }
}

impl Pipeline<'_> {
    pub(crate) async fn stream(
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
            let now = Instant::now();
            let mut deadline = self.beside_deadline(policy.deadline(now), now);
            if let Some(due) = self.mark_due(stream) {
                deadline = deadline.min(due);
            }
            let next = stream.next_before(Some(deadline)).await?;
            policy.streamed(stream.in_streamed_transaction(), Instant::now());
            policy.read_source(stream.caught_up());
            let step = match next {
                Next::Event(event) => {
                    let now = Instant::now();
                    settled &= !matches!(event, Event::Change(_));
                    policy.saw(&event, now);
                    self.take(event).await?;
                    if self.replay_after_resync {
                        tracing::info!(
                            changes = self.batch_changes,
                            "an unchanged TOAST value while silver waits for its reload: the open batch is streamed again after the resync"
                        );
                        // The stream is read again from where it began
                        // once a load beside it is done, not before.
                        self.load_ended().await;
                        return Ok(StreamEnd::Resync);
                    }
                    policy.after_event(
                        now,
                        self.batch_end.is_some(),
                        self.batch_changes,
                        self.batch_bytes,
                    )
                }
                Next::Idle => {
                    let now = Instant::now();
                    // A server waiting for a reply (shutting down) gets
                    // its mark first, not after a compaction.
                    let quiet = self.compact_after_files > 0
                        && !settled
                        && !stream.reply_asked()
                        && self.batch_changes == 0
                        && self.batch_end.is_none()
                        && now
                            >= policy.last_event
                                + options.run.flush_interval * IDLE_COMPACTION_FLUSHES;
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
                self.beside_step(step)
            };
            match step {
                Step::Wait => {}
                Step::Flush => {
                    self.flush_and_confirm(stream).await?;
                    policy.flushed();
                }
                Step::Exit => {
                    self.mark_if_due(stream, true).await?;
                    return self.end();
                }
                Step::FlushAndExit => {
                    self.flush_and_confirm(stream).await?;
                    self.mark_if_due(stream, true).await?;
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
            self.mark_if_due(stream, false).await?;
            // Between transactions, with nothing staged: where a resync
            // may end the stream. (Inside one, a DDL's schema change may
            // be staged with no change counted.)
            if policy.between_transactions() && self.batch_end.is_none() && self.batch_changes == 0
            {
                // A resync asked for while a load runs beside the stream
                // waits for the start over the load ends in.
                if self.landed_beside() || (self.resync_asked && !self.loading()) {
                    return Ok(StreamEnd::Resync);
                }
                if !self.loading() && resync_checked.elapsed() >= resync::POLL {
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
        Ok(if self.resync_asked || self.landed_beside() {
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

    /// Adds an event to the batch. Batches end at transaction boundaries:
    /// only a Commit makes the batch flushable.
    /// Stages an event; for a change, returns its approximate size.
    async fn take(&mut self, event: Event) -> Result<usize> {
        let mut taken = 0;
        match event {
            Event::Change(_) | Event::Rewritten { .. } | Event::Described { .. }
                if self.loading_beside(event.table()) => {}
            Event::Change(mut change) => {
                failpoint::stall("stage").await;
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
                // A table under backfill: silver takes the change by its
                // key's range (`apply::backfill`).
                let plan = match (&mut sink.backfill, &sink.silver) {
                    (Some(backfill), Some(silver)) if to_silver => {
                        change.fill_unchanged_from_before_image();
                        Some(backfill.plan(silver, &change)?)
                    }
                    _ => None,
                };
                let backfilled = plan.is_some();
                let to_silver = to_silver && matches!(plan, None | Some(Plan::Whole(Route::Apply)));
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
                    Some(_) if sink.reloading => {
                        change.fill_unchanged_from_before_image();
                        if change.has_unchanged_toast() {
                            self.replay_after_resync = true;
                            return Ok(0);
                        }
                    }
                    Some(_) if to_bronze => {
                        sink.gap
                            .fill_unchanged(&self.lake, &sink.bronze, &mut change)
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
                    if sink.silver.is_some() && !to_silver && !sink.reloading && !backfilled {
                        sink.gap.record(&change)?;
                    }
                }
                if let Some(plan) = plan {
                    sink.take_backfilled(&self.lake, plan, &change).await?;
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
                for backfill in self.sinks.values_mut().filter_map(|s| s.backfill.as_mut()) {
                    backfill.committed(tx.xid);
                }
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
            Event::Rewritten { tx, table, .. } => self.rewritten(&table, tx.commit_lsn).await?,
            Event::Described { tx, relation, .. } => {
                self.follow_ddl(&relation, tx.commit_lsn).await?
            }
            Event::Message {
                tx: Some(tx),
                lsn,
                prefix,
                content,
            } if prefix == backfill::WATERMARK => self.watermark(tx, lsn, &content).await?,
            Event::Begin(_) | Event::Message { .. } => {}
        }
        Ok(taken)
    }

    pub(super) fn idents(&self, table: &TableName) -> (TableIdent, TableIdent) {
        idents(&self.namespace, &self.names, table)
    }

    /// The tables whose bronze holds its initial load, and silver too, or
    /// can take it from bronze ([`TableSink::load_silver_from_bronze`]), or
    /// has none (a table without a key). A table with a resync pending
    /// counts as not loaded, and is noted in `resyncing` for its load; one
    /// whose resync's bronze commit landed is recorded done.
    pub(crate) async fn loaded_tables(&mut self, tables: &[TableName]) -> Result<Vec<TableName>> {
        let mut loaded = Vec::new();
        for table in tables {
            let (bronze_ident, silver) = self.idents(table);
            let Some(bronze) = self.lake.table_if_exists(&bronze_ident).await? else {
                continue;
            };
            let Some(at) = Position::of(&bronze)? else {
                continue;
            };
            if let Some(id) = resync::pending(&bronze) {
                if !resync::committed(&bronze, &id) {
                    tracing::info!(%table, request = %id, "resyncing: silver is loaded again");
                    if !resync::in_chunks(&bronze, &id) {
                        self.reload_whole.push(table.clone());
                    }
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

    /// Opens the sink of `relation`'s table unless it is open.
    pub(super) async fn ensure_sink(&mut self, relation: &RelationInfo) -> Result<()> {
        if self.sinks.contains_key(&relation.name) {
            return Ok(());
        }
        let (bronze, silver) = self.idents(&relation.name);
        let resync = self.resyncing.get(&relation.name).cloned();
        let state = state_folder(&self.state_dir, silver.namespace(), Some(silver.name()));
        let sink = TableSink::open(
            &self.lake,
            (bronze, silver),
            relation,
            &self.slot,
            resync,
            self.compact_after_files,
            state,
        )
        .await?;
        self.sinks.insert(relation.name.clone(), sink);
        Ok(())
    }

    /// The lake's writer lock is still this run's: one in a PostgreSQL
    /// catalog goes with its connection (the catalog's server restarted,
    /// or cut it), and a compaction or drop-table could take it meanwhile.
    /// Then nothing is committed: the run starts over, taking it again.
    pub(super) async fn writer_lock_held(&mut self) -> Result<()> {
        let Some(lock) = self.writer.as_deref_mut() else {
            return Ok(());
        };
        if lock.holds().await {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Connection,
            "the lake's writer lock went with its catalog connection: committing nothing until it is taken again",
        )
        .with_context("namespace", self.namespace.join(".")))
    }

    async fn flush_and_confirm(&mut self, stream: &mut ChangeStream) -> Result<()> {
        let Some(end) = self.batch_end.map(|p| p.end_lsn) else {
            return Ok(());
        };
        self.writer_lock_held().await?;
        let recorded = self.flush().await?;
        failpoint::hit("before-confirm");
        if recorded {
            stream.record(end).await?;
        } else {
            stream.confirm(end).await?;
        }
        self.confirmed(stream.confirmed());
        let mut tables: Vec<String> = self
            .committed
            .iter()
            .map(|(table, tally)| format!("{table} ({tally})"))
            .collect();
        if tables.is_empty() {
            // Positions only: a mark, a table's first empty snapshot.
            tables.push("none written".to_owned());
        }
        tracing::info!(lsn = %end, confirmed = %stream.confirmed(), tables = %tables.join("; "), "batch committed and confirmed");
        Ok(())
    }
}
