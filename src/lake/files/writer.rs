//! Parquet data files (ZSTD) of a table: written into its data folder and
//! read back, and the source position a snapshot covers.
//!
//! Every snapshot we commit carries its [`Position`]: the commit LSN and
//! the end LSN of the last source transaction it fully contains. Read back
//! at start, it tells which transactions are already in the table, which is
//! what makes a replay add nothing.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use futures_util::TryStreamExt;
use iceberg::TableIdent;
use iceberg::arrow::ArrowFileReader;
use iceberg::spec::{DataContentType, DataFile, DataFileFormat, Snapshot};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator, FileNameGenerator, LocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriterBuilder};
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::blocking::{blocking, blocking_await};
use crate::error::{Error, ErrorKind, Result};
use crate::lake::iceberg_error;
use crate::model::Lsn;

/// An open batch holds at most this many rows, or about this many bytes of
/// values, in memory per table before writing them to a data file.
pub(crate) const STAGE_ROWS: usize = 50_000;
pub(crate) const STAGE_BYTES: usize = 64 << 20;

/// The initial load's data files hold at most this many rows, or about
/// this many bytes of Arrow data, so that what later reads one whole (a
/// compaction, filling unchanged TOAST values) needs bounded memory.
pub(crate) const LOAD_FILE_ROWS: usize = 256 * 1024;
pub(crate) const LOAD_FILE_BYTES: usize = 512 << 20;

/// Rows per Parquet row group: what a writer holds in memory before it
/// encodes them, so a large rewrite streams in bounded memory.
const ROW_GROUP_ROWS: usize = 128 * 1024;

/// A column chunk's dictionary stops growing at this size and the rest of
/// the chunk is written plain. Parquet's default (1 MiB) lets a column of
/// distinct values (keys, notes, timestamps) hash a large dictionary in
/// every row group before giving up: measured on the benchmark's `orders`,
/// 64 KiB encodes twice as fast and the files come out smaller, while a
/// column of few values (a status) keeps its dictionary.
const DICTIONARY_PAGE_BYTES: usize = 64 * 1024;

/// Snapshot summary keys of the source position a snapshot covers.
pub(crate) const SUMMARY_COMMIT_LSN: &str = "wal2iceberg.commit-lsn";
pub(crate) const SUMMARY_END_LSN: &str = "wal2iceberg.end-lsn";
pub(crate) const SUMMARY_COMMIT_TS: &str = "wal2iceberg.commit-ts";

/// The source position a snapshot covers: the last source transaction it
/// fully contains (for the initial load, the consistent point for both).
///
/// A later transaction is in the table exactly when its commit record
/// starts before `end_lsn`: records never overlap, so a commit record that
/// starts before the end of the last one held also ends by then. A
/// snapshot's consistent point is such a record end as well, which is why
/// the comparison is on the end LSN and not on the commit LSN: the first
/// transaction streamed after a load may commit exactly at the consistent
/// point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    /// The source commit time, microseconds since the Unix epoch (for the
    /// load, when it started).
    pub commit_ts: i64,
}

impl Position {
    /// Whether the transaction committed at `commit_lsn` is already held.
    pub(crate) fn holds(self, commit_lsn: Lsn) -> bool {
        commit_lsn < self.end_lsn
    }

    /// Whether this is an initial load's position, which ends where it
    /// commits (the snapshot's consistent point), and not a streamed
    /// transaction's.
    pub(crate) fn is_load(self) -> bool {
        self.commit_lsn == self.end_lsn
    }

    /// The snapshot summary properties that record this position.
    pub fn summary(self) -> HashMap<String, String> {
        HashMap::from([
            (SUMMARY_COMMIT_LSN.to_owned(), self.commit_lsn.0.to_string()),
            (SUMMARY_END_LSN.to_owned(), self.end_lsn.0.to_string()),
            (SUMMARY_COMMIT_TS.to_owned(), self.commit_ts.to_string()),
        ])
    }

