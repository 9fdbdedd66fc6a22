//! The key index of a silver table: restored from the state directory,
//! or rebuilt from the table's key columns, and persisted after commits.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::Schema as ArrowSchema;
use futures_util::TryStreamExt;
use iceberg::scan::FileScanTask;
use iceberg::spec::DataContentType;
use iceberg::table::Table;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::schema::types::SchemaDescriptor;

use super::{FileCounts, SilverTable, lake_error};
use crate::cdc::event::{Change, Datum};
use crate::cdc::relation::RelationInfo;
use crate::cdc::value::Value;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::files::align::{align, field_id};
use crate::lake::files::position_deletes::DeleteReader;
use crate::lake::files::writer::read_file;
use crate::lake::iceberg_error;
use crate::lake::table::key::Key;

impl SilverTable {
    /// What the key index is of when it holds exactly `table`'s current
    /// snapshot: the table, the snapshot and the key's field ids and types
    /// (which its encoding follows).
    pub(super) fn index_of(&self, table: &Table) -> Option<String> {
        let snapshot = table.metadata().current_snapshot_id()?;
        Some(self.index_words(self.uuid, snapshot))
    }

    pub(super) fn index_words(&self, uuid: uuid::Uuid, snapshot: i64) -> String {
        let key: Vec<String> = self
            .key_fields
            .iter()
            .map(|&i| {
                let field = self.schema.field(i);
                format!("{:?}:{}", field_id(field), field.data_type())
            })
            .collect();
        format!("{uuid}/{snapshot}/{}", key.join(","))
    }

    /// Persists the key index in its state folder, when it holds exactly
    /// the table's last snapshot this process committed or opened (nothing
    /// staged since); the next start on that snapshot restores it instead
    /// of reading every key. The table is of no more use after it.
    pub(crate) fn persist_index(&mut self) -> Result<bool> {
        let (Some(snapshot), Some(_), false) = (self.exact_at, &self.state, self.staged) else {
            return Ok(false);
        };
        let of = self.index_words(self.uuid, snapshot);
        std::mem::take(&mut self.index)
            .persist(&of)
            .map_err(|e| e.with_context("table", &self.ident))?;
        self.exact_at = None;
        Ok(true)
    }

    /// The live data and delete files of the table's planned `tasks`, as
    /// [`Self::file_counts`] tells them.
    pub(super) fn count_files(&mut self, tasks: &[FileScanTask]) {
        let deletes: std::collections::HashSet<&str> = tasks
            .iter()
            .flat_map(|t| t.deletes.iter().map(|d| d.file_path.as_str()))
            .collect();
        self.files = FileCounts {
            data: tasks.len(),
            deletes: deletes.len(),
            commits: 0,
        };
    }

