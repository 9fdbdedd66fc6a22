//! A table's chunked backfill in the pipeline (docs/backfill.md): which
//! key ranges silver holds, the open chunk's window, and the rules that
//! route each change of the table between them.
//!
//! Silver holds rows of applied ranges only. A change of a key in an
//! applied range is applied as any change; one of a key in the open
//! chunk's range marks the key dirty and waits in the window for the
//! chunk's high watermark; one of a key in no read range is left to the
//! read that will see it (bronze takes every change as it comes). At the
//! high watermark the chunk's rows of keys not dirty enter both tables,
//! the window's changes follow them into silver in order, and the range
//! joins the applied ones; the progress goes into bronze's properties in
//! the same commit.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use iceberg::TableUpdate;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::pipeline::Pipeline;
use super::sink::TableSink;
use crate::cdc::backfill::{self, Chunk, Range, ReadPlan, Watermark};
use crate::cdc::event::{Change, Op, TxInfo};
use crate::cdc::relation::RelationInfo;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::schema::evolve::Mode;
use crate::lake::table::bronze::BronzeTable;
use crate::lake::table::key::Key;
use crate::lake::table::silver::SilverTable;
use crate::metrics::metrics;
use crate::model::{Lsn, TableName};
use crate::pg::config::PgConfig;
use crate::pg::source::chunk::Bound;

/// Bronze's property recording a table's backfill ([`Progress`]).
pub(crate) const PROGRESS: &str = "wal2iceberg.backfill";
/// How often the backfill's progress is logged at least.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Silver's property while its backfill is not done.
pub(crate) const INCOMPLETE: (&str, &str) = ("wal2iceberg.incomplete", "backfill");

/// What bronze records of a table's backfill, in the commit of each
/// chunk's rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Progress {
    /// The ranges silver holds, in key order.
    pub(crate) applied: Vec<Range>,
    /// Rows read into the lake so far.
    pub(crate) rows: u64,
    /// The source's estimate of the table's rows when the last chunk was
    /// read (`pg_class.reltuples`), once the table was ever analyzed.
    #[serde(default)]
    pub(crate) estimate: Option<u64>,
    pub(crate) chunk_rows: u64,
    pub(crate) done: bool,
}

impl Progress {
    pub(crate) fn of(table: &iceberg::table::Table) -> Option<Progress> {
        let text = table.metadata().properties().get(PROGRESS)?;
        serde_json::from_str(text).ok()
    }

    /// The ranges not applied yet, in key order, the last one (to the
    /// table's end) apart: where the reader plans chunks from.
    fn left(&self) -> (VecDeque<Range>, Option<Option<Bound>>) {
        let mut gaps = VecDeque::new();
        // Where the next applied range should start; `None` past the end.
        let mut cursor: Option<Option<Bound>> = Some(None);
        for range in &self.applied {
            let Some(at) = cursor else { break };
            if at != range.after {
                gaps.push_back(Range {
                    after: at,
                    upto: range.after.clone(),
                });
            }
            cursor = range.upto.clone().map(Some);
        }
        (gaps, cursor)
    }
}

/// A key range as silver's key encoding orders it.
#[derive(Debug, Clone)]
struct Keys {
    after: Option<Key>,
    upto: Option<Key>,
}

impl Keys {
    fn contains(&self, key: &[u8]) -> bool {
        self.after.as_deref().is_none_or(|a| key > a)
            && self.upto.as_deref().is_none_or(|u| key <= u)
    }
}

/// The open chunk: between its low watermark and its high one.
struct Window {
    chunk: u64,
    range: Range,
    keys: Keys,
    /// Transactions the stream met between the previous low watermark and
    /// this one: any the read's snapshot misses makes the read void.
    before_low: HashSet<u32>,
    /// Keys changed inside the window: their rows read are dropped.
    dirty: HashSet<Key>,
    /// Those changes, for silver after the chunk's rows.
    held: Vec<Arc<Change>>,
    /// A TRUNCATE inside the window: no row read counts.
    truncated: bool,
}

