//! What both tables' compactions share: the policy's constants, the
//! report, putting an older file's rows in the current schema, and the
//! compaction of an append-only table (bronze): small data files merged,
//! in commit order, into files near the target size, content unchanged.
//! Silver's, which also applies deletes and moves the key index, is
//! `silver::compaction`.

use std::collections::HashSet;

use arrow_array::{ArrayRef, RecordBatch, new_null_array};
use arrow_schema::Schema as ArrowSchema;
use iceberg::TableIdent;
use iceberg::spec::ManifestContentType;
use iceberg::table::Table;

use super::catalog::{Lake, iceberg_error};
use super::row_delta::{RowDelta, commit_rewrite};
use super::writer::{DataFileSink, Position, arrow_schema, read_parquet};
use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;

/// A data file smaller than this is worth merging with others.
pub const SMALL_FILE_BYTES: u64 = 32 << 20;
/// At most this many bytes of data files are rewritten by one compaction;
/// the rest waits for the next.
pub const MAX_REWRITE_BYTES: u64 = 256 << 20;
/// Default of `compact_after_files`.
pub const DEFAULT_AFTER_FILES: usize = 16;

/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compacted {
    pub data_files_removed: usize,
    pub data_files_added: usize,
    pub delete_files_removed: usize,
    pub delete_files_added: usize,
    pub rows_rewritten: usize,
}

/// `batch`, read from an older file, in `schema`: a column added since is
/// null, a dropped one is left out, a narrower type (another writer's) is
/// cast.
pub fn align(
    batch: &RecordBatch,
    schema: &std::sync::Arc<ArrowSchema>,
    path: &str,
) -> Result<RecordBatch> {
    let bad = |e: arrow_schema::ArrowError| {
        Error::new(ErrorKind::Lake, "cannot rewrite a data file")
            .with_context("file", path)
            .with_source(e)
    };
    let columns = schema
        .fields()
        .iter()
        .map(|field| match batch.column_by_name(field.name()) {
            None => Ok(new_null_array(field.data_type(), batch.num_rows())),
            Some(c) if c.data_type() == field.data_type() => Ok(c.clone()),
            Some(c) => arrow_cast::cast(c, field.data_type()).map_err(bad),
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(bad)
}

/// Merges the small data files of an append-only table, oldest first, up
/// to [`MAX_REWRITE_BYTES`], into new files in one rewrite snapshot that
/// keeps the source position of the one before; `None` when fewer than two
/// are small.
pub async fn merge_small_files(lake: &Lake, ident: &TableIdent) -> Result<Option<Compacted>> {
    let table = lake.catalog_table(ident).await?;
    let mut budget = MAX_REWRITE_BYTES;
    let small: Vec<String> = data_files_in_commit_order(&table)
        .await?
        .into_iter()
        .filter(|(_, bytes)| *bytes < SMALL_FILE_BYTES)
        .take_while(|(_, bytes)| {
            let fits = *bytes <= budget;
            budget = budget.saturating_sub(*bytes);
            fits
        })
        .map(|(path, _)| path)
        .collect();
    if small.len() < 2 {
        return Ok(None);
    }
    let schema = arrow_schema(&table)?;
    let mut sink = DataFileSink::open(&table).await?;
    let mut rows = 0;
    for path in &small {
        for batch in read_parquet(&table, path, "cannot read a data file").await? {
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
    if !commit_rewrite(lake, &table, &delta).await? {
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

/// The live data files of the current snapshot with their sizes, in the
/// order they were committed.
async fn data_files_in_commit_order(table: &Table) -> Result<Vec<(String, u64)>> {
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
        if manifest.content != ManifestContentType::Data {
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
