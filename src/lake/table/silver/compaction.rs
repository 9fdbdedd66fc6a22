//! Compaction of silver: small data files and data files that lost many
//! rows are rewritten, live rows only, into new files; the position
//! deletes that still apply to the files kept are merged into one delete
//! file; every delete file before it is retired. One snapshot
//! (`row_delta`, a rewrite) makes it visible, and the key index moves to
//! the new positions in the same step.
//!
//! It runs inside the pipeline right after a commit, when nothing is
//! staged, so it never races the apply path; a crash before its commit
//! leaves the table as it was (the files it wrote are orphans) and the
//! next run compacts again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_select::filter::filter_record_batch;
use iceberg::spec::{DataFile, ManifestContentType};
use iceberg::table::Table;

use super::{Key, SilverTable, follows, lake_error, planned_files, read_parquet};
use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;
use crate::lake::catalog::Lake;
use crate::lake::catalog::row_delta::{RowDelta, commit_rewrite};
use crate::lake::files::align::align;
use crate::lake::files::position_deletes::{DeleteReader, DeleteWriter, Deleted, Merged};
use crate::lake::files::writer::{DataFileSink, Position};
use crate::lake::maintenance::compaction::{
    Compacted, MAX_REWRITE_BYTES, Merge, live_files_in_commit_order, small_files_to_merge,
};
use crate::lake::table::key_index::FileRows;

/// A data file that lost at least this share of its rows is rewritten:
/// a reader then scans at most 1 / (1 - 0.4) = 1.7 times the live rows of
/// a file, within the two times a freshly written table's scan that
/// docs/benchmarks.md allows, and a file is not rewritten again and again
/// while random updates thin it.
pub(crate) const DELETE_RATIO: f64 = 0.4;
/// Live rows of thinned files one compaction rewrites at most (but always
/// one such file), so that no compaction holds up the stream for long;
/// the rest waits for the next.
pub(crate) const MAX_THINNED_ROWS: u64 = 1 << 19;

/// Live rows of small files one compaction merges at most: it holds every
/// rewritten row's key and new place until its commit, so this bounds its
/// memory whatever the table's size (a large transaction leaves many small
/// files behind).
pub(crate) const MAX_MERGED_ROWS: u64 = 1 << 19;

/// The live data files of the table, as the scan plans them, and its live
/// delete files.
struct Layout {
    /// Path, rows, bytes.
    data: Vec<(String, u64, u64)>,
    /// The delete files that apply to each data file, by its path.
    applying: HashMap<String, Vec<String>>,
    /// Path, bytes.
    deletes: HashMap<String, u64>,
}

impl SilverTable {
    /// Compacts when at least `after_files` (not 0) commits wrote files
    /// since the last compaction (or the start). Call only right after
    /// [`Self::commit`].
    pub async fn compact(&mut self, lake: &Lake, after_files: usize) -> Result<Option<Compacted>> {
        let due = after_files > 0 && self.files.commits >= after_files;
        if !due {
            return Ok(None);
        }
        self.compact_now(lake, Merge::Tiered).await
    }

