//! Bronze rows: one per change, as Arrow record batches of the bronze
//! schema (src/lake/schema/mod.rs).
//!
//! The source columns hold the after image, or the before image for a
//! delete; `_cdc_before` holds the before image when the server sent one.
//! A column the server did not send is null and named in
//! `_cdc_before._cdc_not_sent`. Unchanged TOAST values in an after image
//! must have been filled with the row's current value before a change
//! reaches bronze (`SilverTable::fill_unchanged`); one that was not is an
//! error naming the column, never a placeholder.
//!
//! [`BronzeTable`] stages changes into an open batch, written to data files
//! as it grows and committed as one append snapshot at its end.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder, TimestampMicrosecondBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    ArrayRef, Int64Array, RecordBatch, StringArray, StructArray, TimestampMicrosecondArray,
    new_null_array,
};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, FieldRef, Fields, Schema as ArrowSchema};
use futures_util::{Stream, StreamExt};

use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::{TableIdent, TableUpdate};

use crate::cdc::event::{Change, ColumnFinder, Datum, ImageKind, Op, TxInfo};
use crate::cdc::value::Value;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::catalog::row_delta::{RowDelta, Written, commit_row_delta};
use crate::lake::files::arrow::{Verbatim, build_array_keeping, load_source_column, with_verbatim};
use crate::lake::files::scan::scan;
use crate::lake::files::writer::{
    LoadFile, Position, STAGE_BYTES, STAGE_ROWS, arrow_schema, write_data_files,
};
use crate::lake::schema::staged::StagedSchema;
use crate::lake::schema::{
    BEFORE, BEFORE_IMAGE, BEFORE_NOT_SENT, COMMIT_LSN, COMMIT_TS, LSN, OP, SEQ, VERBATIM, XID,
    column_names,
};

/// The bronze table of one source table and its open batch.
pub(crate) struct BronzeTable {
    ident: TableIdent,
    buffer: Vec<Arc<Change>>,
    buffer_bytes: usize,
    written: Vec<DataFile>,
    /// The initial load's data file being written, and the table's schema
    /// as Arrow while it is.
    load: Option<(LoadFile, Arc<ArrowSchema>)>,
    /// The schema changes the open batch commits.
    schema: StagedSchema,
}

impl BronzeTable {
    pub(crate) fn new(ident: TableIdent) -> BronzeTable {
        BronzeTable {
            ident,
            buffer: Vec::new(),
            buffer_bytes: 0,
            written: Vec::new(),
            load: None,
            schema: StagedSchema::default(),
        }
    }

    pub(crate) fn ident(&self) -> &TableIdent {
        &self.ident
    }

    /// The table as the open batch sees it: its schema changes staged.
    pub(crate) async fn table(&self, lake: &Lake) -> Result<Table> {
        self.schema.table(lake, &self.ident).await
    }

    /// Stages schema updates planned on [`Self::table`], for the open
    /// batch's commit.
    pub(crate) fn stage_schema(&mut self, table: &Table, updates: Vec<TableUpdate>) {
        self.schema.stage(table, updates);
    }

    /// Whether the open batch commits a schema change.
    pub(crate) fn schema_staged(&self) -> bool {
        self.schema.changes_schema()
    }

    /// Bronze's rows, which must all be of its initial load at `at`, batch
    /// by batch as silver's load takes them: the source columns (by name,
    /// the before images left out) and the values each row kept verbatim.
    /// Silver is loaded from them when a crash came between the two load
    /// commits, so that both start at the same position.
    pub(crate) async fn load_rows(
        &self,
        lake: &Lake,
        at: Position,
    ) -> Result<impl Stream<Item = Result<(RecordBatch, Verbatim)>> + use<>> {
        let table = self.table(lake).await?;
        let columns: Vec<String> = column_names(&table)
            .into_iter()
            .filter(|name| name != BEFORE)
            .collect();
        let ident = self.ident.clone();
        let rows = scan(&table, None, &columns).await?.map(move |batch| {
            let batch = batch?;
            let verbatim =
                load_verbatim(&batch, at).map_err(|e| e.with_context("table", &ident))?;
            Ok((batch, verbatim))
        });
        Ok(rows)
    }

    /// Adds a change of about `bytes` (`Change::approx_bytes`) to the open
    /// batch.
    pub(crate) async fn stage(
        &mut self,
        lake: &Lake,
        change: Arc<Change>,
        bytes: usize,
    ) -> Result<()> {
        self.buffer_bytes += bytes;
        self.buffer.push(change);
        if self.buffer.len() >= STAGE_ROWS || self.buffer_bytes >= STAGE_BYTES {
            self.write_buffer(lake).await?;
        }
        Ok(())
    }

