//! Typed values to Arrow arrays of the column types the schema mapping
//! chose (src/lake/schema.rs, docs/tables.md).
//!
//! Infinite dates and timestamps are stored as the largest and the negated
//! largest value of the column's integer (i32 days, i64 microseconds), the
//! encoding DuckDB reads back as `infinity` and `-infinity`; no finite
//! PostgreSQL date or timestamp comes near them. A value that the column's
//! type cannot hold exactly is an error naming the column, never a silently
//! changed value (see docs/tables.md).
//!
//! [`arrow_value`] reads a stored cell back as a value, to fill unchanged
//! TOAST values from the row a table already holds.

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder, Float32Builder,
    Float64Builder, Int32Builder, Int64Builder, LargeBinaryBuilder, StringBuilder,
    Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, DecimalType, Float32Type, Float64Type, Int32Type, Int64Type,
    Time64MicrosecondType, TimestampMicrosecondType,
};
use arrow_array::{Array, ArrayRef, ListArray};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, TimeUnit};

use crate::cdc::temporal::{self, MaybeInfinite};
use crate::cdc::value::{Numeric, Value};
use crate::error::{Error, ErrorKind, Result};

/// Iceberg's time ends at 23:59:59.999999; PostgreSQL's at 24:00:00.
const MICROS_PER_DAY: i64 = 86_400_000_000;

/// The values of one column; `None` is null.
pub type Cells<'a> = [Option<&'a Value>];