    /// Compacts what the policy picks now, however few commits came since
    /// the last compaction (`wal2iceberg compact`); `None` when nothing
    /// is worth rewriting.
    pub async fn compact_now(&mut self, lake: &Lake, merge: Merge) -> Result<Option<Compacted>> {
        if !(self.pending.is_empty()
            && self.written.is_empty()
            && self.deletes.is_empty()
            && self.schema_changes.is_empty()
            && !self.replace_all)
        {
            return Err(lake_error(
                "compaction asked for while changes are staged",
                &self.ident,
            ));
        }
        let table = lake.catalog_table(&self.ident).await?;
        let layout = layout(&table).await?;
        let Some(choice) = Choice::of(&layout, &self.index.live_per_file(), merge) else {
            self.files.commits = 0;
            return Ok(None);
        };
        let Some(mut deletes) = merge_deletes(&table, &layout, &choice).await? else {
            self.files.commits = 0;
            return Ok(None);
        };
        let (added, moves, rows_rewritten) = self
            .rewrite_rows(&table, &choice.rewrite, &mut deletes.deleted)
            .await?;
        let merged: Vec<_> = deletes.merged.into_iter().collect();
        failpoint::hit("compaction-written");
        let done = Compacted {
            rows_rewritten,
            data_files_removed: choice.removed_data.len(),
            data_files_added: added.len(),
            delete_files_removed: choice.merging.len(),
            delete_files_added: merged.len(),
        };
        let delta = RowDelta {
            data_files: added,
            delete_files: merged,
            removed: choice
                .removed_data
                .iter()
                .cloned()
                .chain(choice.merging)
                .collect(),
            properties: Position::of(&table)?
                .map(Position::summary)
                .unwrap_or_default(),
            built_on: self.built_on,
            ..RowDelta::default()
        };
        let Some(committed) = commit_rewrite(lake, &table, &delta).await? else {
            // Another writer committed since the table was read: nothing
            // changed, and the next compaction waits for more files.
            tracing::warn!(table = %self.ident, "another writer committed during the compaction; it is left for later");
            self.files.commits = 0;
            return Ok(None);
        };
        // The rows moved: the index follows only once that is committed.
        let old: Vec<&str> = choice.removed_data.iter().map(String::as_str).collect();
        self.index
            .move_files(&old, moves)
            .map_err(|e| e.with_context("table", &self.ident))?;
        self.exact_at = follows(self.exact_at, &committed);
        self.built_on = committed.metadata().current_snapshot_id();
        self.files.data = layout.data.len() - done.data_files_removed + done.data_files_added;
        self.files.deletes =
            layout.deletes.len() - done.delete_files_removed + done.delete_files_added;
        self.files.commits = 0;
        tracing::info!(
            table = %self.ident,
            data_files_removed = done.data_files_removed,
            data_files_added = done.data_files_added,
            delete_files_removed = done.delete_files_removed,
            rows = done.rows_rewritten,
            "silver compacted"
        );
        Ok(Some(done))
    }

    /// The live rows of each file of `rewrite` but those `deleted` holds,
    /// written into new data files: the files, each one's keys by
    /// position, and the rows written.
    async fn rewrite_rows(
        &self,
        table: &Table,
        rewrite: &[(String, u64)],
        deleted: &mut HashMap<Arc<str>, HashSet<i64>>,
    ) -> Result<(Vec<DataFile>, Vec<FileRows>, usize)> {
        let mut sink = DataFileSink::open(table).await?;
        let mut keys = Vec::new();
        for (path, live_rows) in rewrite {
            if *live_rows > 0 {
                let gone = deleted.remove(path.as_str()).unwrap_or_default();
                for (batch, batch_keys) in self.live_rows(table, path, &gone).await? {
                    keys.extend(batch_keys);
                    sink.write(batch).await?;
                }
            }
        }
        let added = sink.close().await?;
        let rows = keys.len();
        let moved: u64 = rewrite.iter().map(|(_, live)| *live).sum();
        if rows as u64 != moved {
            return Err(lake_error(
                "the key index and the delete files disagree on a data file's live rows",
                &self.ident,
            ));
        }
        let mut keys = keys.into_iter();
        let mut moves = Vec::with_capacity(added.len());
        for file in &added {
            let count = file.record_count() as usize;
            let keyed: Vec<_> = (&mut keys).take(count).enumerate().collect();
            moves.push((Arc::<str>::from(file.file_path()), keyed));
        }
        if keys.next().is_some() {
            return Err(lake_error("fewer rows rewritten than read", &self.ident));
        }
        Ok((added, moves, rows))
    }

    /// The rows of a data file but those at the `deleted` positions, in
    /// the table's current schema, with their keys.
    async fn live_rows(
        &self,
        table: &Table,
        path: &str,
        deleted: &HashSet<i64>,
    ) -> Result<Vec<(RecordBatch, Vec<Key>)>> {
        let mut out = Vec::new();
        let mut position = 0i64;
        for batch in read_parquet(table, path, "cannot read a silver data file").await? {
            let batch = batch?;
            let keep: Vec<bool> = (0..batch.num_rows() as i64)
                .map(|i| !deleted.contains(&(position + i)))
                .collect();
            position += batch.num_rows() as i64;
            let kept = filter_record_batch(&batch, &BooleanArray::from(keep))
                .map_err(|e| arrow_error(e, path, &self.ident))?;
            let kept = align(&kept, &self.schema, path)?;
            let columns: Vec<ArrayRef> = self
                .key_fields
                .iter()
                .map(|&i| kept.column(i).clone())
                .collect();
            let keys = self.codec.encode_columns(&columns).map_err(|e| {
                e.with_context("table", &self.ident)
                    .with_context("file", path)
            })?;
            out.push((kept, keys));
        }
        Ok(out)
    }
}