    /// The position the table holds: that of the newest snapshot in its
    /// current history that records one. Another engine's commit on top
    /// (a compaction, an overwrite, a delete) records none, and what the
    /// snapshots before it hold is still held; taking such a table for an
    /// unloaded one would load it again.
    pub fn of(table: &Table) -> Result<Option<Position>> {
        for snapshot in ancestors(table) {
            if let Some(position) = Position::of_snapshot(table, snapshot)? {
                return Ok(Some(position));
            }
        }
        Ok(None)
    }

    /// The position a snapshot of `table` covers, if it records one.
    pub(crate) fn of_snapshot(table: &Table, snapshot: &Snapshot) -> Result<Option<Position>> {
        let properties = &snapshot.summary().additional_properties;
        let read = |key: &str| -> Result<Option<i64>> {
            properties
                .get(key)
                .map(|text| {
                    text.parse::<i64>().map_err(|_| {
                        Error::new(
                            ErrorKind::Lake,
                            format!("snapshot summary {key} is not a number"),
                        )
                        .with_context("table", table.identifier())
                    })
                })
                .transpose()
        };
        let lsn = |n: i64| Lsn(n as u64);
        match (
            read(SUMMARY_COMMIT_LSN)?,
            read(SUMMARY_END_LSN)?,
            read(SUMMARY_COMMIT_TS)?,
        ) {
            (Some(commit_lsn), Some(end_lsn), Some(commit_ts)) => Ok(Some(Position {
                commit_lsn: lsn(commit_lsn),
                end_lsn: lsn(end_lsn),
                commit_ts,
            })),
            _ => Ok(None),
        }
    }
}

/// The table's current snapshot and its parents, newest first, as far as
/// the metadata keeps them.
pub(crate) fn ancestors(table: &Table) -> impl Iterator<Item = &Snapshot> {
    let metadata = table.metadata();
    std::iter::successors(metadata.current_snapshot().map(|s| s.as_ref()), |s| {
        s.parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id))
            .map(|s| s.as_ref())
    })
}

/// A `total-*` figure of the current snapshot's summary (`total-data-files`,
/// `total-files-size`, ...); 0 without a snapshot or the figure.
pub(crate) fn summary_total(table: &Table, key: &str) -> u64 {
    table
        .metadata()
        .current_snapshot()
        .and_then(|s| s.summary().additional_properties.get(key)?.parse().ok())
        .unwrap_or(0)
}

/// Writes `batch` as one or more Parquet data files of `table`.
pub async fn write_data_files(table: &Table, batch: RecordBatch) -> Result<Vec<DataFile>> {
    let mut sink = DataFileSink::open(table).await?;
    sink.write(batch).await?;
    sink.close().await
}

/// Parquet data files of a table being written, batch by batch; a new file
/// starts when one reaches iceberg-rust's default target size (512 MiB).
pub(crate) struct DataFileSink {
    writer:
        DataFileWriter<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>,
    ident: TableIdent,
}

fn file_names() -> DefaultFileNameGenerator {
    DefaultFileNameGenerator::new(
        format!("data-{}", uuid::Uuid::new_v4()),
        None,
        DataFileFormat::Parquet,
    )
}

impl DataFileSink {
    pub(crate) async fn open(table: &Table) -> Result<DataFileSink> {
        let properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_dictionary_page_size_limit(DICTIONARY_PAGE_BYTES)
            .build();
        let parquet =
            ParquetWriterBuilder::new(properties, table.metadata().current_schema().clone());
        let locations = DefaultLocationGenerator::new(table.metadata())
            .map_err(|e| sink_error(e, table.identifier()))?;
        let rolling = RollingFileWriterBuilder::new_with_default_file_size(
            parquet,
            table.file_io().clone(),
            locations,
            file_names(),
        );
        let writer = DataFileWriterBuilder::new(rolling)
            .build(None)
            .await
            .map_err(|e| sink_error(e, table.identifier()))?;
        Ok(DataFileSink {
            writer,
            ident: table.identifier().clone(),
        })
    }

