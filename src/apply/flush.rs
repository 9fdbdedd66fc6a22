//! The commit of the open batch. Every table the batch staged something
//! for gets a snapshot: all of them in one catalog commit by default
//! (`atomic_commits`), so a reader never sees one table of a source
//! transaction without another, nor bronze without silver; or table by
//! table, bronze then silver, each table recording the position it holds.
//! Then what follows a commit: positions, compaction, expiry, metrics.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::future::try_join;
use iceberg::TableIdent;

use super::pipeline::Pipeline;
use super::sink::TableSink;
use crate::error::{Error, Result};
use crate::failpoint;
use crate::lake::catalog::row_delta::{RowDelta, Written, commit_row_deltas};
use crate::lake::each_table;
use crate::lake::files::writer::Position;
use crate::lake::maintenance::compaction::{Merge, merge_small_files};
use crate::metrics::{metrics, now_micros};
use crate::model::TableName;

/// A table's delta, and the source table whose silver it is.
type Staged = (TableIdent, RowDelta, Option<TableName>);

impl TableSink {
    /// Whether the open batch gives bronze, and silver, a snapshot: what
    /// it staged, or a table not yet loaded, whose empty load marks it
    /// loaded.
    fn wants_commit(&self) -> Wanted {
        Wanted {
            bronze: self.bronze_dirty || self.bronze_at.is_none(),
            silver: self.silver.is_some() && (self.silver_dirty || self.silver_at.is_none()),
        }
    }
}

/// Which of a source table's two tables the open batch gives a snapshot.
struct Wanted {
    bronze: bool,
    silver: bool,
}