/// What one compaction rewrites: the data files, with their live rows,
/// and the delete files it merges.
struct Choice {
    rewrite: Vec<(String, u64)>,
    removed_data: HashSet<String>,
    merging: HashSet<String>,
}

impl Choice {
    /// What `merge` picks of `layout`, whose files hold `live` rows each;
    /// `None` when nothing is worth rewriting.
    fn of(layout: &Layout, live: &HashMap<&str, u32>, merge: Merge) -> Option<Choice> {
        let live_of = |path: &str| u64::from(live.get(path).copied().unwrap_or(0));
        let mut merged_rows = 0;
        let mut small: Vec<String> = small_files_to_merge(
            layout
                .data
                .iter()
                .map(|(p, _, bytes)| (p.clone(), *bytes))
                .collect(),
            merge,
        )
        .into_iter()
        .take_while(|path| {
            merged_rows += live_of(path);
            merged_rows <= MAX_MERGED_ROWS
        })
        .collect();
        if small.len() < 2 {
            small.clear();
        }
        let small: HashSet<String> = small.into_iter().collect();
        let mut budget = MAX_REWRITE_BYTES;
        let mut rows_budget = MAX_THINNED_ROWS;
        let mut rewrite = Vec::new();
        for (path, rows, bytes) in &layout.data {
            let live_rows = live_of(path);
            let lost = rows.saturating_sub(live_rows) as f64;
            let (thinned, affordable) = match merge {
                Merge::Tiered => (
                    lost >= DELETE_RATIO * *rows as f64,
                    live_rows <= rows_budget || rows_budget == MAX_THINNED_ROWS,
                ),
                Merge::All => (lost > 0.0, true),
            };
            let affordable = affordable && *bytes <= budget;
            if live_rows == 0 || small.contains(path) || (thinned && affordable) {
                if !small.contains(path) {
                    budget = budget.saturating_sub(*bytes);
                    rows_budget = rows_budget.saturating_sub(live_rows);
                }
                rewrite.push((path.clone(), live_rows));
            }
        }
        let emptied = rewrite.iter().any(|(_, live)| *live == 0);
        // Delete files are merged by the same size tiers as data files, so
        // a large merged one is not rewritten for a few new positions; a
        // full compaction takes them all, as it drops every deleted row.
        let merging: HashSet<String> = match merge {
            Merge::Tiered => small_files_to_merge(
                layout
                    .deletes
                    .iter()
                    .map(|(p, b)| (p.clone(), *b))
                    .collect(),
                merge,
            )
            .into_iter()
            .collect(),
            Merge::All => layout.deletes.keys().cloned().collect(),
        };
        let worth = rewrite.len() >= 2
            || emptied
            || merging.len() >= 2
            || (merge == Merge::All && !(rewrite.is_empty() && merging.is_empty()));
        worth.then(|| Choice {
            removed_data: rewrite.iter().map(|(p, _)| p.clone()).collect(),
            rewrite,
            merging,
        })
    }
}

/// The delete files' positions as a compaction leaves them: those of the
/// rewritten data files, which their rows are read without, and the
/// merged delete file.
struct MergedDeletes {
    deleted: HashMap<Arc<str>, HashSet<i64>>,
    merged: Option<DataFile>,
}

