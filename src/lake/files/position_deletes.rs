//! Position delete files (spec, "Position Delete Files"): rows of a data
//! file's path and a row position in it, sorted by both. They are written
//! from pairs in slices, read back as a stream of pairs, and several are
//! merged as sorted streams: no step holds more than a batch of pairs per
//! file, whatever the files hold (a compaction merges files of millions).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::SchemaRef;
use iceberg::spec::{
    DataContentType, DataFile, DataFileFormat, NestedField, PrimitiveType, Schema, Type,
};
use iceberg::table::Table;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator, FileNameGenerator, LocationGenerator,
};
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriter};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, ErrorKind, Result};
use crate::lake::files::writer::read_parquet;
use crate::lake::iceberg_error;

/// A row of a position delete file: the data file's path (shared by the
/// pairs of one file) and the position of a deleted row in it.
pub(crate) type Deleted = (Arc<str>, i64);

/// Reserved field ids of position delete files (spec, "Reserved Field IDs").
const FILE_PATH_FIELD_ID: i32 = 2_147_483_546;
const POS_FIELD_ID: i32 = 2_147_483_545;

/// Rows of a position delete file built into one Arrow batch at a time.
const DELETE_BATCH_ROWS: usize = 64 * 1024;

/// Writes a position delete file of `deletes`, sorted as the spec requires.
pub async fn write_position_deletes(table: &Table, mut deletes: Vec<Deleted>) -> Result<DataFile> {
    deletes.sort();
    let mut writer = DeleteWriter::open(table).await?;
    for deleted in deletes {
        writer.push(deleted).await?;
    }
    writer.close().await
}

/// A position delete file being written, from pairs given in order.
pub(crate) struct DeleteWriter {
    writer: ParquetWriter,
    arrow: SchemaRef,
    slice: Vec<Deleted>,
    spec_id: i32,
    ident: iceberg::TableIdent,
}

impl DeleteWriter {
    pub(crate) async fn open(table: &Table) -> Result<DeleteWriter> {
        let context = |e: iceberg::Error| write_error(e, table.identifier());
        let schema = Arc::new(
            Schema::builder()
                .with_fields(vec![
                    Arc::new(NestedField::required(
                        FILE_PATH_FIELD_ID,
                        "file_path",
                        Type::Primitive(PrimitiveType::String),
                    )),
                    Arc::new(NestedField::required(
                        POS_FIELD_ID,
                        "pos",
                        Type::Primitive(PrimitiveType::Long),
                    )),
                ])
                .build()
                .map_err(context)?,
        );
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).map_err(context)?);
        let properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build();
        let locations = DefaultLocationGenerator::new(table.metadata()).map_err(context)?;
        let names = DefaultFileNameGenerator::new(
            format!("delete-{}", uuid::Uuid::new_v4()),
            None,
            DataFileFormat::Parquet,
        );
        let path = locations.generate_location(None, &names.generate_file_name());
        let output = table.file_io().new_output(path).map_err(context)?;
        let writer = ParquetWriterBuilder::new(properties, schema)
            .build(output)
            .await
            .map_err(context)?;
        Ok(DeleteWriter {
            writer,
            arrow,
            slice: Vec::with_capacity(DELETE_BATCH_ROWS),
            spec_id: table.metadata().default_partition_spec_id(),
            ident: table.identifier().clone(),
        })
    }

    /// Adds a pair; pairs come in the spec's order.
    pub(crate) async fn push(&mut self, deleted: Deleted) -> Result<()> {
        self.slice.push(deleted);
        if self.slice.len() == DELETE_BATCH_ROWS {
            self.write_slice().await?;
        }
        Ok(())
    }

    /// In slices: the paths repeat for every position.
    async fn write_slice(&mut self) -> Result<()> {
        let batch = RecordBatch::try_new(
            self.arrow.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    self.slice.iter().map(|(p, _)| &**p),
                )),
                Arc::new(Int64Array::from_iter_values(
                    self.slice.iter().map(|(_, pos)| *pos),
                )),
            ],
        )
        .map_err(|e| {
            Error::new(ErrorKind::Lake, "cannot build the position delete batch").with_source(e)
        })?;
        self.slice.clear();
        self.writer
            .write(&batch)
            .await
            .map_err(|e| write_error(e, &self.ident))
    }

    pub(crate) async fn close(mut self) -> Result<DataFile> {
        if !self.slice.is_empty() {
            self.write_slice().await?;
        }
        let ident = self.ident.clone();
        let mut builders = self
            .writer
            .close()
            .await
            .map_err(|e| write_error(e, &ident))?;
        let mut builder = builders.pop().ok_or_else(|| {
            Error::new(
                ErrorKind::Lake,
                "the position delete writer produced no file",
            )
        })?;
        builder
            .content(DataContentType::PositionDeletes)
            .partition_spec_id(self.spec_id)
            .build()
            .map_err(|e| {
                Error::new(ErrorKind::Lake, "cannot describe the position delete file")
                    .with_source(e)
            })
    }
}

