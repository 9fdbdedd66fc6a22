//! Silver: the current state of a source table, kept in step with it by
//! positional deletes (readable by pyiceberg, DuckDB and iceberg-rust,
//! unlike equality deletes) and new data files.
//!
//! A primary-key index maps every live row's key to its (data file,
//! position). It is rebuilt from the table at start: each live data file's
//! key columns, less the positions its delete files name.
//!
//! A batch of changes is collapsed to the last change per key, in commit
//! order: a key with a live row gets a positional delete; inserts and
//! updates write the new row; a key inserted and deleted inside one batch
//! writes nothing; a primary-key update deletes the old key and writes the
//! new one; a truncate deletes every live row. One snapshot per batch
//! (`row_delta`), recording the source position it covers.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{Int64Builder, TimestampMicrosecondBuilder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{DataType, Schema as ArrowSchema};
use futures_util::TryStreamExt;
use iceberg::TableIdent;
use iceberg::spec::DataContentType;
use iceberg::table::Table;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::arrow::build_array;
use super::catalog::{Lake, iceberg_error};
use super::row_delta::{RowDelta, commit_row_delta, write_position_deletes};
use super::schema::{COMMIT_LSN, COMMIT_TS, silver_schema};
use super::writer::{SUMMARY_COMMIT_LSN, arrow_schema, write_data_files};
use crate::cdc::event::{Change, Datum, ImageKind, Op};
use crate::cdc::relation::RelationInfo;
use crate::cdc::value::Value;
use crate::error::{Error, ErrorKind, Result};
use crate::pg::lsn::Lsn;

/// Where a live row is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    file: Arc<str>,
    pos: i64,
}

/// A row to write: its key, the change that wrote it, and its values.
struct NewRow<'a> {
    key: Box<[u8]>,
    change: &'a Change,
    values: Vec<Option<&'a Value>>,
}

/// The last word on a key within a batch.
enum Pending<'a> {
    Upsert {
        change: &'a Change,
        row: Vec<Option<&'a Value>>,
    },
    Delete,
}

pub struct SilverTable {
    ident: TableIdent,
    schema: Arc<ArrowSchema>,
    /// Arrow schema indices of the primary-key columns, in key order.
    key_fields: Vec<usize>,
    converter: RowConverter,
    index: HashMap<Box<[u8]>, Location>,
}