    /// Encodes and writes `batch`, off the stream task's way
    /// ([`blocking_await`]).
    pub(crate) async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        blocking_await(self.writer.write(batch))
            .await
            .map_err(|e| sink_error(e, &self.ident))
    }

    /// The files written, in the order of the rows given.
    pub(crate) async fn close(mut self) -> Result<Vec<DataFile>> {
        blocking_await(self.writer.close())
            .await
            .map_err(|e| sink_error(e, &self.ident))
    }
}

/// A data file of an initial load, encoded on a task of its own so that
/// Parquet runs on another core than the decoding that feeds it (at most
/// two batches wait for it). One Parquet file at a path chosen when it is
/// created, so that silver's key index can learn its rows as they are
/// staged; full ([`Self::is_full`]) at [`LOAD_FILE_ROWS`] rows or about
/// [`LOAD_FILE_BYTES`] of Arrow data. Without dictionaries: on the
/// benchmark's load they cost 15 % of the CPU and, under ZSTD, made the
/// files no smaller. Statistics per column chunk, which give the
/// manifest its bounds, not per page: 8 % less CPU.
pub(crate) struct LoadFile {
    path: String,
    rows: usize,
    bytes: usize,
    batches: tokio::sync::mpsc::Sender<RecordBatch>,
    task: tokio::task::JoinHandle<Result<Vec<DataFile>>>,
    ident: TableIdent,
}

impl LoadFile {
    pub(crate) async fn create(table: &Table) -> Result<LoadFile> {
        let ident = table.identifier().clone();
        let error = |e| sink_error(e, table.identifier());
        let locations = DefaultLocationGenerator::new(table.metadata()).map_err(error)?;
        let path = locations.generate_location(None, &file_names().generate_file_name());
        let output = table.file_io().new_output(&path).map_err(error)?;
        let properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_dictionary_enabled(false)
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .build();
        let mut writer =
            ParquetWriterBuilder::new(properties, table.metadata().current_schema().clone())
                .build(output)
                .await
                .map_err(error)?;
        let spec_id = table.metadata().default_partition_spec_id();
        let (batches, mut queue) = tokio::sync::mpsc::channel::<RecordBatch>(2);
        let task_ident = ident.clone();
        let task = tokio::spawn(async move {
            let error = |e| sink_error(e, &task_ident);
            while let Some(batch) = queue.recv().await {
                writer.write(&batch).await.map_err(error)?;
            }
            writer
                .close()
                .await
                .map_err(error)?
                .into_iter()
                .map(|mut file| {
                    file.content(DataContentType::Data)
                        .partition_spec_id(spec_id)
                        .build()
                        .map_err(|e| {
                            Error::new(ErrorKind::Lake, "cannot describe a data file")
                                .with_context("table", &task_ident)
                                .with_source(e)
                        })
                })
                .collect()
        });
        Ok(LoadFile {
            path,
            rows: 0,
            bytes: 0,
            batches,
            task,
            ident,
        })
    }

    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// Rows given so far.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn is_full(&self) -> bool {
        self.rows >= LOAD_FILE_ROWS || self.bytes >= LOAD_FILE_BYTES
    }

    pub(crate) async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        let (rows, bytes) = (batch.num_rows(), batch.get_array_memory_size());
        if self.batches.send(batch).await.is_err() {
            // The task stopped taking batches: it failed.
            return Err(match (&mut self.task).await {
                Ok(Err(e)) => e,
                other => stopped(&self.ident, other.err()),
            });
        }
        self.rows += rows;
        self.bytes += bytes;
        Ok(())
    }

    /// The file written, holding every row given.
    pub(crate) async fn close(self) -> Result<DataFile> {
        drop(self.batches);
        let ident = self.ident.clone();
        let written = match self.task.await {
            Ok(written) => written?,
            Err(e) => return Err(stopped(&ident, Some(e))),
        };
        match <[DataFile; 1]>::try_from(written) {
            Ok([file]) if file.record_count() == self.rows as u64 => Ok(file),
            _ => Err(Error::new(
                ErrorKind::Lake,
                "the load's data file does not hold the rows given",
            )
            .with_context("table", &ident)
            .with_context("file", &self.path)
            .with_context("rows", self.rows)),
        }
    }
}