/// The reader beside the stream.
struct Reader {
    chunks: mpsc::Receiver<Chunk>,
    again: Option<mpsc::UnboundedSender<Range>>,
    task: JoinHandle<Result<()>>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A table's backfill while it runs.
pub(super) struct Backfill {
    run: String,
    /// The table as the backfill began: its key's columns and types,
    /// which chunk bounds are parsed as (a change of either resyncs).
    relation: Arc<RelationInfo>,
    progress: Progress,
    /// `progress.applied` in key order.
    applied: Vec<Keys>,
    window: Option<Window>,
    /// Transactions the stream met since the last low watermark.
    commits: HashSet<u32>,
    /// The progress changed since the last commit.
    changed: bool,
    /// When this run's first chunk came, and the rows applied then; when
    /// progress was last logged.
    started: Option<(Instant, u64)>,
    logged: Instant,
    reader: Option<Reader>,
}

/// Where a change of a key goes in silver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    Apply,
    /// Into the open window, for silver at its end.
    Hold,
    /// Nowhere: the key's range is read later.
    Leave,
}

/// What silver does with a change of a table under backfill.
pub(super) enum Plan {
    /// As [`Route`] says, for the change whole.
    Whole(Route),
    /// An update that moved a row between ranges routed apart: the
    /// delete of its old key and the insert of its new one, each routed.
    Split {
        delete: (Route, Arc<Change>),
        insert: (Route, Arc<Change>),
    },
}

impl Backfill {
    /// A backfill from `progress` (a new one: nothing applied).
    pub(super) fn new(
        progress: Progress,
        silver: &SilverTable,
        relation: Arc<RelationInfo>,
    ) -> Result<Backfill> {
        let applied = progress
            .applied
            .iter()
            .map(|r| keys(silver, &relation, r))
            .collect::<Result<_>>()?;
        Ok(Backfill {
            run: uuid::Uuid::new_v4().to_string(),
            relation,
            progress,
            applied,
            window: None,
            commits: HashSet::new(),
            changed: false,
            started: None,
            logged: Instant::now(),
            reader: None,
        })
    }

    /// Starts the reader of what is left, on a connection of its own.
    pub(super) fn start(&mut self, config: &PgConfig, table: &TableName) {
        let (gaps, next) = self.progress.left();
        let (out, chunks) = mpsc::channel(1);
        let (again, asked) = mpsc::unbounded_channel();
        let plan = ReadPlan {
            table: table.clone(),
            run: self.run.clone(),
            chunk_rows: self.progress.chunk_rows,
            gaps,
            next,
        };
        tracing::info!(%table, rows = self.progress.rows, ranges_applied = self.progress.applied.len(), "backfill reads the table in chunks beside the stream");
        // Told apart in pg_stat_activity.
        let mut config = config.clone();
        config.application_name = format!("{} backfill", config.application_name);
        let task = tokio::spawn(backfill::read(config, plan, asked, out));
        self.reader = Some(Reader {
            chunks,
            again: Some(again),
            task,
        });
    }

    /// Whether the reader still reads: the stream does not end idle.
    pub(super) fn reading(&self) -> bool {
        self.reader.is_some() && !self.progress.done
    }

    pub(super) fn committed(&mut self, xid: u32) {
        if self.reader.is_some() {
            self.commits.insert(xid);
        }
    }

    fn route(&mut self, key: Key) -> Route {
        if let Some(window) = self.window.as_mut().filter(|w| w.keys.contains(&key)) {
            window.dirty.insert(key);
            return Route::Hold;
        }
        match self.applied.iter().any(|k| k.contains(&key)) {
            true => Route::Apply,
            false => Route::Leave,
        }
    }