/// Builds the array of `field`'s type from the column's values.
pub fn build_array(field: &Field, cells: &Cells<'_>) -> Result<ArrayRef> {
    let mismatch = |v: &Value| {
        Error::new(
            ErrorKind::Decode,
            format!(
                "a {} value does not fit the column's type {}",
                value_kind(v),
                field.data_type()
            ),
        )
        .with_context("column", field.name())
    };
    macro_rules! primitive {
        ($builder:expr, $convert:expr) => {{
            let mut builder = $builder;
            for cell in cells {
                match cell {
                    None | Some(Value::Null) => builder.append_null(),
                    Some(v) => {
                        let converted: Option<_> = $convert(*v);
                        builder.append_value(converted.ok_or_else(|| mismatch(v))?);
                    }
                }
            }
            Arc::new(builder.finish()) as ArrayRef
        }};
    }
    let array =
        match field.data_type() {
            DataType::Boolean => primitive!(
                BooleanBuilder::with_capacity(cells.len()),
                |v: &Value| match v {
                    Value::Bool(b) => Some(*b),
                    _ => None,
                }
            ),
            DataType::Int32 => {
                primitive!(
                    Int32Builder::with_capacity(cells.len()),
                    |v: &Value| match v {
                        Value::Int2(i) => Some(i32::from(*i)),
                        Value::Int4(i) => Some(*i),
                        _ => None,
                    }
                )
            }
            DataType::Int64 => {
                primitive!(Int64Builder::with_capacity(cells.len()), integer_form)
            }
            DataType::Float32 => primitive!(
                Float32Builder::with_capacity(cells.len()),
                |v: &Value| match v {
                    Value::Float4(f) => Some(*f),
                    _ => None,
                }
            ),
            DataType::Float64 => primitive!(
                Float64Builder::with_capacity(cells.len()),
                |v: &Value| match v {
                    Value::Float4(f) => Some(f64::from(*f)),
                    Value::Float8(f) => Some(*f),
                    _ => None,
                }
            ),
            DataType::Decimal128(precision, scale) => {
                let builder = Decimal128Builder::with_capacity(cells.len())
                    .with_precision_and_scale(*precision, *scale)
                    .map_err(|e| {
                        Error::new(ErrorKind::Lake, "invalid decimal type").with_source(e)
                    })?;
                primitive!(builder, |v: &Value| match v {
                    Value::Numeric(Numeric::Finite(text)) =>
                        decimal_to_i128(text, *scale as u32, *precision as u32),
                    _ => None,
                })
            }
            DataType::Utf8 => primitive!(StringBuilder::with_capacity(cells.len(), 0), text_form),
            DataType::LargeBinary => primitive!(
                LargeBinaryBuilder::with_capacity(cells.len(), 0),
                |v: &Value| match v {
                    Value::Bytea(b) => Some(b.clone()),
                    _ => None,
                }
            ),
            DataType::Date32 => primitive!(
                Date32Builder::with_capacity(cells.len()),
                |v: &Value| match v {
                    Value::Date(d) => Some(encode_infinite(d, i32::MAX)),
                    _ => None,
                }
            ),
            DataType::Time64(TimeUnit::Microsecond) => {
                primitive!(
                    Time64MicrosecondBuilder::with_capacity(cells.len()),
                    |v: &Value| match v {
                        Value::Time(t) if *t < MICROS_PER_DAY => Some(*t),
                        _ => None,
                    }
                )
            }
            DataType::Timestamp(TimeUnit::Microsecond, zone) => {
                let builder = TimestampMicrosecondBuilder::with_capacity(cells.len())
                    .with_timezone_opt(zone.clone());
                let with_zone = zone.is_some();
                primitive!(builder, |v: &Value| match v {
                    Value::Timestamp(t) if !with_zone => Some(encode_infinite(t, i64::MAX)),
                    Value::TimestampTz(t) if with_zone => Some(encode_infinite(t, i64::MAX)),
                    _ => None,
                })
            }
            DataType::FixedSizeBinary(16) => {
                let mut builder = FixedSizeBinaryBuilder::with_capacity(cells.len(), 16);
                for cell in cells {
                    match cell {
                        None | Some(Value::Null) => builder.append_null(),
                        Some(Value::Uuid(u)) => builder.append_value(u).map_err(|e| {
                            Error::new(ErrorKind::Lake, "cannot build a uuid array").with_source(e)
                        })?,
                        Some(v) => return Err(mismatch(v)),
                    }
                }
                Arc::new(builder.finish())
            }
            DataType::List(element) => {
                let mut offsets = Vec::with_capacity(cells.len() + 1);
                let mut children: Vec<Option<&Value>> = Vec::new();
                let mut valid = Vec::with_capacity(cells.len());
                offsets.push(0i32);
                for cell in cells {
                    match cell {
                        None | Some(Value::Null) => valid.push(false),
                        Some(Value::Array(items)) => {
                            let nested = !matches!(element.data_type(), DataType::List(_));
                            if nested && items.iter().any(|i| matches!(i, Value::Array(_))) {
                                return Err(Error::new(
                                    ErrorKind::Decode,
                                    "a multi-dimensional array value does not fit the column's \
                                     list type (arrays map to one-dimensional lists)",
                                )
                                .with_context("column", field.name()));
                            }
                            valid.push(true);
                            children.extend(items.iter().map(Some));
                        }
                        Some(v) => return Err(mismatch(v)),
                    }
                    let end = i32::try_from(children.len()).map_err(|_| {
                        Error::new(ErrorKind::Lake, "a list column exceeds 2^31 elements")
                    })?;
                    offsets.push(end);
                }
                let child = build_array(element, &children)?;
                Arc::new(
                    ListArray::try_new(
                        element.clone(),
                        OffsetBuffer::new(offsets.into()),
                        child,
                        Some(NullBuffer::from(valid)),
                    )
                    .map_err(|e| {
                        Error::new(ErrorKind::Lake, "cannot build a list array").with_source(e)
                    })?,
                )
            }
            other => {
                return Err(Error::new(
                    ErrorKind::Lake,
                    format!("no conversion to Arrow type {other}"),
                )
                .with_context("column", field.name()));
            }
        };
    Ok(array)
}

/// `max` for infinity, `-max` for -infinity.
fn encode_infinite<T: Copy + std::ops::Neg<Output = T>>(value: &MaybeInfinite<T>, max: T) -> T {
    match value {
        MaybeInfinite::Finite(v) => *v,
        MaybeInfinite::Infinity => max,
        MaybeInfinite::NegInfinity => -max,
    }
}