    async fn write_buffer(&mut self, lake: &Lake) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let table = self.table(lake).await?;
        let changes: Vec<&Change> = self.buffer.iter().map(AsRef::as_ref).collect();
        let batch = bronze_batch(&arrow_schema(&table)?, &changes)
            .map_err(|e| e.with_context("table", &self.ident))?;
        self.written.extend(write_data_files(&table, batch).await?);
        self.buffer.clear();
        self.buffer_bytes = 0;
        Ok(())
    }

    /// Adds rows of the initial load of transaction `tx`, numbered from
    /// `first_seq`: `columns` are the source columns (silver's types, in
    /// the relation's order, named by `fields`). They are encoded on a
    /// task of their own into the files of the open batch.
    pub(crate) async fn stage_load(
        &mut self,
        lake: &Lake,
        tx: TxInfo,
        first_seq: u64,
        fields: &[FieldRef],
        columns: &[ArrayRef],
        verbatim: &Verbatim,
    ) -> Result<()> {
        let (file, schema) = match &mut self.load {
            Some(open) => open,
            None => {
                let table = self.table(lake).await?;
                let open = (LoadFile::create(&table).await?, arrow_schema(&table)?);
                self.load.insert(open)
            }
        };
        let batch = load_batch(schema, tx, first_seq, fields, columns, verbatim)
            .map_err(|e| e.with_context("table", &self.ident))?;
        file.write(batch).await?;
        if file.is_full() {
            self.finish_load_file().await?;
        }
        Ok(())
    }

    /// Writes what the open batch holds in memory to its data files, in
    /// the table's schema as it is: the changes staged name their columns
    /// as that schema does, which a rename is about to change.
    pub(crate) async fn write_staged(&mut self, lake: &Lake) -> Result<()> {
        self.finish_load_file().await?;
        self.write_buffer(lake).await
    }

    async fn finish_load_file(&mut self) -> Result<()> {
        if let Some((file, _)) = self.load.take() {
            self.written.push(file.close().await?);
        }
        Ok(())
    }

    /// Commits the open batch as one snapshot recording `position` (an
    /// empty one when nothing was staged).
    pub(crate) async fn commit(&mut self, lake: &Lake, position: Position) -> Result<Written> {
        self.commit_with(lake, position.summary()).await
    }

    /// [`Self::commit`], its snapshot summary recording `mark` too.
    pub(crate) async fn commit_recording(
        &mut self,
        lake: &Lake,
        position: Position,
        (key, value): (&str, &str),
    ) -> Result<Written> {
        let mut properties = position.summary();
        properties.insert(key.to_owned(), value.to_owned());
        self.commit_with(lake, properties).await
    }

    async fn commit_with(
        &mut self,
        lake: &Lake,
        properties: HashMap<String, String>,
    ) -> Result<Written> {
        let delta = self.prepare_with(lake, properties).await?;
        commit_row_delta(lake, &self.ident, &delta).await?;
        Ok(delta.written())
    }

    /// What [`Self::commit`] commits, written and handed over, for a
    /// commit of several tables at once.
    pub(crate) async fn prepare_commit(
        &mut self,
        lake: &Lake,
        position: Position,
    ) -> Result<RowDelta> {
        self.prepare_with(lake, position.summary()).await
    }

    async fn prepare_with(
        &mut self,
        lake: &Lake,
        properties: HashMap<String, String>,
    ) -> Result<RowDelta> {
        self.finish_load_file().await?;
        self.write_buffer(lake).await?;
        Ok(RowDelta {
            data_files: std::mem::take(&mut self.written),
            properties,
            schema: std::mem::take(&mut self.schema),
            ..RowDelta::default()
        })
    }
}

/// The record batch of `changes` in `schema` (the bronze table's, as Arrow).
pub fn bronze_batch(schema: &Arc<ArrowSchema>, changes: &[&Change]) -> Result<RecordBatch> {
    let mut columns: Vec<Option<ArrayRef>> = Vec::with_capacity(schema.fields().len());
    let mut verbatim = Verbatim::default();
    for field in schema.fields() {
        let array: ArrayRef = match field.name().as_str() {
            VERBATIM => {
                columns.push(None);
                continue;
            }
            COMMIT_LSN => long_column(changes, |c| c.tx.commit_lsn.0 as i64),
            SEQ => long_column(changes, |c| c.seq as i64),
            LSN => long_column(changes, |c| c.lsn.0 as i64),
            XID => long_column(changes, |c| i64::from(c.tx.xid)),
            COMMIT_TS => {
                let DataType::Timestamp(_, zone) = field.data_type() else {
                    return Err(schema_error(COMMIT_TS));
                };
                let mut b = TimestampMicrosecondBuilder::with_capacity(changes.len())
                    .with_timezone_opt(zone.clone());
                changes.iter().for_each(|c| b.append_value(c.tx.commit_ts));
                Arc::new(b.finish())
            }
            OP => {
                let mut b = StringBuilder::with_capacity(changes.len(), changes.len());
                changes.iter().for_each(|c| b.append_value(c.op.code()));
                Arc::new(b.finish())
            }
            BEFORE => before_column(field.data_type(), changes, &mut verbatim)?,
            name => {
                let mut finder = ColumnFinder::new(name);
                let cells = changes
                    .iter()
                    .map(|c| main_image_cell(c, finder.position(c), name))
                    .collect::<Result<Vec<_>>>()?;
                build_array_keeping(field, &cells, &mut verbatim)?
            }
        };
        columns.push(Some(array));
    }
    let columns = with_verbatim(schema.fields(), columns, &verbatim, changes.len())?;
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| Error::new(ErrorKind::Lake, "cannot assemble the bronze batch").with_source(e))
}