fn stopped(ident: &TableIdent, e: Option<tokio::task::JoinError>) -> Error {
    let error =
        Error::new(ErrorKind::Lake, "the data file writer stopped").with_context("table", ident);
    match e {
        Some(e) => error.with_source(e),
        None => error,
    }
}

fn sink_error(e: iceberg::Error, ident: &TableIdent) -> Error {
    iceberg_error(e, "cannot write a data file").with_context("table", ident)
}

/// The bytes of one file of the table.
pub(crate) async fn read_file(table: &Table, path: &str) -> Result<bytes::Bytes> {
    let input = table
        .file_io()
        .new_input(path)
        .map_err(|e| iceberg_error(e, "cannot open a table file").with_context("file", path))?;
    input
        .read()
        .await
        .map_err(|e| iceberg_error(e, "cannot read a table file").with_context("file", path))
}

/// The rows of a Parquet file of the table, batch by batch as they are
/// decoded, each off the stream task's way ([`blocking`]; the file's
/// bytes are read whole); `what` says what failed.
pub(crate) async fn read_parquet(
    table: &Table,
    path: &str,
    what: &str,
) -> Result<impl Iterator<Item = Result<RecordBatch>> + use<>> {
    let bytes = read_file(table, path).await?;
    let (ident, path, what) = (table.identifier().clone(), path.to_owned(), what.to_owned());
    let bad = move |e: Box<dyn std::error::Error + Send + Sync>| {
        Error::new(ErrorKind::Lake, what.clone())
            .with_context("table", &ident)
            .with_context("file", &path)
            .with_source(e)
    };
    let mut reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.build())
        .map_err(|e| bad(e.into()))?;
    Ok(std::iter::from_fn(move || blocking(|| reader.next()))
        .map(move |batch| batch.map_err(|e| bad(e.into()))))
}

/// The rows of one row group of a Parquet file of the table: the one
/// that holds row `row` of the file, read by range (its column chunks
/// and the footer, not the whole file). Its first row's position in the
/// file, and its batches as they are decoded.
pub(crate) async fn read_row_group(
    table: &Table,
    path: &str,
    row: usize,
) -> Result<(usize, Vec<RecordBatch>)> {
    let bad = |what: &str, e: Box<dyn std::error::Error + Send + Sync>| {
        Error::new(
            ErrorKind::Lake,
            format!("cannot read a data file's row group: {what}"),
        )
        .with_context("table", table.identifier())
        .with_context("file", path)
        .with_source(e)
    };
    let input = table
        .file_io()
        .new_input(path)
        .map_err(|e| iceberg_error(e, "cannot open a table file").with_context("file", path))?;
    let metadata = input
        .metadata()
        .await
        .map_err(|e| iceberg_error(e, "cannot open a table file").with_context("file", path))?;
    let reader = input
        .reader()
        .await
        .map_err(|e| iceberg_error(e, "cannot open a table file").with_context("file", path))?;
    let builder =
        ParquetRecordBatchStreamBuilder::new(ArrowFileReader::new(metadata, Box::new(reader)))
            .await
            .map_err(|e| bad("its footer", e.into()))?;
    let mut first = 0;
    let mut group = None;
    for (i, g) in builder.metadata().row_groups().iter().enumerate() {
        let rows = usize::try_from(g.num_rows()).unwrap_or(0);
        if row < first + rows {
            group = Some(i);
            break;
        }
        first += rows;
    }
    let Some(group) = group else {
        return Err(bad(
            "the row is past its end",
            "no row group holds it".into(),
        ));
    };
    let stream = builder
        .with_row_groups(vec![group])
        .build()
        .map_err(|e| bad("its rows", e.into()))?;
    let batches = blocking_await(stream.try_collect::<Vec<_>>())
        .await
        .map_err(|e| bad("its rows", e.into()))?;
    Ok((first, batches))
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