    /// Where silver takes `change`.
    pub(super) fn plan(&mut self, silver: &SilverTable, change: &Change) -> Result<Plan> {
        let new_key = match &change.after {
            Some(after) => Some(silver.key_of(change, after)?),
            None => None,
        };
        let old_key = match &change.before {
            Some(before) => Some(silver.key_of(change, &before.row)?),
            None => None,
        };
        Ok(match (change.op, old_key, new_key) {
            (Op::Truncate, ..) => {
                if let Some(window) = &mut self.window {
                    window.truncated = true;
                    window.held.clear();
                }
                Plan::Whole(Route::Apply)
            }
            (_, Some(old), Some(new)) if old != new => {
                let (delete, insert) = (self.route(old), self.route(new));
                if delete == insert {
                    Plan::Whole(delete)
                } else {
                    let (delete_half, insert_half) = split(change);
                    Plan::Split {
                        delete: (delete, Arc::new(delete_half)),
                        insert: (insert, Arc::new(insert_half)),
                    }
                }
            }
            (_, _, Some(key)) | (_, Some(key), None) => Plan::Whole(self.route(key)),
            (_, None, None) => Plan::Whole(Route::Apply),
        })
    }

    /// Holds a change of the open window for silver.
    pub(super) fn hold(&mut self, change: Arc<Change>) {
        if let Some(window) = &mut self.window {
            window.held.push(change);
        }
    }

    /// The next thing the reader handed over.
    async fn next_chunk(&mut self, table: &TableName) -> Result<Chunk> {
        let reader = self.reader.as_mut().ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                "a backfill watermark came with no reader",
            )
            .with_context("table", table)
        })?;
        if let Some(chunk) = reader.chunks.recv().await {
            return Ok(chunk);
        }
        let ended = (&mut reader.task).await;
        Err(match ended {
            Ok(Err(e)) => e,
            _ => Error::new(
                ErrorKind::Connection,
                "the backfill's reader ended before its last chunk",
            ),
        }
        .with_context("table", table))
    }

    fn apply_range(&mut self, range: Range, keys: Keys, rows: u64) {
        let at = self
            .applied
            .iter()
            .position(|k| match (&k.after, &keys.after) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(a), Some(b)) => a > b,
            })
            .unwrap_or(self.applied.len());
        self.applied.insert(at, keys);
        self.progress.applied.insert(at, range);
        // Adjacent ranges merge: each one's end is the next one's start.
        let mut i = 0;
        while i + 1 < self.applied.len() {
            if self.progress.applied[i].upto.is_some()
                && self.progress.applied[i].upto == self.progress.applied[i + 1].after
            {
                let next = self.progress.applied.remove(i + 1);
                self.progress.applied[i].upto = next.upto;
                let next = self.applied.remove(i + 1);
                self.applied[i].upto = next.upto;
            } else {
                i += 1;
            }
        }
        self.progress.rows += rows;
        self.progress.done = self.progress.applied == [Range::WHOLE];
        if self.progress.done
            && let Some(reader) = &mut self.reader
        {
            // Nothing left to ask for: the reader ends.
            reader.again = None;
        }
        self.changed = true;
    }

    /// A log line on the backfill's progress every few seconds, and when
    /// it is done: rows, the estimate, rate and time left.
    fn log_progress(&mut self, table: &TableName) {
        let now = Instant::now();
        let (since, rows_then) = *self.started.get_or_insert((now, self.progress.rows));
        if !self.progress.done && now < self.logged + PROGRESS_EVERY {
            return;
        }
        self.logged = now;
        let rows = self.progress.rows;
        let rate = (rows - rows_then) as f64 / (now - since).as_secs_f64().max(0.001);
        let estimate = self.progress.estimate;
        tracing::info!(
            %table,
            rows,
            estimate,
            percent = estimate.filter(|&e| e > 0).map(|e| (rows as f64 * 1000.0 / e as f64).round() / 10.0),
            rows_per_second = rate.round(),
            seconds_left = estimate.map(|e| (e.saturating_sub(rows) as f64 / rate.max(1.0)).round()),
            done = self.progress.done,
            "backfill progress"
        );
    }

    fn read_again(&mut self, range: Range) {
        if let Some(again) = self.reader.as_ref().and_then(|r| r.again.as_ref()) {
            // A reader gone is told by its chunks' channel.
            let _ = again.send(range);
        }
    }
}