fn decode_infinite<T: Copy + PartialEq + std::ops::Neg<Output = T>>(
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
pub fn arrow_value(array: &dyn Array, row: usize) -> Result<Value> {
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

/// The value of an integer of any width.
pub(super) fn integer_form(v: &Value) -> Option<i64> {
    match v {
        Value::Int2(i) => Some(i64::from(*i)),
        Value::Int4(i) => Some(i64::from(*i)),
        Value::Int8(i) => Some(*i),
        _ => None,
    }
}

/// The text a string column holds for a value (docs/tables.md), borrowed
/// where the value holds it.
pub(super) fn text_form(v: &Value) -> Option<Cow<'_, str>> {
    Some(match v {
        Value::Text(s)
        | Value::Json(s)
        | Value::Jsonb(s)
        | Value::Inet(s)
        | Value::Cidr(s)
        | Value::Enum(s)
        | Value::Unknown(s) => Cow::Borrowed(s),
        Value::Numeric(Numeric::Finite(s)) => Cow::Borrowed(s),
        Value::Numeric(Numeric::NaN) => Cow::Borrowed("NaN"),
        Value::Numeric(Numeric::Infinity) => Cow::Borrowed("Infinity"),
        Value::Numeric(Numeric::NegInfinity) => Cow::Borrowed("-Infinity"),
        Value::Interval(iv) => Cow::Owned(temporal::format_interval(iv)),
        v @ Value::TimeTz { .. } => Cow::Owned(v.to_json().as_str()?.to_owned()),
        _ => return None,
    })
}

/// Exact decimal text to an unscaled i128 at `scale`; `None` if it has more
/// fractional digits than the scale or more digits than the precision.
fn decimal_to_i128(text: &str, scale: u32, precision: u32) -> Option<i128> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let frac = frac.trim_end_matches('0');
    if frac.len() > scale as usize {
        return None;
    }
    let mut unscaled: i128 = 0;
    for b in whole
        .bytes()
        .chain(frac.bytes())
        .chain(std::iter::repeat_n(b'0', scale as usize - frac.len()))
    {
        unscaled = unscaled
            .checked_mul(10)?
            .checked_add(i128::from(b.checked_sub(b'0').filter(|d| *d < 10)?))?;
    }
    if unscaled >= 10i128.checked_pow(precision)? {
        return None;
    }
    Some(if negative { -unscaled } else { unscaled })
}

fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Numeric(Numeric::NaN) => "numeric NaN",
        Value::Numeric(Numeric::Infinity | Numeric::NegInfinity) => "numeric infinity",
        Value::Date(MaybeInfinite::Infinity | MaybeInfinite::NegInfinity) => "infinite date",
        Value::Timestamp(MaybeInfinite::Infinity | MaybeInfinite::NegInfinity)
        | Value::TimestampTz(MaybeInfinite::Infinity | MaybeInfinite::NegInfinity) => {
            "infinite timestamp"
        }
        Value::Time(t) if *t >= MICROS_PER_DAY => "time 24:00:00",
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Int2(_) | Value::Int4(_) | Value::Int8(_) => "integer",
        Value::Float4(_) | Value::Float8(_) => "float",
        Value::Numeric(_) => "numeric",
        Value::Bytea(_) => "bytea",
        Value::Date(_) => "date",
        Value::Time(_) | Value::TimeTz { .. } => "time",
        Value::Timestamp(_) | Value::TimestampTz(_) => "timestamp",
        Value::Interval(_) => "interval",
        Value::Uuid(_) => "uuid",
        Value::Array(_) => "array",
        Value::Text(_)
        | Value::Json(_)
        | Value::Jsonb(_)
        | Value::Inet(_)
        | Value::Cidr(_)
        | Value::Enum(_) => "text",
        Value::Unknown(_) => "text of an unmodelled type",
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Array, Decimal128Array, ListArray, StringArray};

    use super::*;

    #[test]
    fn decimals_convert_exactly_or_not_at_all() {
        assert_eq!(decimal_to_i128("12.30", 2, 12), Some(1230));
        assert_eq!(decimal_to_i128("-0.5", 2, 12), Some(-50));
        assert_eq!(decimal_to_i128("7", 3, 12), Some(7000));
        assert_eq!(decimal_to_i128("1.234", 2, 12), None, "would round");
        assert_eq!(decimal_to_i128("1000", 0, 3), None, "beyond precision");
        let max38 = "9".repeat(38);
        assert_eq!(decimal_to_i128(&max38, 0, 38), Some(10i128.pow(38) - 1));
    }

    #[test]
    fn builds_decimal_string_and_list_arrays() {
        let dec = Field::new("d", DataType::Decimal128(12, 2), true);
        let values = [Value::Numeric(Numeric::Finite("1.50".into()))];
        let array = build_array(&dec, &[Some(&values[0]), None]).unwrap();
        let array = array.as_any().downcast_ref::<Decimal128Array>().unwrap();
        assert_eq!(array.value(0), 150);
        assert!(array.is_null(1));

        let text = Field::new("t", DataType::Utf8, true);
        let nan = Value::Numeric(Numeric::NaN);
        let array = build_array(&text, &[Some(&nan)]).unwrap();
        assert_eq!(
            array
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .value(0),
            "NaN"
        );

        let list = Field::new(
            "l",
            DataType::List(Arc::new(Field::new("element", DataType::Int32, true))),
            true,
        );
        let arr = Value::Array(vec![Value::Int4(1), Value::Null]);
        let empty = Value::Array(vec![]);
        let array = build_array(&list, &[Some(&arr), None, Some(&empty)]).unwrap();
        let array = array.as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(array.value_length(0), 2);
        assert!(array.is_null(1));
        assert_eq!(array.value_length(2), 0);
    }

    #[test]
    fn values_a_column_cannot_hold_are_errors_naming_the_column() {
        let dec = Field::new("amount", DataType::Decimal128(12, 2), true);
        let nan = Value::Numeric(Numeric::NaN);
        let err = build_array(&dec, &[Some(&nan)]).unwrap_err();
        assert!(
            err.to_string().contains("numeric NaN") && err.to_string().contains("column=amount"),
            "{err}"
        );
    }

    #[test]
    fn stored_cells_read_back_as_the_values_that_wrote_them() {
        let list = |t: DataType| DataType::List(Arc::new(Field::new("element", t, true)));
        let cases: Vec<(DataType, Vec<Value>)> = vec![
            (DataType::Boolean, vec![Value::Bool(true)]),
            (DataType::Int32, vec![Value::Int4(i32::MIN)]),
            (DataType::Int64, vec![Value::Int8(i64::MAX)]),
            (DataType::Float32, vec![Value::Float4(f32::NAN)]),
            (DataType::Float64, vec![Value::Float8(f64::NEG_INFINITY)]),
            (
                DataType::Decimal128(38, 4),
                vec![
                    Value::Numeric(Numeric::Finite("-0.0100".into())),
                    Value::Numeric(Numeric::Finite(format!("{}.0000", "9".repeat(34)))),
                ],
            ),
            (DataType::Utf8, vec![Value::Text("żółw \u{0}".into())]),
            (DataType::LargeBinary, vec![Value::Bytea(vec![0, 1, 0])]),
            (
                DataType::Date32,
                vec![
                    Value::Date(MaybeInfinite::Finite(-719_162)),
                    Value::Date(MaybeInfinite::Infinity),
                    Value::Date(MaybeInfinite::NegInfinity),
                ],
            ),
            (
                DataType::Time64(TimeUnit::Microsecond),
                vec![Value::Time(86_399_999_999)],
            ),
            (
                DataType::Timestamp(TimeUnit::Microsecond, None),
                vec![
                    Value::Timestamp(MaybeInfinite::Finite(-1)),
                    Value::Timestamp(MaybeInfinite::NegInfinity),
                ],
            ),
            (
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                vec![Value::TimestampTz(MaybeInfinite::Infinity)],
            ),
            (DataType::FixedSizeBinary(16), vec![Value::Uuid([7; 16])]),
            (
                list(list(DataType::Utf8)),
                vec![
                    Value::Array(vec![]),
                    Value::Array(vec![Value::Array(vec![
                        Value::Text("a".into()),
                        Value::Null,
                    ])]),
                ],
            ),
        ];
        for (data_type, values) in cases {
            let field = Field::new("c", data_type.clone(), true);
            let mut cells: Vec<Option<&Value>> = values.iter().map(Some).collect();
            cells.push(None);
            let array = build_array(&field, &cells).unwrap();
            for (row, value) in values.iter().enumerate() {
                let back = arrow_value(array.as_ref(), row).unwrap();
                match (value, &back) {
                    (Value::Float4(a), Value::Float4(b)) if a.is_nan() => assert!(b.is_nan()),
                    _ => assert_eq!(&back, value, "{data_type}"),
                }
            }
            assert_eq!(
                arrow_value(array.as_ref(), values.len()).unwrap(),
                Value::Null
            );
        }
    }
}