/// The bronze batch of load rows: every one a read (`r`) of transaction
/// `tx` without a before image.
fn load_batch(
    schema: &Arc<ArrowSchema>,
    tx: TxInfo,
    first_seq: u64,
    fields: &[FieldRef],
    columns: &[ArrayRef],
    verbatim: &Verbatim,
) -> Result<RecordBatch> {
    let rows = columns.first().map_or(0, |c| c.len());
    let constant = |v: i64| Arc::new(Int64Array::from_value(v, rows)) as ArrayRef;
    let mut out: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let array: ArrayRef = match field.name().as_str() {
            COMMIT_LSN | LSN => constant(tx.commit_lsn.0 as i64),
            SEQ => Arc::new(Int64Array::from_iter_values(
                (first_seq..first_seq + rows as u64).map(|s| s as i64),
            )),
            XID => constant(i64::from(tx.xid)),
            COMMIT_TS => {
                let DataType::Timestamp(_, zone) = field.data_type() else {
                    return Err(schema_error(COMMIT_TS));
                };
                Arc::new(
                    TimestampMicrosecondArray::from_value(tx.commit_ts, rows)
                        .with_timezone_opt(zone.clone()),
                )
            }
            OP => Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                Op::Read.code(),
                rows,
            ))),
            BEFORE => no_before_column(field.data_type(), rows)?,
            VERBATIM => verbatim.array(field, rows)?,
            _ => match load_source_column(field, fields, columns, rows) {
                Ok(array) => array,
                // A resync's relation ahead of bronze's stream, with a type
                // changed since that no field of bronze holds: the planner
                // adds a field that waits for such values (evolve's
                // RETYPED_AHEAD), so this is a safety net, not a path.
                Err(e) => {
                    tracing::warn!(
                        column = %field.name(), error = %e,
                        "a reload's values of a column retyped ahead of bronze's stream are null in bronze's reads"
                    );
                    new_null_array(field.data_type(), rows)
                }
            },
        };
        out.push(array);
    }
    RecordBatch::try_new(schema.clone(), out)
        .map_err(|e| Error::new(ErrorKind::Lake, "cannot assemble the bronze batch").with_source(e))
}

fn long_column(changes: &[&Change], value: impl Fn(&Change) -> i64) -> ArrayRef {
    let mut b = Int64Builder::with_capacity(changes.len());
    changes.iter().for_each(|c| b.append_value(value(c)));
    Arc::new(b.finish())
}

/// The source column's value, at position `at` of the change's relation
/// (`None` when it lacks the column), in the row bronze shows: the after
/// image, or the before image of a delete.
fn main_image_cell<'a>(
    change: &'a Change,
    at: Option<usize>,
    name: &str,
) -> Result<Option<&'a Value>> {
    let row = match (change.op, &change.after, &change.before) {
        (Op::Delete, _, Some(before)) => &before.row,
        (_, Some(after), _) => after,
        _ => return Ok(None),
    };
    match at.and_then(|i| row.get(i)) {
        None | Some(Datum::NotSent) => Ok(None),
        Some(Datum::Value(v)) => Ok(Some(v)),
        Some(Datum::UnchangedToast) => Err(change.unfilled(name)),
    }
}