    pub(super) async fn rebuild_index(&mut self, table: &Table) -> Result<()> {
        let tasks = planned_files(table).await?;
        let mut deletes_by_file: HashMap<Arc<str>, Vec<i64>> = HashMap::new();
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
                    for deleted in DeleteReader::open(table, &delete.file_path).await? {
                        let (file, pos) = deleted?;
                        deletes_by_file.entry(file).or_default().push(pos);
                    }
                }
            }
        }
        self.count_files(&tasks);
        for task in tasks {
            let deleted: std::collections::HashSet<i64> = deletes_by_file
                .remove(task.data_file_path.as_str())
                .unwrap_or_default()
                .into_iter()
                .collect();
            let keys = self.read_keys(table, &task.data_file_path).await?;
            let live = keys
                .into_iter()
                .enumerate()
                .filter(|(pos, _)| !deleted.contains(&(*pos as i64)));
            self.index
                .add_file(task.data_file_path.as_str().into(), live)
                .map_err(|e| e.with_context("table", &self.ident))?;
        }
        tracing::info!(table = %self.ident, rows = self.index.live_rows(), "silver key index rebuilt");
        Ok(())
    }

    /// The encoded keys of a data file's rows, in file order.
    pub(super) async fn read_keys(&self, table: &Table, path: &str) -> Result<Vec<Key>> {
        let bytes = read_file(table, path).await?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| {
            lake_error("cannot read a silver data file", &self.ident)
                .with_context("file", path)
                .with_source(e)
        })?;
        let key_schema = Arc::new(self.schema.project(&self.key_fields).map_err(|e| {
            lake_error("cannot project the key columns", &self.ident).with_source(e)
        })?);
        let mask = key_projection(builder.parquet_schema(), &key_schema);
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
            let batch = align(&batch, &key_schema, path)?;
            keys.extend(self.codec.encode_columns(batch.columns()).map_err(|e| {
                e.with_context("table", &self.ident)
                    .with_context("file", path)
            })?);
        }
        Ok(keys)
    }

    /// The key of a row image of `change`'s relation.
    pub(crate) fn key_of(&self, change: &Change, row: &[Datum]) -> Result<Key> {
        let mut fields = Vec::with_capacity(self.key_fields.len());
        let mut values = Vec::with_capacity(self.key_fields.len());
        for &i in &self.key_fields {
            let field = self.schema.field(i);
            let value = change.column(field.name()).and_then(|j| row.get(j));
            let Some(Datum::Value(v)) = value else {
                return Err(
                    Error::new(ErrorKind::Decode, "a change lacks its primary key")
                        .with_context("table", &change.relation.name)
                        .with_context("column", field.name())
                        .with_context("lsn", change.lsn),
                );
            };
            fields.push(field);
            values.push(v);
        }
        self.codec.encode_values(&fields, &values).map_err(|e| {
            e.with_context("table", &change.relation.name)
                .with_context("lsn", change.lsn)
                .with_context("xid", change.tx.xid)
        })
    }

    /// The key of a backfill chunk's bound: each key column's text output
    /// (`named`: column name and text), parsed as `relation` types it.
    pub(crate) fn key_of_text(
        &self,
        relation: &RelationInfo,
        named: &[(&str, &str)],
    ) -> Result<Key> {
        let mut fields = Vec::with_capacity(self.key_fields.len());
        let mut values = Vec::with_capacity(self.key_fields.len());
        for &i in &self.key_fields {
            let field = self.schema.field(i);
            let bound_error = |m: &str| {
                Error::new(ErrorKind::Decode, m.to_owned())
                    .with_context("table", &relation.name)
                    .with_context("column", field.name())
            };
            let text = named
                .iter()
                .find(|(name, _)| name == field.name())
                .map(|(_, text)| *text)
                .ok_or_else(|| bound_error("a chunk bound lacks a key column"))?;
            let column = relation
                .columns
                .iter()
                .find(|c| &c.name == field.name())
                .ok_or_else(|| bound_error("the table lacks a key column of silver"))?;
            let value = column.pg_type.parse(text).map_err(|e| {
                bound_error("a chunk bound is not of its key column's type").with_source(e)
            })?;
            fields.push(field);
            values.push(value);
        }
        let values: Vec<&Value> = values.iter().collect();
        self.codec
            .encode_values(&fields, &values)
            .map_err(|e| e.with_context("table", &relation.name))
    }
}

/// Arrow schema indices of the primary-key columns (silver's identifier
/// fields), in column order: the order the source's key has.
pub(super) fn key_fields(table: &Table, schema: &ArrowSchema) -> Result<Vec<usize>> {
    let iceberg = table.metadata().current_schema();
    let mut fields = iceberg
        .identifier_field_ids()
        .map(|id| {
            iceberg
                .field_by_id(id)
                .and_then(|f| schema.index_of(&f.name).ok())
        })
        .collect::<Option<Vec<usize>>>()
        .filter(|fields| !fields.is_empty())
        .ok_or_else(|| {
            lake_error(
                "the silver table has no primary key (identifier fields); wal2iceberg did not make it",
                table.identifier(),
            )
        })?;
    fields.sort_unstable();
    Ok(fields)
}

/// The file's leaf columns that hold `keys` (top-level primitives), found
/// as [`align`] finds them: by field id, or by name in a file without ids.
pub(super) fn key_projection(file: &SchemaDescriptor, keys: &ArrowSchema) -> ProjectionMask {
    let leaves = file.columns().iter().enumerate().filter(|(_, column)| {
        let info = column.self_type().get_basic_info();
        keys.fields().iter().any(|key| match field_id(key) {
            Some(id) if info.has_id() => info.id() == id,
            _ => column.path().parts().first() == Some(key.name()),
        })
    });
    ProjectionMask::leaves(file, leaves.map(|(i, _)| i))
}

/// The table's live data files with the delete files that apply to each,
/// as a scan of its current snapshot plans them.
pub(super) async fn planned_files(table: &Table) -> Result<Vec<FileScanTask>> {
    let context = |e: iceberg::Error| {
        iceberg_error(e, "cannot read the silver table").with_context("table", table.identifier())
    };
    if table.metadata().current_snapshot().is_none() {
        return Ok(Vec::new());
    }
    table
        .scan()
        .build()
        .map_err(context)?
        .plan_files()
        .await
        .map_err(context)?
        .try_collect()
        .await
        .map_err(context)
}
