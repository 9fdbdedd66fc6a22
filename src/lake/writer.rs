//! Writing Parquet data files (ZSTD) into a table's data folder, and the
//! append commit that records the source position a snapshot covers.
//!
//! Every snapshot we commit carries [`SUMMARY_COMMIT_LSN`]: the highest
//! source commit LSN whose transaction it fully contains. Read back with
//! [`committed_lsn`] at start, it tells which transactions are already in
//! the table, which is what makes a replay add nothing.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::Catalog;
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use super::catalog::iceberg_error;
use crate::error::{Error, Result};
use crate::pg::lsn::Lsn;

/// Snapshot summary key: the highest source commit LSN fully contained.
pub const SUMMARY_COMMIT_LSN: &str = "wal2iceberg.commit-lsn";

/// Writes `batch` as one or more Parquet data files of `table`.
pub async fn write_data_files(table: &Table, batch: RecordBatch) -> Result<Vec<DataFile>> {
    let context = |e: iceberg::Error| {
        iceberg_error(e, "cannot write a data file").with_context("table", table.identifier())
    };
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let parquet = ParquetWriterBuilder::new(properties, table.metadata().current_schema().clone());
    let locations = DefaultLocationGenerator::new(table.metadata()).map_err(context)?;
    let names = DefaultFileNameGenerator::new(
        format!("data-{}", uuid::Uuid::new_v4()),
        None,
        DataFileFormat::Parquet,
    );
    let rolling = RollingFileWriterBuilder::new_with_default_file_size(
        parquet,
        table.file_io().clone(),
        locations,
        names,
    );
    let mut writer = DataFileWriterBuilder::new(rolling)
        .build(None)
        .await
        .map_err(context)?;
    writer.write(batch).await.map_err(context)?;
    writer.close().await.map_err(context)
}

/// Appends data files in one snapshot that records `commit_lsn`.
pub async fn append(
    catalog: &dyn Catalog,
    table: &Table,
    files: Vec<DataFile>,
    commit_lsn: Lsn,
) -> Result<Table> {
    let context = |e: iceberg::Error| {
        iceberg_error(e, "cannot commit to the table")
            .with_context("table", table.identifier())
            .with_context("lsn", commit_lsn)
    };
    let tx = Transaction::new(table);
    let action = tx
        .fast_append()
        .add_data_files(files)
        .set_snapshot_properties(HashMap::from([(
            SUMMARY_COMMIT_LSN.to_owned(),
            commit_lsn.0.to_string(),
        )]));
    let tx = action.apply(tx).map_err(context)?;
    tx.commit(catalog).await.map_err(context)
}

/// The source position the table's current snapshot covers, if any.
pub fn committed_lsn(table: &Table) -> Result<Option<Lsn>> {
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok(None);
    };
    match snapshot
        .summary()
        .additional_properties
        .get(SUMMARY_COMMIT_LSN)
    {
        None => Ok(None),
        Some(text) => text.parse::<u64>().map(|n| Some(Lsn(n))).map_err(|_| {
            Error::new(
                crate::error::ErrorKind::Lake,
                format!("snapshot summary {SUMMARY_COMMIT_LSN} is not a number"),
            )
            .with_context("table", table.identifier())
        }),
    }
}

/// The Arrow schema of the table's current schema, with field ids.
pub fn arrow_schema(table: &Table) -> Result<Arc<arrow_schema::Schema>> {
    iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())
        .map(Arc::new)
        .map_err(|e| {
            iceberg_error(e, "cannot convert the table schema to Arrow")
                .with_context("table", table.identifier())
        })
}
