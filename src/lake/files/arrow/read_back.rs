//! Stored arrays read back: a cell as the value it was built from (to
//! fill unchanged TOAST values), a load's source column as the table
//! types it.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, DecimalType, Float32Type, Float64Type, Int32Type, Int64Type,
    Time64MicrosecondType, TimestampMicrosecondType,
};
use arrow_array::{Array, ArrayRef, ListArray, new_null_array};
use arrow_schema::{DataType, Field, FieldRef, TimeUnit};

use crate::cdc::temporal::MaybeInfinite;
use crate::cdc::value::{Numeric, Value};
use crate::error::{Error, ErrorKind, Result};

/// A table's column `field` for `rows` load rows: the source column of
/// that name among `fields` (its array in `columns`), as the table types
/// it; nulls when the source lacks it.
pub(crate) fn load_source_column(
    field: &Field,
    fields: &[FieldRef],
    columns: &[ArrayRef],
    rows: usize,
) -> Result<ArrayRef> {
    match fields.iter().position(|f| f.name() == field.name()) {
        Some(i) => retype(&columns[i], field.data_type()),
        None => Ok(new_null_array(field.data_type(), rows)),
    }
}

/// `array` as `to`, a type that differs at most in the field metadata of
/// list elements (the field ids of bronze and silver differ).
pub(super) fn retype(array: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    // A column narrowed at the source keeps its wider field (lake/evolve):
    // its values widen into it, exactly.
    let widens = match (array.data_type(), to) {
        (DataType::Int32, DataType::Int64) | (DataType::Float32, DataType::Float64) => true,
        (DataType::Decimal128(p, s), DataType::Decimal128(q, t)) => s == t && q >= p,
        _ => false,
    };
    if widens {
        return arrow_cast::cast(array, to).map_err(|e| {
            Error::new(
                ErrorKind::Lake,
                format!("cannot widen a {} array to {to}", array.data_type()),
            )
            .with_source(e)
        });
    }
    match (array.as_list_opt::<i32>(), to) {
        (Some(list), DataType::List(element)) => Ok(Arc::new(
            ListArray::try_new(
                element.clone(),
                list.offsets().clone(),
                retype(list.values(), element.data_type())?,
                list.nulls().cloned(),
            )
            .map_err(|e| Error::new(ErrorKind::Lake, "cannot build a list array").with_source(e))?,
        )),
        _ => Err(Error::new(
            ErrorKind::Lake,
            format!("cannot use a {} array as {to}", array.data_type()),
        )),
    }
}

pub(super) fn decode_infinite<T: Copy + PartialEq + std::ops::Neg<Output = T>>(
    stored: T,
    max: T,
) -> MaybeInfinite<T> {
    if stored == max {
        MaybeInfinite::Infinity
    } else if stored == -max {
        MaybeInfinite::NegInfinity
    } else {
        MaybeInfinite::Finite(stored)
    }
}

/// The value a stored cell holds, in the variant [`build_array`] turns back
/// into the same cell (strings come back as text).
pub(crate) fn arrow_value(array: &dyn Array, row: usize) -> Result<Value> {
    if array.is_null(row) {
        return Ok(Value::Null);
    }
    let value =
        match array.data_type() {
            DataType::Boolean => Value::Bool(array.as_boolean().value(row)),
            DataType::Int32 => Value::Int4(array.as_primitive::<Int32Type>().value(row)),
            DataType::Int64 => Value::Int8(array.as_primitive::<Int64Type>().value(row)),
            DataType::Float32 => Value::Float4(array.as_primitive::<Float32Type>().value(row)),
            DataType::Float64 => Value::Float8(array.as_primitive::<Float64Type>().value(row)),
            DataType::Decimal128(_, scale) => {
                Value::Numeric(Numeric::Finite(Decimal128Type::format_decimal(
                    array.as_primitive::<Decimal128Type>().value(row),
                    38,
                    *scale,
                )))
            }
            DataType::Utf8 => Value::Text(array.as_string::<i32>().value(row).to_owned()),
            DataType::LargeBinary => Value::Bytea(array.as_binary::<i64>().value(row).to_vec()),
            DataType::Date32 => Value::Date(decode_infinite(
                array.as_primitive::<Date32Type>().value(row),
                i32::MAX,
            )),
            DataType::Time64(TimeUnit::Microsecond) => {
                Value::Time(array.as_primitive::<Time64MicrosecondType>().value(row))
            }
            DataType::Timestamp(TimeUnit::Microsecond, zone) => {
                let t = decode_infinite(
                    array.as_primitive::<TimestampMicrosecondType>().value(row),
                    i64::MAX,
                );
                if zone.is_some() {
                    Value::TimestampTz(t)
                } else {
                    Value::Timestamp(t)
                }
            }
            DataType::FixedSizeBinary(16) => {
                let bytes = array.as_fixed_size_binary().value(row);
                Value::Uuid(bytes.try_into().map_err(|_| {
                    Error::new(ErrorKind::Lake, "a uuid cell does not hold 16 bytes")
                })?)
            }
            DataType::List(_) => {
                let items = array.as_list::<i32>().value(row);
                Value::Array(
                    (0..items.len())
                        .map(|i| arrow_value(items.as_ref(), i))
                        .collect::<Result<_>>()?,
                )
            }
            other => {
                return Err(Error::new(
                    ErrorKind::Lake,
                    format!("no conversion from Arrow type {other}"),
                ));
            }
        };
    Ok(value)
}
