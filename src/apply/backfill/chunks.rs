//! The pipeline's side of a backfill: its tables begun and their
//! readers started, the watermarks the stream meets, and a chunk's rows
//! taken at its high one.

use std::collections::HashSet;
use std::sync::Arc;

use iceberg::TableUpdate;

use super::progress::stage_progress;
use super::{Backfill, Chunk, INCOMPLETE, Plan, Progress, Route, Window, keys};
use crate::apply::pipeline::Pipeline;
use crate::apply::sink::TableSink;
use crate::cdc::backfill::Watermark;
use crate::cdc::event::{Change, Op, TxInfo};
use crate::cdc::relation::RelationInfo;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::schema::evolve::Mode;
use crate::metrics::metrics;
use crate::model::{Lsn, TableName};
use crate::pg::config::PgConfig;

impl Pipeline<'_> {
    /// Whether a backfill reads beside the stream still.
    pub(in crate::apply) fn backfilling(&self) -> bool {
        self.sinks
            .values()
            .any(|s| s.backfill.as_ref().is_some_and(Backfill::reading))
    }

    /// Begins the backfill of `relations`' tables, which the lake lacks (a
    /// new slot's load left them out, or they joined the table set) or a
    /// resync reloads: silver is emptied and marked incomplete, recording
    /// nothing applied, in their first commit, which also records a resync
    /// done. Silver's rows and the record of them change in one commit,
    /// so a silver an earlier try left is emptied too. A resync's silver
    /// commits so at once, before bronze records the request done: a crash
    /// between them resyncs again, never leaves old rows unrecorded.
    pub(crate) async fn begin_backfills(
        &mut self,
        relations: &[RelationInfo],
        chunk_rows: usize,
    ) -> Result<()> {
        for relation in relations {
            let request = self.resyncing.remove(&relation.name);
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
            silver.delete_all();
            let table = silver.table(&self.lake).await?;
            silver.stage_schema(
                &table,
                vec![TableUpdate::SetProperties {
                    updates: [(INCOMPLETE.0.to_owned(), INCOMPLETE.1.to_owned())].into(),
                }],
            );
            let mut backfill = Backfill::new(progress, silver, Arc::new(relation.clone()))?;
            match (&request, sink.silver_at) {
                (Some(id), Some(at)) => {
                    tracing::info!(table = %relation.name, request = %id, "resyncing in chunks: silver is emptied now and filled again, marked incomplete until done");
                    stage_progress(&self.lake, silver, &backfill.progress).await?;
                    silver.commit(&self.lake, at).await?;
                }
                _ => backfill.changed = true,
            }
            backfill.request = request;
            sink.backfill = Some(backfill);
        }
        Ok(())
    }

    /// Starts the reader of every table whose backfill is not done, each
    /// on up to `connections` connections.
    pub(crate) fn start_backfills(&mut self, config: &PgConfig, connections: usize) {
        for (table, sink) in &mut self.sinks {
            if let Some(backfill) = sink.backfill.as_mut().filter(|b| !b.progress.done) {
                backfill.start(config, table, connections);
            }
        }
    }

    /// A watermark of a backfill's reader: its chunk's window opens at the
    /// low one, and closes at the high one, its rows taken, unless an
    /// earlier chunk's window is open still: windows close in chunk order.
    /// Watermarks of another run's reader (a replay after a restart) are
    /// passed by.
    pub(in crate::apply) async fn watermark(
        &mut self,
        tx: TxInfo,
        lsn: Lsn,
        content: &[u8],
    ) -> Result<()> {
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
        let mismatch = || {
            Error::new(
                ErrorKind::Protocol,
                "a backfill watermark does not match its reader's chunk",
            )
            .with_context("table", &table)
            .with_context("lsn", lsn)
        };
        match (backfill.next_chunk(&table).await?, mark.high) {
            (Chunk::Planned { chunk, range }, false) if chunk == mark.chunk => {
                let keys = keys(silver, &backfill.relation, &range)?;
                let window = Window {
                    range,
                    keys,
                    before_low: std::mem::take(&mut backfill.commits),
                    dirty: HashSet::new(),
                    held: Vec::new(),
                    truncated: false,
                    read: None,
                };
                backfill.windows.insert(chunk, window);
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
                if backfill
                    .windows
                    .first_key_value()
                    .is_some_and(|(&first, _)| first < chunk)
                {
                    tracing::debug!(%table, chunk, "a chunk's rows wait for an earlier chunk's window to close");
                }
                let window = backfill.windows.get_mut(&chunk).ok_or_else(mismatch)?;
                window.read = Some((rows, snapshot));
                self.close_windows(&table, tx, lsn).await
            }
            _ => Err(mismatch()),
        }
    }

    /// Closes the windows of `table` whose rows came, in chunk order, up to
    /// the first one still open, at `lsn` of `tx`: each read void is read
    /// again, each other one taken.
    async fn close_windows(&mut self, table: &TableName, tx: TxInfo, lsn: Lsn) -> Result<()> {
        loop {
            let sink = self
                .sinks
                .get_mut(table)
                .expect("the watermark found the sink");
            let backfill = sink
                .backfill
                .as_mut()
                .expect("the watermark found the backfill");
            let Some(entry) = backfill.windows.first_entry() else {
                return Ok(());
            };
            if entry.get().read.is_none() {
                return Ok(());
            }
            let (chunk, mut window) = entry.remove_entry();
            let (rows, snapshot) = window.read.take().expect("looked at above");
            let missed = window.before_low.iter().any(|&xid| snapshot.misses(xid));
            let relation = rows.first().map(|r| r.relation.clone());
            let moved = relation.as_ref().is_some_and(|read| {
                sink.silver_relation
                    .as_ref()
                    .is_some_and(|r| !same_columns(r, read))
                    || window.held.iter().any(|c| !same_columns(&c.relation, read))
            });
            if missed || moved {
                tracing::info!(%table, chunk, missed, schema_changed = moved, "a chunk's read is void and is read again");
                // The next snapshot must see them too: this one's check
                // vouches for none. That is the next window's, open or not
                // yet opened: windows close in chunk order.
                match backfill.windows.first_entry() {
                    Some(mut next) => next.get_mut().before_low.extend(window.before_low),
                    None => backfill.commits.extend(window.before_low),
                }
                backfill.read_again(window.range);
                continue;
            }
            self.take_chunk(table, tx, lsn, chunk, window, rows).await?;
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
        chunk: u64,
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
            chunk,
            rows = taken,
            dropped = window.dirty.len(),
            rows_so_far = backfill.progress.rows,
            done = backfill.progress.done,
            "backfill chunk taken"
        );
        backfill.log_progress(table);
        Ok(())
    }
}

/// Whether two descriptions of a table have the same columns, by name
/// and type (how the stream and the catalog mark keys may differ).
fn same_columns(a: &RelationInfo, b: &RelationInfo) -> bool {
    a.columns.len() == b.columns.len()
        && a.columns.iter().zip(&b.columns).all(|(x, y)| {
            (&x.name, x.type_oid, x.type_modifier) == (&y.name, y.type_oid, y.type_modifier)
        })
}

impl TableSink {
    /// Holds or stages for silver what `plan` says of `change`, which
    /// bronze took.
    pub(in crate::apply) async fn take_backfilled(
        &mut self,
        lake: &Lake,
        plan: Plan,
        change: &Arc<Change>,
    ) -> Result<()> {
        let halves = match plan {
            Plan::Whole(Route::Hold(chunk)) => vec![(Route::Hold(chunk), change.clone())],
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
                Route::Hold(chunk) => {
                    if let Some(backfill) = self.backfill.as_mut() {
                        backfill.hold(chunk, half);
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