/// Ends a backfill not done for a reload of the whole table (a resync):
/// its commits record the backfill done and silver complete.
pub(super) async fn end_with_reload(
    lake: &Lake,
    (bronze, table): (&mut BronzeTable, &iceberg::table::Table),
    silver: &mut SilverTable,
    progress: Progress,
) -> Result<()> {
    let done = Progress {
        done: true,
        ..progress
    };
    stage_progress(lake, (bronze, table), silver, &done).await
}

/// Stages `progress` into bronze's properties, and once it is done the
/// end of silver's mark.
async fn stage_progress(
    lake: &Lake,
    (bronze, table): (&mut BronzeTable, &iceberg::table::Table),
    silver: &mut SilverTable,
    progress: &Progress,
) -> Result<()> {
    let text = serde_json::to_string(progress).expect("progress serializes");
    bronze.stage_schema(
        table,
        vec![TableUpdate::SetProperties {
            updates: [(PROGRESS.to_owned(), text)].into(),
        }],
    );
    if progress.done {
        let table = silver.table(lake).await?;
        silver.stage_schema(
            &table,
            vec![TableUpdate::RemoveProperties {
                removals: vec![INCOMPLETE.0.to_owned()],
            }],
        );
    }
    Ok(())
}

/// A range's keys in silver's encoding.
fn keys(silver: &SilverTable, relation: &RelationInfo, range: &Range) -> Result<Keys> {
    let encode = |bound: &Option<Bound>| -> Result<Option<Key>> {
        let Some(bound) = bound else { return Ok(None) };
        let names = relation_key_names(relation);
        let named: Vec<(&str, &str)> = names
            .iter()
            .map(String::as_str)
            .zip(bound.iter().map(String::as_str))
            .collect();
        silver.key_of_text(relation, &named).map(Some)
    };
    Ok(Keys {
        after: encode(&range.after)?,
        upto: encode(&range.upto)?,
    })
}

/// The primary-key columns of `relation`, in column order: the order of
/// a chunk bound's values (`pg::source::chunk::chunk_key`).
fn relation_key_names(relation: &RelationInfo) -> Vec<String> {
    relation
        .columns
        .iter()
        .filter(|c| c.is_primary_key)
        .map(|c| c.name.clone())
        .collect()
}

/// An update that moved its row to another key, as a delete of the old
/// key and an insert of the new.
fn split(change: &Change) -> (Change, Change) {
    let mut delete = change.clone();
    delete.op = Op::Delete;
    delete.after = None;
    let mut insert = change.clone();
    insert.op = Op::Insert;
    insert.before = None;
    (delete, insert)
}

