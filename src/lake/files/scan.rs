//! Reading a table's rows: iceberg-rust's scan, except where it cannot read
//! a table's older files. iceberg-rust 0.10 matches the fields of a struct
//! column by position in a file written before the struct gained a field
//! (apache/iceberg-rust#2617), which bronze's `_cdc_before` does whenever
//! the source gains a column. A scan that selects a struct column reads
//! the files here instead and aligns each to the table's schema by name,
//! as compaction reads them; bronze, the one table with a struct column,
//! has no delete files.

use futures_util::stream::{self, BoxStream};
use futures_util::{StreamExt, TryStreamExt};
use iceberg::expr::Predicate;
use iceberg::scan::FileScanTask;
use iceberg::table::Table;

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Schema as ArrowSchema};

use crate::error::{Error, ErrorKind, Result};
use crate::lake::files::align::align;
use crate::lake::files::writer::{arrow_schema, read_parquet};
use crate::lake::iceberg_error;

/// Batches of rows, in no particular order.
pub(crate) type Rows = BoxStream<'static, Result<RecordBatch>>;

/// The Arrow schema of the table as `snapshot` has it (the current one
/// when `None`): the columns of that time, under their names then.
pub(crate) fn schema_at(table: &Table, snapshot: Option<i64>) -> Result<Arc<ArrowSchema>> {
    let Some(id) = snapshot else {
        return arrow_schema(table);
    };
    let metadata = table.metadata();
    let schema = metadata
        .snapshot_by_id(id)
        .and_then(|s| s.schema_id())
        .and_then(|schema| metadata.schema_by_id(schema))
        .unwrap_or_else(|| metadata.current_schema());
    iceberg::arrow::schema_to_arrow_schema(schema)
        .map(Arc::new)
        .map_err(|e| {
            iceberg_error(e, "cannot convert the table schema to Arrow")
                .with_context("table", table.identifier())
        })
}

/// The `columns` of the table's rows at `snapshot` (the current one when
/// `None`; the columns as that snapshot's schema names them), positional
/// deletes applied.
pub(crate) async fn scan(table: &Table, snapshot: Option<i64>, columns: &[String]) -> Result<Rows> {
    scan_where(table, snapshot, columns, None).await
}

/// As [`scan`], only the rows `filter` holds for, which iceberg-rust reads
/// by skipping the files, row groups and pages whose statistics rule them
/// out. Top-level columns only: the files read here for a struct column
/// are read whole.
pub(crate) async fn scan_where(
    table: &Table,
    snapshot: Option<i64>,
    columns: &[String],
    filter: Option<Predicate>,
) -> Result<Rows> {
    let ident = table.identifier().clone();
    let context = move |e: iceberg::Error| {
        iceberg_error(e, "cannot read the table").with_context("table", &ident)
    };
    let filtered = filter.is_some();
    let mut builder = table.scan().select(columns.iter().map(String::as_str));
    if let Some(id) = snapshot {
        builder = builder.snapshot_id(id);
    }
    if let Some(filter) = filter {
        builder = builder.with_filter(filter);
    }
    let scan = builder.build().map_err(context.clone())?;
    let schema = schema_at(table, snapshot)?;
    let indices = columns
        .iter()
        .map(|c| schema.index_of(c))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            Error::new(ErrorKind::Lake, "a selected column is not in the table")
                .with_context("table", table.identifier())
                .with_source(e)
        })?;
    let target = Arc::new(schema.project(&indices).map_err(|e| {
        Error::new(ErrorKind::Lake, "cannot project the table's schema").with_source(e)
    })?);
    if !target
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Struct(_)))
    {
        let rows = scan.to_arrow().await.map_err(context.clone())?;
        return Ok(rows.map_err(context).boxed());
    }
    if filtered {
        return Err(Error::new(
            ErrorKind::Lake,
            "a filtered read of a struct column, which wal2iceberg never makes",
        )
        .with_context("table", table.identifier()));
    }
    let tasks: Vec<FileScanTask> = scan
        .plan_files()
        .await
        .map_err(context.clone())?
        .try_collect()
        .await
        .map_err(context)?;
    if tasks.iter().any(|t| !t.deletes.is_empty()) {
        return Err(Error::new(
            ErrorKind::Lake,
            "the table has a struct column and delete files, which no table wal2iceberg writes has",
        )
        .with_context("table", table.identifier()));
    }
    let table = table.clone();
    let files = stream::iter(tasks).then(move |task| {
        let (table, target) = (table.clone(), target.clone());
        async move {
            let path = task.data_file_path;
            read_parquet(&table, &path, "cannot read a data file")
                .await?
                .map(|batch| align(&batch?, &target, &path))
                .collect::<Result<Vec<_>>>()
        }
    });
    Ok(files
        .map_ok(|batches| stream::iter(batches.into_iter().map(Ok)))
        .try_flatten()
        .boxed())
}
