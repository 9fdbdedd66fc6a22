//! What both tables' compactions share: the policy's constants, the
//! report, and the compaction of an append-only table (bronze): small
//! data files merged, in commit order, into files near the target size,
//! content unchanged.
//! Silver's, which also applies deletes and moves the key index, is
//! `silver::compaction`.

use std::collections::HashSet;

use iceberg::TableIdent;
use iceberg::spec::ManifestContentType;
use iceberg::table::Table;

use crate::error::Result;
use crate::failpoint;
use crate::lake::catalog::Lake;
use crate::lake::catalog::row_delta::{RowDelta, commit_rewrite};
use crate::lake::files::align::align;
use crate::lake::files::writer::{DataFileSink, Position, arrow_schema, read_parquet};
use crate::lake::iceberg_error;

/// A data file smaller than this is worth merging with others.
pub(crate) const SMALL_FILE_BYTES: u64 = 32 << 20;
/// At most this many bytes of data files are rewritten by one compaction;
/// the rest waits for the next.
pub(crate) const MAX_REWRITE_BYTES: u64 = 256 << 20;
/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compacted {
    pub data_files_removed: usize,
    pub data_files_added: usize,
    pub delete_files_removed: usize,
    pub delete_files_added: usize,
    pub rows_rewritten: usize,
}

impl std::ops::AddAssign for Compacted {
    fn add_assign(&mut self, other: Compacted) {
        self.data_files_removed += other.data_files_removed;
        self.data_files_added += other.data_files_added;
        self.delete_files_removed += other.delete_files_removed;
        self.delete_files_added += other.delete_files_added;
        self.rows_rewritten += other.rows_rewritten;
    }
}

/// How small files are picked for a merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// By size tiers (see [`small_files_to_merge`]): what a run does after
    /// its commits, so that a compaction costs what came since the last.
    Tiered,
    /// Every small file, up to [`MAX_REWRITE_BYTES`], and in silver every
    /// data file that lost any row: `wal2iceberg compact`, and a run whose
    /// stream is quiet.
    All,
}

/// Which of the data files (path, bytes) to merge: those under
/// [`SMALL_FILE_BYTES`], smallest first, each next one taken only while it
/// is no larger than all taken before it together, up to
/// [`MAX_REWRITE_BYTES`]; none when fewer than two qualify. The new files
/// of a few commits are merged with each other, not into the whole table:
/// a merged file joins a later merge once as much new data has come, so a
/// row is rewritten a logarithmic number of times. [`Merge::All`] takes
/// every small file instead, up to the same byte limit.
pub(crate) fn small_files_to_merge(mut files: Vec<(String, u64)>, merge: Merge) -> Vec<String> {
    files.retain(|(_, bytes)| *bytes < SMALL_FILE_BYTES);
    files.sort_by_key(|(path, bytes)| (*bytes, path.clone()));
    let mut taken = Vec::new();
    let mut total = 0u64;
    for (path, bytes) in files {
        let next_tier = merge == Merge::Tiered && taken.len() >= 2 && bytes > total;
        if next_tier || total + bytes > MAX_REWRITE_BYTES {
            break;
        }
        total += bytes;
        taken.push(path);
    }
    if taken.len() < 2 {
        taken.clear();
    }
    taken
}

