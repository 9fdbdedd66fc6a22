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

use std::collections::HashSet;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_select::filter::filter_record_batch;
use iceberg::table::Table;

use super::{SilverTable, lake_error, planned_files, read_parquet, read_position_deletes};
use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;
use crate::lake::catalog::Lake;
use crate::lake::compaction::{Compacted, MAX_REWRITE_BYTES, SMALL_FILE_BYTES, align};
use crate::lake::row_delta::{RowDelta, commit_rewrite, write_position_deletes};
use crate::lake::writer::{DataFileSink, Position};

/// A data file that lost at least this share of its rows is rewritten.
pub const DELETE_RATIO: f64 = 0.2;

/// The live data files of the table and the delete files that apply to
/// them, as the scan plans them.
struct Layout {
    /// Path, rows, bytes.
    data: Vec<(String, u64, u64)>,
    deletes: HashSet<String>,
}

impl SilverTable {
    /// Compacts when at least `after_files` (not 0) data files were
    /// committed since the last compaction (or the start), or when the
    /// table holds that many delete files. Call only right after
    /// [`Self::commit`].
    pub async fn compact(&mut self, lake: &Lake, after_files: usize) -> Result<Option<Compacted>> {
        let due = after_files > 0
            && (self.files.data >= self.files.baseline + after_files
                || self.files.deletes >= after_files);
        if !due {
            return Ok(None);
        }
        if !(self.pending.is_empty() && self.written.is_empty() && self.deletes.is_empty()) {
            return Err(lake_error(
                "compaction asked for while changes are staged",
                &self.ident,
            ));
        }
        let table = lake.catalog_table(&self.ident).await?;
        let layout = layout(&table).await?;
        let live = self.index.live_per_file();
        let mut budget = MAX_REWRITE_BYTES;
        let mut rewrite = Vec::new();
        for (path, rows, bytes) in &layout.data {
            let live_rows = u64::from(live.get(path.as_str()).copied().unwrap_or(0));
            let lost = rows.saturating_sub(live_rows) as f64;
            let worth =
                live_rows == 0 || lost >= DELETE_RATIO * *rows as f64 || *bytes < SMALL_FILE_BYTES;
            if worth && (live_rows == 0 || *bytes <= budget) {
                budget = budget.saturating_sub(*bytes);
                rewrite.push((path.clone(), live_rows));
            }
        }
        let emptied = rewrite.iter().any(|(_, live)| *live == 0);
        if rewrite.len() < 2 && layout.deletes.len() < 2 && !emptied {
            self.files.baseline = self.files.data;
            return Ok(None);
        }
        let mut done = Compacted::default();
        let removed_data: HashSet<String> = rewrite.iter().map(|(p, _)| p.clone()).collect();
        let mut sink = DataFileSink::open(&table).await?;
        let mut keys = Vec::new();
        for (path, live_rows) in &rewrite {
            if *live_rows > 0 {
                for batch in self.live_rows(&table, path).await? {
                    keys.extend(batch.1);
                    sink.write(batch.0).await?;
                }
            }
        }
        let added = sink.close().await?;
        done.rows_rewritten = keys.len();
        let mut keys = keys.into_iter();
        let mut moves = Vec::with_capacity(added.len());
        for file in &added {
            let rows = file.record_count() as usize;
            let keyed: Vec<_> = (&mut keys).take(rows).enumerate().collect();
            moves.push((std::sync::Arc::<str>::from(file.file_path()), keyed));
        }
        if keys.next().is_some() {
            return Err(lake_error("fewer rows rewritten than read", &self.ident));
        }
        // Deletes that still apply: those naming a data file kept.
        let mut still = HashSet::new();
        for delete in &layout.deletes {
            for (file, pos) in read_position_deletes(&table, delete).await? {
                if !removed_data.contains(&file) {
                    still.insert((file, pos));
                }
            }
        }
        let mut merged = Vec::new();
        if !still.is_empty() {
            merged.push(write_position_deletes(&table, still.into_iter().collect()).await?);
        }
        failpoint::hit("compaction-written");
        done.data_files_removed = removed_data.len();
        done.data_files_added = added.len();
        done.delete_files_removed = layout.deletes.len();
        done.delete_files_added = merged.len();
        let delta = RowDelta {
            data_files: added,
            delete_files: merged,
            removed: removed_data.into_iter().chain(layout.deletes).collect(),
            properties: Position::of(&table)?
                .map(Position::summary)
                .unwrap_or_default(),
        };
        if !commit_rewrite(lake, &table, &delta).await? {
            // Another writer committed since the table was read: nothing
            // changed, and the next compaction waits for more files.
            tracing::warn!(table = %self.ident, "another writer committed during the compaction; it is left for later");
            self.files.baseline = self.files.data;
            return Ok(None);
        }
        // The rows moved: the index follows only once that is committed.
        for (path, keyed) in moves {
            self.index
                .add_file(path, keyed)
                .map_err(|e| e.with_context("table", &self.ident))?;
        }
        self.files.data = layout.data.len() - done.data_files_removed + done.data_files_added;
        self.files.deletes = done.delete_files_added;
        self.files.baseline = self.files.data;
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

    /// The rows of a data file the index still points at, in the table's
    /// current schema, with their keys.
    async fn live_rows(
        &mut self,
        table: &Table,
        path: &str,
    ) -> Result<Vec<(RecordBatch, Vec<super::Key>)>> {
        let mut out = Vec::new();
        let mut position = 0i64;
        for batch in read_parquet(table, path, "cannot read a silver data file").await? {
            let columns = self
                .key_fields
                .iter()
                .map(|&i| column_of(&batch, self.schema.field(i).name(), path, &self.ident))
                .collect::<Result<Vec<_>>>()?;
            let keys = self.codec.encode_columns(&columns).map_err(|e| {
                e.with_context("table", &self.ident)
                    .with_context("file", path)
            })?;
            let mut keep = Vec::with_capacity(keys.len());
            let mut kept = Vec::new();
            for (i, key) in keys.into_iter().enumerate() {
                let here = self
                    .index
                    .get(&key)?
                    .is_some_and(|(file, pos)| &*file == path && pos == position + i as i64);
                keep.push(here);
                if here {
                    kept.push(key);
                }
            }
            position += batch.num_rows() as i64;
            let filtered = filter_record_batch(&batch, &BooleanArray::from(keep))
                .map_err(|e| arrow_error(e, path, &self.ident))?;
            out.push((align(&filtered, &self.schema, path)?, kept));
        }
        Ok(out)
    }
}

async fn layout(table: &Table) -> Result<Layout> {
    let mut data = Vec::new();
    let mut deletes = HashSet::new();
    for task in planned_files(table).await? {
        deletes.extend(task.deletes.iter().map(|d| d.file_path.clone()));
        data.push((
            task.data_file_path,
            task.record_count.unwrap_or(0),
            task.file_size_in_bytes,
        ));
    }
    Ok(Layout { data, deletes })
}

fn column_of(
    batch: &RecordBatch,
    name: &str,
    path: &str,
    ident: &iceberg::TableIdent,
) -> Result<ArrayRef> {
    batch.column_by_name(name).cloned().ok_or_else(|| {
        lake_error("a data file lacks a key column", ident).with_context("file", path)
    })
}

fn arrow_error(e: arrow_schema::ArrowError, path: &str, ident: &iceberg::TableIdent) -> Error {
    Error::new(ErrorKind::Lake, "cannot rewrite a silver data file")
        .with_context("table", ident)
        .with_context("file", path)
        .with_source(e)
}