impl SilverTable {
    /// Creates the table when missing and rebuilds the key index from it.
    pub async fn open(
        lake: &Lake,
        ident: TableIdent,
        relation: &RelationInfo,
    ) -> Result<SilverTable> {
        let table = lake.ensure_table(&ident, silver_schema(relation)?).await?;
        let schema = arrow_schema(&table)?;
        let key_fields: Vec<usize> = relation
            .columns
            .iter()
            .filter(|c| c.is_primary_key)
            .map(|c| schema.index_of(&c.name))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| {
                lake_error("the primary key is not in the silver table", &ident).with_source(e)
            })?;
        let converter = RowConverter::new(
            key_fields
                .iter()
                .map(|&i| SortField::new(schema.field(i).data_type().clone()))
                .collect(),
        )
        .map_err(|e| lake_error("cannot encode the primary key", &ident).with_source(e))?;
        let mut silver = SilverTable {
            ident,
            schema,
            key_fields,
            converter,
            index: HashMap::new(),
        };
        silver.rebuild_index(&table).await?;
        Ok(silver)
    }

    pub fn ident(&self) -> &TableIdent {
        &self.ident
    }

    /// Number of live rows, as the index knows them.
    pub fn row_count(&self) -> usize {
        self.index.len()
    }

    async fn rebuild_index(&mut self, table: &Table) -> Result<()> {
        let context = |e: iceberg::Error| {
            iceberg_error(e, "cannot read the silver table").with_context("table", &self.ident)
        };
        if table.metadata().current_snapshot().is_none() {
            return Ok(());
        }
        let tasks: Vec<_> = table
            .scan()
            .build()
            .map_err(context)?
            .plan_files()
            .await
            .map_err(context)?
            .try_collect()
            .await
            .map_err(context)?;
        let mut deletes_by_file: HashMap<String, Vec<i64>> = HashMap::new();
        let mut delete_files_read = std::collections::HashSet::new();
        for task in &tasks {
            for delete in &task.deletes {
                if delete.file_type != DataContentType::PositionDeletes {
                    return Err(lake_error(
                        "the silver table holds equality deletes, which wal2iceberg never writes",
                        &self.ident,
                    ));
                }
                if delete_files_read.insert(delete.file_path.clone()) {
                    for (file, pos) in read_position_deletes(table, &delete.file_path).await? {
                        deletes_by_file.entry(file).or_default().push(pos);
                    }
                }
            }
        }
        for task in tasks {
            let deleted: std::collections::HashSet<i64> = deletes_by_file
                .remove(&task.data_file_path)
                .unwrap_or_default()
                .into_iter()
                .collect();
            let file: Arc<str> = task.data_file_path.as_str().into();
            let keys = self.read_keys(table, &task.data_file_path).await?;
            for (pos, key) in keys.into_iter().enumerate() {
                let pos = pos as i64;
                if !deleted.contains(&pos) {
                    self.index.insert(
                        key,
                        Location {
                            file: file.clone(),
                            pos,
                        },
                    );
                }
            }
        }
        tracing::info!(table = %self.ident, rows = self.index.len(), "silver key index rebuilt");
        Ok(())
    }

    /// The encoded keys of a data file's rows, in file order.
    async fn read_keys(&self, table: &Table, path: &str) -> Result<Vec<Box<[u8]>>> {
        let bytes = read_file(table, path).await?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| {
            lake_error("cannot read a silver data file", &self.ident)
                .with_context("file", path)
                .with_source(e)
        })?;
        let names: Vec<&str> = self
            .key_fields
            .iter()
            .map(|&i| self.schema.field(i).name().as_str())
            .collect();
        let mask = ProjectionMask::columns(builder.parquet_schema(), names.iter().copied());
        let reader = builder.with_projection(mask).build().map_err(|e| {
            lake_error("cannot read a silver data file", &self.ident)
                .with_context("file", path)
                .with_source(e)
        })?;
        let mut keys = Vec::new();
        for batch in reader {
            let batch = batch.map_err(|e| {
                lake_error("cannot read a silver data file", &self.ident)
                    .with_context("file", path)
                    .with_source(e)
            })?;
            let columns: Vec<ArrayRef> = names
                .iter()
                .map(|n| {
                    batch.column_by_name(n).cloned().ok_or_else(|| {
                        lake_error("a data file lacks a key column", &self.ident)
                            .with_context("file", path)
                    })
                })
                .collect::<Result<_>>()?;
            keys.extend(self.encode_keys(&columns)?);
        }
        Ok(keys)
    }

    fn encode_keys(&self, columns: &[ArrayRef]) -> Result<Vec<Box<[u8]>>> {
        let rows = self
            .converter
            .convert_columns(columns)
            .map_err(|e| lake_error("cannot encode the primary key", &self.ident).with_source(e))?;
        Ok(rows.iter().map(|r| r.as_ref().into()).collect())
    }

    /// The key of a row image of `change`'s relation.
    fn key_of(&self, change: &Change, row: &[Datum]) -> Result<Box<[u8]>> {
        let mut columns = Vec::with_capacity(self.key_fields.len());
        for &i in &self.key_fields {
            let field = self.schema.field(i);
            let value = change
                .relation
                .columns
                .iter()
                .position(|c| c.name == *field.name())
                .and_then(|j| row.get(j));
            let Some(Datum::Value(v)) = value else {
                return Err(
                    Error::new(ErrorKind::Decode, "a change lacks its primary key")
                        .with_context("table", &change.relation.name)
                        .with_context("column", field.name())
                        .with_context("lsn", change.lsn),
                );
            };
            columns.push(build_array(field, &[Some(v)])?);
        }
        Ok(self.encode_keys(&columns)?.remove(0))
    }

    /// Applies a batch of changes, in commit order, as one snapshot that
    /// records `commit_lsn` (the last transaction the batch fully holds).
    pub async fn apply(&mut self, lake: &Lake, changes: &[&Change], commit_lsn: Lsn) -> Result<()> {
        let mut pending: HashMap<Box<[u8]>, Pending<'_>> = HashMap::new();
        let mut order: Vec<Box<[u8]>> = Vec::new();
        let mut truncated = false;
        for &change in changes {
            match change.op {
                Op::Truncate => {
                    pending.clear();
                    order.clear();
                    truncated = true;
                }
                Op::Delete => {
                    let before = change
                        .before
                        .as_ref()
                        .ok_or_else(|| missing_image(change))?;
                    let key = self.key_of(change, &before.row)?;
                    remember(&mut pending, &mut order, key, Pending::Delete);
                }
                Op::Read | Op::Insert | Op::Update => {
                    let after = change.after.as_ref().ok_or_else(|| missing_image(change))?;
                    let key = self.key_of(change, after)?;
                    if let Some(before) = &change.before {
                        let old_key = self.key_of(change, &before.row)?;
                        if old_key != key {
                            remember(&mut pending, &mut order, old_key, Pending::Delete);
                        }
                    }
                    let previous = pending.get(&key);
                    let row = self.new_row(change, after, previous)?;
                    remember(
                        &mut pending,
                        &mut order,
                        key,
                        Pending::Upsert { change, row },
                    );
                }
            }
        }

        let mut deletes: Vec<(String, i64)> = Vec::new();
        let mut removed: Vec<Box<[u8]>> = Vec::new();
        if truncated {
            deletes.extend(self.index.values().map(|l| (l.file.to_string(), l.pos)));
            removed.extend(self.index.keys().cloned());
        }
        let mut upserts: Vec<NewRow<'_>> = Vec::new();
        for key in order {
            let Some(op) = pending.remove(&key) else {
                continue;
            };
            if !truncated {
                if let Some(location) = self.index.get(&key) {
                    deletes.push((location.file.to_string(), location.pos));
                    removed.push(key.clone());
                }
            }
            if let Pending::Upsert { change, row } = op {
                upserts.push(NewRow {
                    key,
                    change,
                    values: row,
                });
            }
        }
        if deletes.is_empty() && upserts.is_empty() {
            return Ok(());
        }

        let table = lake.catalog_table(&self.ident).await?;
        let mut delta = RowDelta {
            properties: HashMap::from([(SUMMARY_COMMIT_LSN.to_owned(), commit_lsn.0.to_string())]),
            ..RowDelta::default()
        };
        if !deletes.is_empty() {
            delta
                .delete_files
                .push(write_position_deletes(&table, deletes).await?);
        }
        if !upserts.is_empty() {
            let batch = self.batch(&upserts)?;
            delta.data_files = write_data_files(&table, batch).await?;
        }
        commit_row_delta(lake, &self.ident, &delta).await?;

        for key in removed {
            self.index.remove(&key);
        }
        let mut rows = upserts.into_iter().map(|row| row.key);
        for file in &delta.data_files {
            let path: Arc<str> = file.file_path().into();
            for pos in 0..file.record_count() as i64 {
                let key = rows
                    .next()
                    .ok_or_else(|| lake_error("more rows written than given", &self.ident))?;
                self.index.insert(
                    key,
                    Location {
                        file: path.clone(),
                        pos,
                    },
                );
            }
        }
        Ok(())
    }

    /// The values silver stores for an insert or update, unchanged TOAST
    /// values filled from a complete before image or from this batch.
    fn new_row<'a>(
        &self,
        change: &'a Change,
        after: &'a [Datum],
        previous: Option<&Pending<'a>>,
    ) -> Result<Vec<Option<&'a Value>>> {
        let fields = self.schema.fields();
        let source_fields = &fields[..fields.len() - 2];
        source_fields
            .iter()
            .enumerate()
            .map(|(field_index, field)| {
                let Some(j) = change
                    .relation
                    .columns
                    .iter()
                    .position(|c| c.name == *field.name())
                else {
                    return Ok(None);
                };
                match &after[j] {
                    Datum::Value(Value::Null) | Datum::NotSent => Ok(None),
                    Datum::Value(v) => Ok(Some(v)),
                    Datum::UnchangedToast => {
                        if let Some(before) =
                            change.before.as_ref().filter(|b| b.kind == ImageKind::Full)
                        {
                            if let Some(Datum::Value(v)) = before.row.get(j) {
                                return Ok(Some(v));
                            }
                        }
                        if let Some(Pending::Upsert { row, .. }) = previous {
                            return Ok(row[field_index]);
                        }
                        Err(Error::new(
                            ErrorKind::Decode,
                            "an unchanged TOAST value has no known current value to fill it with",
                        )
                        .with_context("table", &change.relation.name)
                        .with_context("column", field.name())
                        .with_context("lsn", change.lsn))
                    }
                }
            })
            .collect()
    }

    fn batch(&self, upserts: &[NewRow<'_>]) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for (i, field) in self.schema.fields().iter().enumerate() {
            let array: ArrayRef = match field.name().as_str() {
                COMMIT_LSN => {
                    let mut b = Int64Builder::with_capacity(upserts.len());
                    upserts
                        .iter()
                        .for_each(|r| b.append_value(r.change.tx.commit_lsn.0 as i64));
                    Arc::new(b.finish())
                }
                COMMIT_TS => {
                    let DataType::Timestamp(_, zone) = field.data_type() else {
                        return Err(lake_error(
                            "the silver table's schema is not the one wal2iceberg writes",
                            &self.ident,
                        ));
                    };
                    let mut b = TimestampMicrosecondBuilder::with_capacity(upserts.len())
                        .with_timezone_opt(zone.clone());
                    upserts
                        .iter()
                        .for_each(|r| b.append_value(r.change.tx.commit_ts));
                    Arc::new(b.finish())
                }
                _ => {
                    let cells: Vec<Option<&Value>> = upserts.iter().map(|r| r.values[i]).collect();
                    build_array(field, &cells)?
                }
            };
            columns.push(array);
        }
        RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| lake_error("cannot assemble the silver batch", &self.ident).with_source(e))
    }
}