impl Pipeline<'_> {
    /// Whether a backfill reads beside the stream still.
    pub(super) fn backfilling(&self) -> bool {
        self.sinks
            .values()
            .any(|s| s.backfill.as_ref().is_some_and(Backfill::reading))
    }

    /// Begins the backfill of `relations`' tables, which a new slot's load
    /// left out: their first commit, at the slot's consistent point, records
    /// nothing applied and marks silver incomplete.
    pub(crate) async fn begin_backfills(
        &mut self,
        relations: &[RelationInfo],
        chunk_rows: usize,
    ) -> Result<()> {
        for relation in relations {
            self.ensure_sink(relation).await?;
            let sink = self
                .sinks
                .get_mut(&relation.name)
                .expect("ensure_sink just ran");
            let Some(silver) = sink.silver.as_mut() else {
                continue;
            };
            let progress = Progress {
                applied: Vec::new(),
                rows: 0,
                estimate: None,
                chunk_rows: chunk_rows as u64,
                done: false,
            };
            let mut backfill = Backfill::new(progress, silver, Arc::new(relation.clone()))?;
            backfill.changed = true;
            let table = silver.table(&self.lake).await?;
            silver.stage_schema(
                &table,
                vec![TableUpdate::SetProperties {
                    updates: [(INCOMPLETE.0.to_owned(), INCOMPLETE.1.to_owned())].into(),
                }],
            );
            sink.backfill = Some(backfill);
        }
        Ok(())
    }

    /// Starts the reader of every table whose backfill is not done.
    pub(crate) fn start_backfills(&mut self, config: &PgConfig) {
        for (table, sink) in &mut self.sinks {
            if let Some(backfill) = sink.backfill.as_mut().filter(|b| !b.progress.done) {
                backfill.start(config, table);
            }
        }
    }

    /// A watermark of a backfill's reader: its chunk's window opens at the
    /// low one and its rows are taken at the high one. Watermarks of
    /// another run's reader (a replay after a restart) are passed by.
    pub(super) async fn watermark(&mut self, tx: TxInfo, lsn: Lsn, content: &[u8]) -> Result<()> {
        let Some(mark) = Watermark::parse(content) else {
            tracing::warn!(%lsn, "a backfill watermark is not one wal2iceberg wrote: ignored");
            return Ok(());
        };
        let table = TableName {
            schema: mark.schema,
            name: mark.name,
        };
        let Some(sink) = self.sinks.get_mut(&table) else {
            return Ok(());
        };
        let (Some(backfill), Some(silver)) = (sink.backfill.as_mut(), sink.silver.as_ref()) else {
            return Ok(());
        };
        if backfill.run != mark.run || backfill.reader.is_none() {
            return Ok(());
        }
        let chunk = backfill.next_chunk(&table).await?;
        match (chunk, mark.high) {
            (Chunk::Planned { chunk, range }, false) if chunk == mark.chunk => {
                let keys = keys(silver, &backfill.relation, &range)?;
                backfill.window = Some(Window {
                    chunk,
                    range,
                    keys,
                    before_low: std::mem::take(&mut backfill.commits),
                    dirty: HashSet::new(),
                    held: Vec::new(),
                    truncated: false,
                });
                Ok(())
            }
            (
                Chunk::Read {
                    chunk,
                    rows,
                    snapshot,
                    estimate,
                },
                true,
            ) if chunk == mark.chunk => {
                backfill.progress.estimate = estimate.or(backfill.progress.estimate);
                let window = backfill
                    .window
                    .take()
                    .filter(|w| w.chunk == chunk)
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::Protocol,
                            "a chunk's rows came with no window open",
                        )
                        .with_context("table", &table)
                    })?;
                let missed = window.before_low.iter().any(|&xid| snapshot.misses(xid));
                let relation = rows.first().map(|r| r.relation.clone());
                let moved = relation.as_ref().is_some_and(|read| {
                    sink.silver_relation
                        .as_ref()
                        .is_some_and(|r| r.columns != read.columns)
                        || window
                            .held
                            .iter()
                            .any(|c| c.relation.columns != read.columns)
                });
                if missed || moved {
                    tracing::info!(%table, chunk, missed, schema_changed = moved, "a chunk's read is void and is read again");
                    backfill.read_again(window.range);
                    return Ok(());
                }
                self.take_chunk(&table, tx, lsn, window, rows).await
            }
            _ => Err(Error::new(
                ErrorKind::Protocol,
                "a backfill watermark does not match its reader's chunk",
            )
            .with_context("table", &table)
            .with_context("lsn", lsn)),
        }
    }

    /// The rows of a chunk whose window closed at `lsn` of `tx`: those of
    /// keys not dirty into both tables, the window's changes into silver
    /// after them.
    async fn take_chunk(
        &mut self,
        table: &TableName,
        tx: TxInfo,
        lsn: Lsn,
        window: Window,
        rows: Vec<crate::cdc::snapshot::LoadRows>,
    ) -> Result<()> {
        let lake = &self.lake;
        let sink = self
            .sinks
            .get_mut(table)
            .expect("the watermark found the sink");
        let mut seq = 0;
        let mut taken = 0u64;
        for run in &rows {
            sink.follow(lake, &run.relation, Some(Mode::Bronze), Some(Mode::Silver))
                .await?;
            let mut changes = Vec::with_capacity(run.rows.len());
            run.for_each_row(tx.commit_lsn, |row| {
                changes.push(Change {
                    op: Op::Read,
                    relation: run.relation.clone(),
                    tx,
                    seq: 0,
                    lsn,
                    before: None,
                    after: Some(row),
                    truncate_options: 0,
                });
            })?;
            for mut change in changes {
                if window.truncated {
                    continue;
                }
                let silver = sink.silver.as_mut().expect("a backfill has silver");
                let after = change.after.as_deref().unwrap_or_default();
                if window.dirty.contains(&silver.key_of(&change, after)?) {
                    continue;
                }
                change.seq = seq;
                seq += 1;
                stage_read(lake, sink, Arc::new(change)).await?;
                taken += 1;
            }
        }
        let silver = sink.silver.as_mut().expect("a backfill has silver");
        for change in window.held {
            let bytes = change.approx_bytes();
            silver.stage(lake, change, bytes).await?;
        }
        sink.silver_dirty = true;
        sink.bronze_dirty = true;
        self.batch_changes += taken as usize;
        let backfill = sink
            .backfill
            .as_mut()
            .expect("the watermark found the backfill");
        backfill.apply_range(window.range, window.keys, taken);
        metrics().backfill_chunk(&table.to_string(), taken, backfill.progress.estimate);
        tracing::debug!(
            %table,
            chunk = window.chunk,
            rows = taken,
            dropped = window.dirty.len(),
            rows_so_far = backfill.progress.rows,
            done = backfill.progress.done,
            "backfill chunk taken"
        );
        backfill.log_progress(table);
        Ok(())
    }

    /// Stages every backfill's progress that changed into the open batch:
    /// bronze's record, and silver's mark gone once it is complete.
    pub(super) async fn stage_backfill_progress(&mut self) -> Result<()> {
        for sink in self.sinks.values_mut() {
            let (Some(backfill), Some(silver)) = (sink.backfill.as_mut(), sink.silver.as_mut())
            else {
                continue;
            };
            if !std::mem::take(&mut backfill.changed) {
                continue;
            }
            let bronze = sink.bronze.table(&self.lake).await?;
            stage_progress(
                &self.lake,
                (&mut sink.bronze, &bronze),
                silver,
                &backfill.progress,
            )
            .await?;
            sink.bronze_dirty = true;
            if backfill.progress.done {
                sink.silver_dirty = true;
                sink.backfill = None;
            }
        }
        Ok(())
    }
}