/// Merges the delete files `choice` names, and reads the positions of the
/// data files it rewrites; `None` when that would only write one delete
/// file again (the merged file, if any, discarded).
async fn merge_deletes(
    table: &Table,
    layout: &Layout,
    choice: &Choice,
) -> Result<Option<MergedDeletes>> {
    // What the delete files delete, by data file: the rows of a
    // rewritten file left out, the rest merged into one delete file.
    let mut deleted: HashMap<Arc<str>, HashSet<i64>> = HashMap::new();
    // Positions the merged delete file keeps: those of the delete
    // files it replaces that name a live data file kept (a file an
    // earlier compaction removed needs its positions no more).
    let kept: HashSet<&str> = layout
        .data
        .iter()
        .map(|(p, _, _)| p.as_str())
        .filter(|p| !choice.removed_data.contains(*p))
        .collect();
    // Only the delete files merged or applying to a rewritten file are
    // read, as sorted streams merged into one, and of the rest only the
    // positions of rewritten files held: memory of what this
    // compaction rewrites, not of the table or its delete files.
    let mut needed: Vec<&str> = choice
        .removed_data
        .iter()
        .filter_map(|p| layout.applying.get(p))
        .flatten()
        .map(String::as_str)
        .chain(choice.merging.iter().map(String::as_str))
        .collect();
    needed.sort_unstable();
    needed.dedup();
    let mut readers = Vec::with_capacity(needed.len());
    for delete in &needed {
        readers.push(DeleteReader::open_sorted(table, delete).await?);
    }
    let merged_source: Vec<bool> = needed.iter().map(|d| choice.merging.contains(*d)).collect();
    let mut merged_positions = 0;
    let mut still = 0;
    let mut last: Option<Deleted> = None;
    let mut merged_file: Option<DeleteWriter> = None;
    for pair in Merged::new(readers)? {
        let ((file, pos), source) = pair?;
        if merged_source[source] {
            merged_positions += 1;
        }
        if choice.removed_data.contains(&*file) {
            deleted.entry(file).or_default().insert(pos);
        } else if merged_source[source]
            && kept.contains(&*file)
            && !last.as_ref().is_some_and(|(f, p)| *f == file && *p == pos)
        {
            let writer = match &mut merged_file {
                Some(writer) => writer,
                None => merged_file.insert(DeleteWriter::open(table).await?),
            };
            last = Some((file.clone(), pos));
            writer.push((file, pos)).await?;
            still += 1;
        }
    }
    let merged = match merged_file {
        Some(writer) => Some(writer.close().await?),
        None => None,
    };
    // One delete file alone, all of whose positions still apply (to a
    // file too large for this round), would only be written again: a
    // full compaction would do so at every quiet moment.
    if choice.rewrite.is_empty() && choice.merging.len() == 1 && still == merged_positions {
        if let Some(file) = merged {
            discard(table, file.file_path()).await;
        }
        return Ok(None);
    }
    Ok(Some(MergedDeletes { deleted, merged }))
}

async fn layout(table: &Table) -> Result<Layout> {
    let mut data = Vec::new();
    // Every live delete file, not only those the scan plans: one whose data
    // files were all rewritten since (by a compaction that did not merge
    // it) applies to nothing, and is retired by the next full compaction.
    let deletes = live_files_in_commit_order(table, ManifestContentType::Deletes)
        .await?
        .into_iter()
        .collect();
    let mut applying = HashMap::new();
    for task in planned_files(table).await? {
        applying.insert(
            task.data_file_path.clone(),
            task.deletes.iter().map(|d| d.file_path.clone()).collect(),
        );
        data.push((
            task.data_file_path,
            task.record_count.unwrap_or(0),
            task.file_size_in_bytes,
        ));
    }
    Ok(Layout {
        data,
        applying,
        deletes,
    })
}

fn arrow_error(e: arrow_schema::ArrowError, path: &str, ident: &iceberg::TableIdent) -> Error {
    Error::new(ErrorKind::Lake, "cannot rewrite a silver data file")
        .with_context("table", ident)
        .with_context("file", path)
        .with_source(e)
}

/// Deletes a file this compaction wrote and will not commit; one left
/// behind is an orphan the sweep removes (docs/tables.md).
async fn discard(table: &Table, path: &str) {
    if let Err(e) = table.file_io().delete(path).await {
        tracing::warn!(table = %table.identifier(), file = path, error = %e, "cannot delete a file the compaction did not need");
    }
}