fn write_error(e: iceberg::Error, ident: &iceberg::TableIdent) -> Error {
    iceberg_error(e, "cannot write a position delete file").with_context("table", ident)
}

/// The pairs of one position delete file, decoded a batch at a time.
pub(crate) struct DeleteReader {
    batches: Box<dyn Iterator<Item = Result<RecordBatch>> + Send>,
    pending: std::vec::IntoIter<Deleted>,
    path: String,
}

impl DeleteReader {
    /// The pairs of `path` as they lie in the file.
    pub(crate) async fn open(table: &Table, path: &str) -> Result<DeleteReader> {
        let batches = read_parquet(table, path, "cannot read a position delete file").await?;
        Ok(DeleteReader {
            batches: Box::new(batches),
            pending: Vec::new().into_iter(),
            path: path.to_owned(),
        })
    }

    /// The pairs of `path` in the spec's order: streamed when the file
    /// keeps it, as every file wal2iceberg writes does; read whole and
    /// sorted when another writer's file does not (read twice either way).
    pub(crate) async fn open_sorted(table: &Table, path: &str) -> Result<DeleteReader> {
        let mut previous: Option<Deleted> = None;
        let mut sorted = true;
        for deleted in DeleteReader::open(table, path).await? {
            let deleted = deleted?;
            if previous.as_ref().is_some_and(|p| *p > deleted) {
                sorted = false;
                break;
            }
            previous = Some(deleted);
        }
        let reader = DeleteReader::open(table, path).await?;
        if sorted {
            return Ok(reader);
        }
        tracing::warn!(table = %table.identifier(), file = path, "a position delete file is not sorted by file_path and pos as the Iceberg spec requires: it is read whole");
        let mut all = reader.collect::<Result<Vec<_>>>()?;
        all.sort();
        Ok(DeleteReader {
            batches: Box::new(std::iter::empty()),
            pending: all.into_iter(),
            path: path.to_owned(),
        })
    }

    fn decode(&self, batch: &RecordBatch) -> Result<Vec<Deleted>> {
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
            .with_context("file", &self.path));
        };
        let mut out: Vec<Deleted> = Vec::with_capacity(batch.num_rows());
        for (file, pos) in files.iter().zip(positions.iter()) {
            let (Some(file), Some(pos)) = (file, pos) else {
                continue;
            };
            let shared = match out.last() {
                Some((last, _)) if &**last == file => last.clone(),
                _ => Arc::from(file),
            };
            out.push((shared, pos));
        }
        Ok(out)
    }
}

impl Iterator for DeleteReader {
    type Item = Result<Deleted>;