impl TableSink {
    /// Holds or stages for silver what `plan` says of `change`, which
    /// bronze took.
    pub(super) async fn take_backfilled(
        &mut self,
        lake: &Lake,
        plan: Plan,
        change: &Arc<Change>,
    ) -> Result<()> {
        let halves = match plan {
            Plan::Whole(Route::Hold) => vec![(Route::Hold, change.clone())],
            Plan::Whole(_) => Vec::new(),
            Plan::Split { delete, insert } => vec![delete, insert],
        };
        for (route, half) in halves {
            match route {
                Route::Apply => {
                    if let Some(silver) = self.silver.as_mut() {
                        let bytes = half.approx_bytes();
                        silver.stage(lake, half, bytes).await?;
                        self.silver_dirty = true;
                    }
                }
                Route::Hold => {
                    if let Some(backfill) = self.backfill.as_mut() {
                        backfill.hold(half);
                    }
                }
                Route::Leave => {}
            }
        }
        Ok(())
    }
}

/// A row a chunk read, into both tables.
async fn stage_read(lake: &Lake, sink: &mut TableSink, change: Arc<Change>) -> Result<()> {
    let bytes = change.approx_bytes();
    sink.bronze.stage(lake, change.clone(), bytes).await?;
    if let Some(silver) = sink.silver.as_mut() {
        silver.stage(lake, change, bytes).await?;
    }
    *sink.ops.entry(Op::Read.code()).or_default() += 1;
    Ok(())
}