/// The `_cdc_before` column. Its values that their columns cannot hold go
/// to its own `_cdc_verbatim`, or, in a table made before that field
/// existed, to the row's top-level map (`outer`) as `_cdc_before.<column>`.
fn before_column(
    data_type: &DataType,
    changes: &[&Change],
    outer: &mut Verbatim,
) -> Result<ArrayRef> {
    let DataType::Struct(fields) = data_type else {
        return Err(schema_error(BEFORE));
    };
    let valid: Vec<bool> = changes.iter().map(|c| c.before.is_some()).collect();
    let mut arrays: Vec<Option<ArrayRef>> = Vec::with_capacity(fields.len());
    let mut verbatim = Verbatim::default();
    for field in fields.iter() {
        let array: ArrayRef = match field.name().as_str() {
            VERBATIM => {
                arrays.push(None);
                continue;
            }
            BEFORE_IMAGE => {
                let mut b = StringBuilder::new();
                for c in changes {
                    match &c.before {
                        Some(before) => b.append_value(match before.kind {
                            ImageKind::Full => "full",
                            ImageKind::Key => "key",
                        }),
                        // Placeholder under a null struct; never read.
                        None => b.append_value(""),
                    }
                }
                Arc::new(b.finish())
            }
            BEFORE_NOT_SENT => {
                let mut b = ListBuilder::new(StringBuilder::new())
                    .with_field(list_element(field.data_type())?);
                for c in changes {
                    if let Some(before) = &c.before {
                        for (column, d) in c.relation.columns.iter().zip(&before.row) {
                            if matches!(d, Datum::NotSent | Datum::UnchangedToast) {
                                b.values().append_value(&column.name);
                            }
                        }
                    }
                    b.append(true);
                }
                Arc::new(b.finish())
            }
            name => {
                let mut finder = ColumnFinder::new(name);
                let cells: Vec<Option<&Value>> = changes
                    .iter()
                    .map(|c| {
                        let at = finder.position(c)?;
                        match c.before.as_ref()?.row.get(at) {
                            Some(Datum::Value(v)) => Some(v),
                            _ => None,
                        }
                    })
                    .collect();
                build_array_keeping(field, &cells, &mut verbatim)?
            }
        };
        arrays.push(Some(array));
    }
    if fields.find(VERBATIM).is_none() {
        outer.take_prefixed(std::mem::take(&mut verbatim), &format!("{BEFORE}."));
    }
    let arrays = with_verbatim(fields, arrays, &verbatim, changes.len())?;
    let fields: Fields = fields.clone();
    Ok(Arc::new(
        StructArray::try_new(fields, arrays, Some(NullBuffer::from(valid))).map_err(|e| {
            Error::new(ErrorKind::Lake, "cannot build the before-image column").with_source(e)
        })?,
    ))
}

/// A before-image column of `rows` nulls, its required fields filled with
/// placeholders that the null hides, as [`before_column`] does.
fn no_before_column(data_type: &DataType, rows: usize) -> Result<ArrayRef> {
    let DataType::Struct(fields) = data_type else {
        return Err(schema_error(BEFORE));
    };
    let arrays = fields
        .iter()
        .map(|field| {
            Ok(match field.name().as_str() {
                BEFORE_IMAGE => {
                    Arc::new(StringArray::from_iter_values(std::iter::repeat_n("", rows)))
                        as ArrayRef
                }
                BEFORE_NOT_SENT => {
                    let mut b = ListBuilder::new(StringBuilder::new())
                        .with_field(list_element(field.data_type())?);
                    (0..rows).for_each(|_| b.append(true));
                    Arc::new(b.finish())
                }
                _ => new_null_array(field.data_type(), rows),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(
        StructArray::try_new(fields.clone(), arrays, Some(NullBuffer::new_null(rows))).map_err(
            |e| Error::new(ErrorKind::Lake, "cannot build the before-image column").with_source(e),
        )?,
    ))
}

fn list_element(data_type: &DataType) -> Result<Arc<arrow_schema::Field>> {
    match data_type {
        DataType::List(element) => Ok(element.clone()),
        _ => Err(schema_error(BEFORE_NOT_SENT)),
    }
}

/// The values a batch of bronze's initial load at `at` kept verbatim;
/// an error if a row is not of that load.
fn load_verbatim(batch: &RecordBatch, at: Position) -> Result<Verbatim> {
    let long = |name: &str| {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| schema_error(name))
    };
    let ops = batch
        .column_by_name(OP)
        .and_then(|c| c.as_string_opt::<i32>())
        .ok_or_else(|| schema_error(OP))?;
    let commit_lsns = long(COMMIT_LSN)?;
    let load = at.commit_lsn.0 as i64;
    let only_load = ops.iter().all(|op| op == Some(Op::Read.code()))
        && commit_lsns.iter().all(|lsn| lsn == Some(load));
    if !only_load {
        return Err(Error::new(
            ErrorKind::Lake,
            "bronze holds more than its initial load, so silver cannot be loaded from it",
        )
        .with_context("lsn", at.commit_lsn));
    }
    Ok(batch
        .column_by_name(VERBATIM)
        .map(|c| Verbatim::of_column(c))
        .unwrap_or_default())
}

fn schema_error(column: &str) -> Error {
    Error::new(
        ErrorKind::Lake,
        "the bronze table's schema is not the one wal2iceberg writes",
    )
    .with_context("column", column)
}
