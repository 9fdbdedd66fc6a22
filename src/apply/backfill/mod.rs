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

mod chunks;
mod progress;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cdc::backfill::{self, Bound, Chunk, Range, ReadPlan, ReadSnapshot};
use crate::cdc::event::{Change, Op};
use crate::cdc::relation::RelationInfo;
use crate::cdc::snapshot::LoadRows;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::table::key::Key;
use crate::lake::table::silver::SilverTable;
use crate::model::TableName;
use crate::pg::config::PgConfig;
use crate::terminal;

pub(crate) use progress::INCOMPLETE;
pub(crate) use progress::Progress;
pub(super) use progress::end_with_reload;

/// How often the backfill's progress is logged at least.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

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

/// An open chunk: from its low watermark to its high one, or on to the
/// close of an earlier chunk's window still open then (a window may grow:
/// the keys changed in it are dropped from its read all the same).
struct Window {
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
    /// The chunk's rows and the snapshot they were read in, once its high
    /// watermark came.
    read: Option<(Vec<LoadRows>, ReadSnapshot)>,
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
    /// The open chunks' windows, by chunk.
    windows: BTreeMap<u64, Window>,
    /// Transactions the stream met since the last low watermark.
    commits: HashSet<u32>,
    /// The progress changed since the last commit.
    changed: bool,
    /// When this run's first chunk came, and the rows applied then; when
    /// progress was last logged.
    started: Option<(Instant, u64)>,
    logged: Instant,
    reader: Option<Reader>,
    /// The resync request this backfill does, for bronze to record done
    /// in the next batch.
    request: Option<String>,
    /// Its bar on an interactive terminal.
    bar: Option<indicatif::ProgressBar>,
}

/// Where a change of a key goes in silver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    Apply,
    /// Into the window of the chunk whose range holds the key, for silver
    /// at its close.
    Hold(u64),
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
            windows: BTreeMap::new(),
            commits: HashSet::new(),
            changed: false,
            started: None,
            logged: Instant::now(),
            reader: None,
            request: None,
            bar: None,
        })
    }

    /// Starts the reader of what is left, on up to `connections`
    /// connections of its own.
    pub(super) fn start(&mut self, config: &PgConfig, table: &TableName, connections: usize) {
        let (gaps, next) = self.progress.left();
        // Room for every read in flight and its range: the reader does not
        // wait for the stream to reach a watermark before the next read.
        let (out, chunks) = mpsc::channel(2 * connections);
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
        let task = tokio::spawn(backfill::read(config, plan, asked, out, connections));
        self.bar = terminal::backfill_bar(
            &table.to_string(),
            self.progress.rows,
            self.progress.estimate,
        );
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
        let open = self.windows.iter_mut().find(|(_, w)| w.keys.contains(&key));
        if let Some((&chunk, window)) = open {
            window.dirty.insert(key);
            return Route::Hold(chunk);
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
                for window in self.windows.values_mut() {
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

    /// Holds a change of chunk `chunk`'s window for silver.
    pub(super) fn hold(&mut self, chunk: u64, change: Arc<Change>) {
        if let Some(window) = self.windows.get_mut(&chunk) {
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
    /// it is done: rows, the estimate, rate and time left; the bar at each
    /// chunk.
    fn log_progress(&mut self, table: &TableName) {
        if let Some(bar) = &self.bar {
            let rows = self.progress.rows;
            bar.set_length(self.progress.estimate.unwrap_or(0).max(rows));
            bar.set_position(rows);
            if self.progress.done {
                bar.finish();
            }
        }
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
            percent = self.progress.percent().map(|p| (p * 10.0).round() / 10.0),
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

/// A range's keys in silver's encoding.
fn keys(silver: &SilverTable, relation: &RelationInfo, range: &Range) -> Result<Keys> {
    let names = relation_key_names(relation);
    let encode = |bound: &Option<Bound>| -> Result<Option<Key>> {
        let Some(bound) = bound else { return Ok(None) };
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