/// Merges the small data files of an append-only table that
/// [`small_files_to_merge`] picks, in commit order, into new files in one
/// rewrite snapshot that keeps the source position of the one before;
/// `None` when there is nothing to merge.
pub(crate) async fn merge_small_files(
    lake: &Lake,
    ident: &TableIdent,
    merge: Merge,
) -> Result<Option<Compacted>> {
    let table = lake.catalog_table(ident).await?;
    let files = live_files_in_commit_order(&table, ManifestContentType::Data).await?;
    let chosen: HashSet<String> = small_files_to_merge(files.clone(), merge)
        .into_iter()
        .collect();
    if chosen.is_empty() {
        return Ok(None);
    }
    let small: Vec<String> = files
        .into_iter()
        .map(|(path, _)| path)
        .filter(|path| chosen.contains(path))
        .collect();
    let schema = arrow_schema(&table)?;
    let mut sink = DataFileSink::open(&table).await?;
    let mut rows = 0;
    for path in &small {
        for batch in read_parquet(&table, path, "cannot read a data file").await? {
            let batch = batch?;
            rows += batch.num_rows();
            sink.write(align(&batch, &schema, path)?).await?;
        }
    }
    let added = sink.close().await?;
    failpoint::hit("compaction-written");
    let done = Compacted {
        data_files_removed: small.len(),
        data_files_added: added.len(),
        rows_rewritten: rows,
        ..Compacted::default()
    };
    let delta = RowDelta {
        data_files: added,
        removed: small.into_iter().collect::<HashSet<_>>(),
        properties: Position::of(&table)?
            .map(Position::summary)
            .unwrap_or_default(),
        ..RowDelta::default()
    };
    if commit_rewrite(lake, &table, &delta).await?.is_none() {
        tracing::warn!(table = %ident, "another writer committed during the merge; it is left for later");
        return Ok(None);
    }
    tracing::info!(
        table = %ident,
        data_files_removed = done.data_files_removed,
        data_files_added = done.data_files_added,
        rows = done.rows_rewritten,
        "small files merged"
    );
    Ok(Some(done))
}

/// The live data or delete files (`content`) of the current snapshot with
/// their sizes, in the order they were committed.
pub(crate) async fn live_files_in_commit_order(
    table: &Table,
    content: ManifestContentType,
) -> Result<Vec<(String, u64)>> {
    let context = |e: iceberg::Error| {
        iceberg_error(e, "cannot read the table's manifests")
            .with_context("table", table.identifier())
    };
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok(Vec::new());
    };
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(context)?;
    let mut files = Vec::new();
    for manifest in list.entries() {
        if manifest.content != content {
            continue;
        }
        let loaded = manifest
            .load_manifest(table.file_io())
            .await
            .map_err(context)?;
        files.extend(loaded.entries().iter().filter(|e| e.is_alive()).map(|e| {
            (
                e.sequence_number().unwrap_or_default(),
                e.file_path().to_owned(),
                e.file_size_in_bytes(),
            )
        }));
    }
    files.sort();
    Ok(files
        .into_iter()
        .map(|(_, path, bytes)| (path, bytes))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(sizes: &[u64]) -> Vec<(String, u64)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, b)| (format!("f{i}"), *b))
            .collect()
    }

    #[test]
    fn new_small_files_merge_with_each_other_and_not_into_a_large_one() {
        // Sixteen fresh files beside an earlier merge of 30 MB.
        let mut sizes = vec![50_000; 16];
        sizes.push(30 << 20);
        let picked = small_files_to_merge(files(&sizes), Merge::Tiered);
        assert_eq!(picked.len(), 16);
        assert!(!picked.contains(&"f16".to_owned()));
        // Once as much new data came, the earlier merge joins.
        let picked = small_files_to_merge(files(&[1 << 20, 1 << 20, 2 << 20]), Merge::Tiered);
        assert_eq!(picked.len(), 3);
        // Files of 32 MiB and more are left alone; one small file is not
        // worth a merge.
        assert!(small_files_to_merge(files(&[SMALL_FILE_BYTES, 10]), Merge::Tiered).is_empty());
        assert!(small_files_to_merge(files(&[10]), Merge::Tiered).is_empty());
        // On demand, every small file merges, up to the byte limit.
        assert_eq!(small_files_to_merge(files(&sizes), Merge::All).len(), 17);
        let big = vec![30 << 20; 12];
        let picked = small_files_to_merge(files(&big), Merge::All);
        assert_eq!(picked.len() as u64, MAX_REWRITE_BYTES / (30 << 20));
    }

    #[test]
    fn a_merge_stays_within_its_budget() {
        let picked = small_files_to_merge(files(&[30 << 20; 20]), Merge::Tiered);
        let total: u64 = picked.len() as u64 * (30 << 20);
        assert!(
            total <= MAX_REWRITE_BYTES && picked.len() >= 2,
            "{picked:?}"
        );
    }
}