    fn next(&mut self) -> Option<Result<Deleted>> {
        loop {
            if let Some(deleted) = self.pending.next() {
                return Some(Ok(deleted));
            }
            let decoded = self.batches.next()?.and_then(|batch| self.decode(&batch));
            match decoded {
                Ok(pairs) => self.pending = pairs.into_iter(),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// The pairs of readers each in the spec's order, merged into that order,
/// each with the index of the reader it came from (a pair two readers hold
/// comes twice).
pub(crate) struct Merged {
    readers: Vec<DeleteReader>,
    heads: BinaryHeap<Reverse<(Deleted, usize)>>,
}

impl Merged {
    pub(crate) fn new(mut readers: Vec<DeleteReader>) -> Result<Merged> {
        let mut heads = BinaryHeap::with_capacity(readers.len());
        for (i, reader) in readers.iter_mut().enumerate() {
            if let Some(deleted) = reader.next().transpose()? {
                heads.push(Reverse((deleted, i)));
            }
        }
        Ok(Merged { readers, heads })
    }
}

impl Iterator for Merged {
    type Item = Result<(Deleted, usize)>;

    fn next(&mut self) -> Option<Result<(Deleted, usize)>> {
        let Reverse((deleted, i)) = self.heads.pop()?;
        match self.readers[i].next().transpose() {
            Ok(Some(next)) => self.heads.push(Reverse((next, i))),
            Ok(None) => {}
            Err(e) => return Some(Err(e)),
        }
        Some(Ok((deleted, i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lake::catalog::Lake;

    async fn table(dir: &std::path::Path) -> Table {
        let lake = Lake::open_embedded(dir).await.unwrap();
        let schema = Schema::builder()
            .with_fields(vec![Arc::new(NestedField::required(
                1,
                "id",
                Type::Primitive(PrimitiveType::Long),
            ))])
            .build()
            .unwrap();
        let ident = iceberg::TableIdent::from_strs(["ns", "t"]).unwrap();
        lake.ensure_table(&ident, schema).await.unwrap()
    }

    /// Writes `pairs` as given, sorted or not.
    async fn file(table: &Table, pairs: &[(&str, i64)]) -> String {
        let mut writer = DeleteWriter::open(table).await.unwrap();
        for (path, pos) in pairs {
            writer.push((Arc::from(*path), *pos)).await.unwrap();
        }
        writer.close().await.unwrap().file_path().to_owned()
    }

    fn pairs(deleted: Vec<Deleted>) -> Vec<(String, i64)> {
        deleted
            .into_iter()
            .map(|(p, pos)| (p.to_string(), pos))
            .collect()
    }

    #[tokio::test]
    async fn a_file_of_many_slices_reads_back_pair_for_pair_with_paths_shared() {
        let dir = tempfile::tempdir().unwrap();
        let table = table(dir.path()).await;
        let many: Vec<Deleted> = (0..(DELETE_BATCH_ROWS as i64 * 2 + 7))
            .map(|i| (Arc::from(format!("f{}", i / 50_000)), i))
            .collect();
        let path = write_position_deletes(&table, many.iter().rev().cloned().collect())
            .await
            .unwrap();
        let read: Vec<Deleted> = DeleteReader::open(&table, path.file_path())
            .await
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(pairs(read.clone()), pairs(many));
        assert!(Arc::ptr_eq(&read[0].0, &read[1].0));
    }

    #[tokio::test]
    async fn files_merge_in_the_specs_order_and_one_out_of_order_is_sorted_first() {
        let dir = tempfile::tempdir().unwrap();
        let table = table(dir.path()).await;
        let sorted = file(&table, &[("a", 1), ("a", 5), ("b", 0)]).await;
        let unsorted = file(&table, &[("b", 2), ("a", 5), ("a", 0)]).await;
        let readers = vec![
            DeleteReader::open_sorted(&table, &sorted).await.unwrap(),
            DeleteReader::open_sorted(&table, &unsorted).await.unwrap(),
        ];
        let merged: Vec<((String, i64), usize)> = Merged::new(readers)
            .unwrap()
            .map(|m| m.map(|((p, pos), i)| ((p.to_string(), pos), i)))
            .collect::<Result<_>>()
            .unwrap();
        let at = |p: &str, pos, i| ((p.to_owned(), pos), i);
        assert_eq!(
            merged,
            vec![
                at("a", 0, 1),
                at("a", 1, 0),
                at("a", 5, 0),
                at("a", 5, 1),
                at("b", 0, 0),
                at("b", 2, 1),
            ]
        );
        // As it lies, the unsorted file keeps its order.
        let raw: Vec<Deleted> = DeleteReader::open(&table, &unsorted)
            .await
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(
            pairs(raw),
            vec![("b".into(), 2), ("a".into(), 5), ("a".into(), 0)]
        );
    }
}
