//! The initial load's rows into silver: runs of rows written as data
//! files, each key entered in the index.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow_schema::{DataType, FieldRef};

use super::{Load, SilverTable, lake_error};
use crate::cdc::event::TxInfo;
use crate::error::Result;
use crate::lake::catalog::Lake;
use crate::lake::files::arrow::{Verbatim, load_source_column};
use crate::lake::files::writer::LoadFile;
use crate::lake::schema::{COMMIT_LSN, COMMIT_TS, VERBATIM};

impl SilverTable {
    /// Adds rows of the initial load of transaction `tx`: `columns` are
    /// the source columns (silver's types, in the relation's order, named
    /// by `fields`). They are encoded on a task of their own into the
    /// load's data files ([`LoadFile`]); the index learns their keys now.
    pub(crate) async fn stage_load(
        &mut self,
        lake: &Lake,
        tx: TxInfo,
        fields: &[FieldRef],
        columns: &[ArrayRef],
        verbatim: &Verbatim,
    ) -> Result<()> {
        self.staged = true;
        self.undo = None;
        let rows = columns.first().map_or(0, |c| c.len());
        let mut out: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for field in self.schema.fields() {
            out.push(match field.name().as_str() {
                VERBATIM => verbatim.array(field, rows)?,
                COMMIT_LSN => Arc::new(Int64Array::from_value(tx.commit_lsn.0 as i64, rows)),
                COMMIT_TS => {
                    let DataType::Timestamp(_, zone) = field.data_type() else {
                        return Err(lake_error(
                            "the silver table's schema is not the one wal2iceberg writes",
                            &self.ident,
                        ));
                    };
                    Arc::new(
                        TimestampMicrosecondArray::from_value(tx.commit_ts, rows)
                            .with_timezone_opt(zone.clone()),
                    )
                }
                _ => load_source_column(field, fields, columns, rows)
                    .map_err(|e| e.with_context("table", &self.ident))?,
            });
        }
        let key_columns: Vec<ArrayRef> = self.key_fields.iter().map(|&i| out[i].clone()).collect();
        let keys = self
            .codec
            .encode_columns(&key_columns)
            .map_err(|e| e.with_context("table", &self.ident))?;
        let load = self.load.get_or_insert_with(|| Load {
            file: None,
            into_empty: self.index.is_empty() && self.pending.is_empty(),
        });
        if !load.into_empty {
            // A table loaded again over rows it holds (not one wal2iceberg
            // loaded) loses them by key; the keys are then new to the index.
            for key in &keys {
                if let Some(location) = self.index.remove(key)? {
                    self.deletes.push(location);
                }
            }
        }
        let batch = RecordBatch::try_new(self.schema.clone(), out).map_err(|e| {
            lake_error("cannot assemble the silver batch", &self.ident).with_source(e)
        })?;
        let (file, indexed) = match &mut load.file {
            Some(open) => open,
            None => {
                let table = self.schema_changes.table(lake, &self.ident).await?;
                let file = LoadFile::create(&table).await?;
                let indexed = self.index.new_file(file.path().into())?;
                load.file.insert((file, indexed))
            }
        };
        let rows = (file.rows()..).zip(keys);
        file.write(batch).await?;
        if load.into_empty {
            self.index.add_fresh_rows(indexed, rows)
        } else {
            self.index.add_new_rows(indexed, rows)
        }
        .map_err(|e| e.with_context("table", &self.ident))?;
        if file.is_full() {
            self.finish_load_file().await?;
        }
        self.write_deletes_when_full(lake).await
    }

    /// Closes the load's data file, which the index already knows.
    pub(super) async fn finish_load_file(&mut self) -> Result<()> {
        let Some((file, indexed)) = self.load.as_mut().and_then(|l| l.file.take()) else {
            return Ok(());
        };
        self.index.end_new_file(indexed);
        self.written.push(file.close().await?);
        Ok(())
    }
}
