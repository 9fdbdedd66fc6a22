//! Bronze rows: one per change, as Arrow record batches of the bronze
//! schema (src/lake/schema.rs).
//!
//! The source columns hold the after image, or the before image for a
//! delete; `_cdc_before` holds the before image when the server sent one.
//! A column the server did not send is null and named in
//! `_cdc_before._cdc_not_sent`. An unchanged TOAST value in an after image
//! is taken from a complete before image (REPLICA IDENTITY FULL); without
//! one it cannot be filled here, and the batch fails with an error naming
//! the column rather than store a wrong value.

use std::sync::Arc;

use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder, TimestampMicrosecondBuilder};
use arrow_array::{ArrayRef, RecordBatch, StructArray};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, Fields, Schema as ArrowSchema};

use super::arrow::build_array;
use super::schema::{
    BEFORE, BEFORE_IMAGE, BEFORE_NOT_SENT, COMMIT_LSN, COMMIT_TS, LSN, OP, SEQ, XID,
};
use crate::cdc::event::{Change, Datum, ImageKind, Op};
use crate::cdc::value::Value;
use crate::error::{Error, ErrorKind, Result};

/// The record batch of `changes` in `schema` (the bronze table's, as Arrow).
pub fn bronze_batch(schema: &Arc<ArrowSchema>, changes: &[&Change]) -> Result<RecordBatch> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let array: ArrayRef = match field.name().as_str() {
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
            BEFORE => before_column(field.data_type(), changes)?,
            name => {
                let cells = changes
                    .iter()
                    .map(|c| main_image_cell(c, name))
                    .collect::<Result<Vec<_>>>()?;
                build_array(field, &cells)?
            }
        };
        columns.push(array);
    }
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| Error::new(ErrorKind::Lake, "cannot assemble the bronze batch").with_source(e))
}

fn long_column(changes: &[&Change], value: impl Fn(&Change) -> i64) -> ArrayRef {
    let mut b = Int64Builder::with_capacity(changes.len());
    changes.iter().for_each(|c| b.append_value(value(c)));
    Arc::new(b.finish())
}

/// The datum of `name` in a row image of the change's relation, if the
/// relation has that column (a dropped column has none).
fn datum<'a>(change: &Change, row: &'a [Datum], name: &str) -> Option<&'a Datum> {
    let i = change
        .relation
        .columns
        .iter()
        .position(|c| c.name == name)?;
    row.get(i)
}

/// The source column's value in the row bronze shows: the after image, or
/// the before image of a delete.
fn main_image_cell<'a>(change: &'a Change, name: &str) -> Result<Option<&'a Value>> {
    let row = match (change.op, &change.after, &change.before) {
        (Op::Delete, _, Some(before)) => &before.row,
        (_, Some(after), _) => after,
        _ => return Ok(None),
    };
    match datum(change, row, name) {
        None | Some(Datum::NotSent) => Ok(None),
        Some(Datum::Value(v)) => Ok(Some(v)),
        Some(Datum::UnchangedToast) => match &change.before {
            Some(before) if before.kind == ImageKind::Full => {
                match datum(change, &before.row, name) {
                    Some(Datum::Value(v)) => Ok(Some(v)),
                    _ => Err(unfilled(change, name)),
                }
            }
            _ => Err(unfilled(change, name)),
        },
    }
}

fn unfilled(change: &Change, column: &str) -> Error {
    Error::new(
        ErrorKind::Decode,
        "an unchanged TOAST value has no known current value to fill it with",
    )
    .with_context("table", &change.relation.name)
    .with_context("column", column)
    .with_context("lsn", change.lsn)
}

fn before_column(data_type: &DataType, changes: &[&Change]) -> Result<ArrayRef> {
    let DataType::Struct(fields) = data_type else {
        return Err(schema_error(BEFORE));
    };
    let valid: Vec<bool> = changes.iter().map(|c| c.before.is_some()).collect();
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(fields.len());
    for field in fields.iter() {
        let array: ArrayRef = match field.name().as_str() {
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
                let cells: Vec<Option<&Value>> = changes
                    .iter()
                    .map(
                        |c| match c.before.as_ref().and_then(|b| datum(c, &b.row, name)) {
                            Some(Datum::Value(v)) => Some(v),
                            _ => None,
                        },
                    )
                    .collect();
                build_array(field, &cells)?
            }
        };
        arrays.push(array);
    }
    let fields: Fields = fields.clone();
    Ok(Arc::new(
        StructArray::try_new(fields, arrays, Some(NullBuffer::from(valid))).map_err(|e| {
            Error::new(ErrorKind::Lake, "cannot build the before-image column").with_source(e)
        })?,
    ))
}

fn list_element(data_type: &DataType) -> Result<Arc<arrow_schema::Field>> {
    match data_type {
        DataType::List(element) => Ok(element.clone()),
        _ => Err(schema_error(BEFORE_NOT_SENT)),
    }
}

fn schema_error(column: &str) -> Error {
    Error::new(
        ErrorKind::Lake,
        "the bronze table's schema is not the one wal2iceberg writes",
    )
    .with_context("column", column)
}