impl Pipeline<'_> {
    /// Commits the open batch, then does what follows each commit; whether
    /// a bronze table recorded the batch's end (a resync's commit leaves
    /// bronze's position where it was).
    pub(super) async fn flush(&mut self) -> Result<bool> {
        let Some(position) = self.batch_end.take() else {
            return Ok(false);
        };
        self.stage_backfill_progress().await?;
        let m = metrics();
        self.committed.clear();
        // A resync commits on its own: its silver replaces every row.
        let mut resynced = HashSet::new();
        for (table, sink) in &mut self.sinks {
            if let Some(id) = sink.resync.take() {
                let compacted = sink
                    .commit_resync(&self.lake, position, &id, self.compact_after_files)
                    .await?;
                sink.commits_since_expiry += 1;
                sink.housekeeping(&self.lake, table, compacted, self.retention)
                    .await;
                resynced.insert(table.clone());
            }
        }
        let recorded = self
            .sinks
            .iter()
            .any(|(table, sink)| !resynced.contains(table) && sink.wants_commit().bronze);
        let written = if self.atomic_commits {
            self.commit_together(position, &resynced).await?
        } else {
            self.commit_each(position, &resynced).await?
        };
        for (table, written) in written.into_iter().filter(|(_, w)| w.files > 0) {
            self.committed.entry(table).or_default().written += written;
        }
        for (table, sink) in &mut self.sinks {
            if resynced.contains(table) {
                continue;
            }
            let Wanted { bronze, silver } = sink.wants_commit();
            let mut compacted = false;
            if bronze {
                sink.bronze_at = Some(position);
                sink.bronze_dirty = false;
                sink.bronze_commits += 1;
                if self.compact_after_files > 0 && sink.bronze_commits >= self.compact_after_files {
                    compacted |= merge_small_files(&self.lake, sink.bronze.ident(), Merge::Tiered)
                        .await?
                        .is_some();
                    sink.bronze_commits = 0;
                }
            }
            if silver {
                sink.silver_at = Some(position);
                sink.silver_dirty = false;
                if let Some(silver) = &mut sink.silver {
                    compacted |= silver
                        .compact(&self.lake, self.compact_after_files)
                        .await?
                        .is_some();
                }
            }
            // A table without silver: bronze's commit is the table's.
            if silver || (sink.silver.is_none() && bronze) {
                sink.commits_since_expiry += 1;
                sink.housekeeping(&self.lake, table, compacted, self.retention)
                    .await;
            }
        }
        let now = now_micros();
        for commit_ts in self.batch_commit_times.drain(..) {
            let micros = u64::try_from(now - commit_ts).unwrap_or(0);
            m.observe_commit_to_visible(Duration::from_micros(micros));
        }
        m.last_source_commit_micros
            .fetch_max(position.commit_ts, Ordering::Relaxed);
        m.oldest_pending_commit_micros.store(0, Ordering::Relaxed);
        for (table, sink) in &mut self.sinks {
            let name = table.to_string();
            for (op, n) in sink.ops.drain() {
                m.add_changes(&name, op, n);
                *self
                    .committed
                    .entry(table.clone())
                    .or_default()
                    .ops
                    .entry(op)
                    .or_default() += n;
            }
        }
        if self.batch_changes > 0 {
            self.report.changes_applied += self.batch_changes as u64;
            self.report.batches += 1;
            self.batch_changes = 0;
            self.batch_bytes = 0;
        }
        Ok(recorded)
    }

    /// Every table's snapshot in one catalog commit.
    async fn commit_together(
        &mut self,
        position: Position,
        resynced: &HashSet<TableName>,
    ) -> Result<Vec<(TableName, Written)>> {
        // The tables' files are written at once: on object storage a flush otherwise
        // waits for one upload after another.
        let lake = &self.lake;
        let prepared = self
            .sinks
            .iter_mut()
            .filter(|(table, _)| !resynced.contains(*table));
        let prepared = prepared.map(|(table, sink)| async move {
            let Wanted { bronze, silver } = sink.wants_commit();
            let TableSink {
                bronze: bronze_table,
                silver: silver_table,
                ..
            } = sink;
            let bronze = async {
                if !bronze {
                    return Result::<Option<Staged>>::Ok(None);
                }
                let delta = bronze_table.prepare_commit(lake, position).await?;
                Ok(Some((bronze_table.ident().clone(), delta, None)))
            };
            let silver = async {
                let Some(silver) = silver_table.as_mut().filter(|_| silver) else {
                    return Result::<Option<Staged>>::Ok(None);
                };
                let delta = silver.prepare_commit(lake, position).await?;
                Ok(Some((silver.ident().clone(), delta, Some(table.clone()))))
            };
            let (bronze, silver) = try_join(bronze, silver).await?;
            let written = [&bronze, &silver]
                .into_iter()
                .flatten()
                .map(|(_, delta, _)| delta.written())
                .fold(Written::default(), |mut sum, w| {
                    sum += w;
                    sum
                });
            Ok::<_, Error>(((table.clone(), written), [bronze, silver]))
        });
        let (written, staged): (Vec<_>, Vec<_>) = each_table(prepared).await?.into_iter().unzip();
        let staged: Vec<Staged> = staged.into_iter().flatten().flatten().collect();
        if staged.is_empty() {
            return Ok(Vec::new());
        }
        let deltas: Vec<(&TableIdent, &RowDelta)> = staged.iter().map(|(i, d, _)| (i, d)).collect();
        let committed = commit_row_deltas(&self.lake, &deltas).await?;
        for ((_, delta, source), table) in staged.iter().zip(&committed) {
            let silver = source
                .as_ref()
                .and_then(|source| self.sinks.get_mut(source))
                .and_then(|sink| sink.silver.as_mut());
            if let Some(silver) = silver {
                silver.committed(table, delta.replace_all);
            }
        }
        Ok(written)
    }

    /// Each table's snapshot in a commit of its own, bronze then silver:
    /// a crash between them leaves each table at the position it records,
    /// and the next run gives each what it lacks.
    async fn commit_each(
        &mut self,
        position: Position,
        resynced: &HashSet<TableName>,
    ) -> Result<Vec<(TableName, Written)>> {
        let mut all = Vec::new();
        for (table, sink) in &mut self.sinks {
            if resynced.contains(table) {
                continue;
            }
            let Wanted { bronze, silver } = sink.wants_commit();
            let mut written = Written::default();
            if bronze {
                let evolved = sink.bronze.schema_staged();
                written += sink.bronze.commit(&self.lake, position).await?;
                if evolved {
                    failpoint::hit("mid-schema-change");
                }
                failpoint::hit("between-bronze-and-silver");
            }
            if let Some(table) = sink.silver.as_mut().filter(|_| silver) {
                written += table.commit(&self.lake, position).await?;
            }
            all.push((table.clone(), written));
        }
        Ok(all)
    }
}