fn remember<'a>(
    pending: &mut HashMap<Box<[u8]>, Pending<'a>>,
    order: &mut Vec<Box<[u8]>>,
    key: Box<[u8]>,
    op: Pending<'a>,
) {
    if pending.insert(key.clone(), op).is_none() {
        order.push(key);
    }
}

fn missing_image(change: &Change) -> Error {
    Error::new(
        ErrorKind::Protocol,
        "a change lacks the row image its kind needs",
    )
    .with_context("table", &change.relation.name)
    .with_context("lsn", change.lsn)
}

fn lake_error(message: &str, ident: &TableIdent) -> Error {
    Error::new(ErrorKind::Lake, message.to_owned()).with_context("table", ident)
}

async fn read_file(table: &Table, path: &str) -> Result<bytes::Bytes> {
    let input = table
        .file_io()
        .new_input(path)
        .map_err(|e| iceberg_error(e, "cannot open a table file").with_context("file", path))?;
    input
        .read()
        .await
        .map_err(|e| iceberg_error(e, "cannot read a table file").with_context("file", path))
}

/// The (data file, position) pairs of a position delete file.
async fn read_position_deletes(table: &Table, path: &str) -> Result<Vec<(String, i64)>> {
    let bytes = read_file(table, path).await?;
    let bad = |e: parquet::errors::ParquetError| {
        Error::new(ErrorKind::Lake, "cannot read a position delete file")
            .with_context("file", path)
            .with_source(e)
    };
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(bad)?
        .build()
        .map_err(bad)?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| {
            Error::new(ErrorKind::Lake, "cannot read a position delete file").with_source(e)
        })?;
        let files = batch
            .column_by_name("file_path")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>());
        let positions = batch
            .column_by_name("pos")
            .and_then(|c| c.as_any().downcast_ref::<Int64Array>());
        let (Some(files), Some(positions)) = (files, positions) else {
            return Err(Error::new(
                ErrorKind::Lake,
                "a position delete file lacks file_path or pos",
            )
            .with_context("file", path));
        };
        out.extend(
            files
                .iter()
                .zip(positions.iter())
                .filter_map(|(f, p)| Some((f?.to_owned(), p?))),
        );
    }
    Ok(out)
}
