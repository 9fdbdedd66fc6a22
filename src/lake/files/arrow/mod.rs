//! Typed values to Arrow arrays of the column types the schema mapping
//! chose (src/lake/schema/mod.rs, docs/tables.md).
//!
//! Infinite dates and timestamps are stored as the largest and the negated
//! largest value of the column's integer (i32 days, i64 microseconds), the
//! encoding DuckDB reads back as `infinity` and `-infinity`. The one finite
//! value that meets them, timestamp `294247-01-10 04:00:54.775807`, is
//! decoded as its text (`temporal::is_sentinel`), and refused here should
//! it come as a number: never stored as infinity. A value that the column's
//! type cannot hold exactly is an error naming the column, never a silently
//! changed value (see docs/tables.md).
//!
//! [`arrow_value`] reads a stored cell back as a value, to fill unchanged
//! TOAST values from the row a table already holds.

mod read_back;
mod verbatim;

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder, Float32Builder,
    Float64Builder, Int32Builder, Int64Builder, LargeBinaryBuilder, StringBuilder,
    Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, ListArray};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, FieldRef, TimeUnit};

use crate::cdc::temporal::{self, MaybeInfinite};
use crate::cdc::value::{BinaryNumeric, Numeric, Value};
use crate::error::{Error, ErrorKind, Result};

/// Iceberg's time ends at 23:59:59.999999; PostgreSQL's at 24:00:00.
pub(crate) use read_back::{arrow_value, load_source_column};
pub use verbatim::Verbatim;
pub(crate) use verbatim::{verbatim_entries, verbatim_text, with_verbatim};

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// The values of one column; `None` is null.
pub(crate) type Cells<'a> = [Option<&'a Value>];

/// Builds the array of `field`'s type from the column's values.
pub fn build_array(field: &Field, cells: &Cells<'_>) -> Result<ArrayRef> {
    let mut builder = ColumnBuilder::new(field, cells.len())?;
    for cell in cells {
        builder.append(*cell)?;
    }
    builder.finish()
}

/// Builds the array of `field`'s type from the values of rows numbered
/// from 0, keeping in `verbatim` the values it cannot hold.
pub(crate) fn build_array_keeping(
    field: &Field,
    cells: &Cells<'_>,
    verbatim: &mut Verbatim,
) -> Result<ArrayRef> {
    let mut builder = ColumnBuilder::new(field, cells.len())?;
    for (row, cell) in cells.iter().enumerate() {
        builder.append_keeping(*cell, row, verbatim)?;
    }
    builder.finish()
}

/// An array of a field's type being built value by value.
pub(crate) struct ColumnBuilder {
    field: FieldRef,
    kind: Kind,
}

enum Kind {
    Bool(BooleanBuilder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Decimal {
        builder: Decimal128Builder,
        precision: u32,
        scale: u32,
    },
    Utf8(StringBuilder),
    Binary(LargeBinaryBuilder),
    Date(Date32Builder),
    Time(Time64MicrosecondBuilder),
    Timestamp {
        builder: TimestampMicrosecondBuilder,
        with_zone: bool,
    },
    Uuid(FixedSizeBinaryBuilder),
    List {
        element: FieldRef,
        child: Box<ColumnBuilder>,
        offsets: Vec<i32>,
        valid: Vec<bool>,
    },
}

impl ColumnBuilder {
    /// A builder for `field`'s type with room for `capacity` values.
    pub(crate) fn new(field: &Field, capacity: usize) -> Result<ColumnBuilder> {
        let kind = match field.data_type() {
            DataType::Boolean => Kind::Bool(BooleanBuilder::with_capacity(capacity)),
            DataType::Int32 => Kind::Int32(Int32Builder::with_capacity(capacity)),
            DataType::Int64 => Kind::Int64(Int64Builder::with_capacity(capacity)),
            DataType::Float32 => Kind::Float32(Float32Builder::with_capacity(capacity)),
            DataType::Float64 => Kind::Float64(Float64Builder::with_capacity(capacity)),
            DataType::Decimal128(precision, scale) => Kind::Decimal {
                builder: Decimal128Builder::with_capacity(capacity)
                    .with_precision_and_scale(*precision, *scale)
                    .map_err(|e| {
                        Error::new(ErrorKind::Lake, "invalid decimal type").with_source(e)
                    })?,
                precision: u32::from(*precision),
                scale: u32::try_from(*scale).map_err(|_| {
                    Error::new(ErrorKind::Lake, "negative decimal scale")
                        .with_context("column", field.name())
                })?,
            },
            DataType::Utf8 => Kind::Utf8(StringBuilder::with_capacity(capacity, 0)),
            DataType::LargeBinary => Kind::Binary(LargeBinaryBuilder::with_capacity(capacity, 0)),
            DataType::Date32 => Kind::Date(Date32Builder::with_capacity(capacity)),
            DataType::Time64(TimeUnit::Microsecond) => {
                Kind::Time(Time64MicrosecondBuilder::with_capacity(capacity))
            }
            DataType::Timestamp(TimeUnit::Microsecond, zone) => Kind::Timestamp {
                builder: TimestampMicrosecondBuilder::with_capacity(capacity)
                    .with_timezone_opt(zone.clone()),
                with_zone: zone.is_some(),
            },
            DataType::FixedSizeBinary(16) => {
                Kind::Uuid(FixedSizeBinaryBuilder::with_capacity(capacity, 16))
            }
            DataType::List(element) => Kind::List {
                element: element.clone(),
                child: Box::new(ColumnBuilder::new(element, capacity)?),
                offsets: vec![0],
                valid: Vec::with_capacity(capacity),
            },
            other => {
                return Err(Error::new(
                    ErrorKind::Lake,
                    format!("no conversion to Arrow type {other}"),
                )
                .with_context("column", field.name()));
            }
        };
        Ok(ColumnBuilder {
            field: Arc::new(field.clone()),
            kind,
        })
    }

    /// Appends a value, `None` or [`Value::Null`] as null. A value the
    /// type cannot hold exactly is an error naming the column.
    pub(crate) fn append(&mut self, cell: Option<&Value>) -> Result<()> {
        let Some(v) = cell else {
            self.append_null();
            return Ok(());
        };
        if self.try_append(v)? {
            Ok(())
        } else {
            Err(self.mismatch(v))
        }
    }

    /// Appends a value of row `row` as [`Self::append`] does, except that
    /// a value the type cannot hold but whose source text is known
    /// ([`verbatim_text`]) is appended as null and its text kept in
    /// `verbatim` (docs/values.md).
    pub(crate) fn append_keeping(
        &mut self,
        cell: Option<&Value>,
        row: usize,
        verbatim: &mut Verbatim,
    ) -> Result<()> {
        let Some(v) = cell else {
            self.append_null();
            return Ok(());
        };
        if self.try_append(v)? {
            return Ok(());
        }
        if !self.field.is_nullable() {
            // A primary-key column: its value is the row's identity.
            return Err(Error::new(
                ErrorKind::Decode,
                format!(
                    "a {} value does not fit the key column's type {}, and a key cannot be \
                     kept verbatim (docs/values.md)",
                    value_kind(v),
                    self.field.data_type()
                ),
            )
            .with_context("column", self.field.name()));
        }
        let text = verbatim_text(v).ok_or_else(|| self.mismatch(v))?;
        self.append_null();
        verbatim.keep(row, self.field.name(), text.into_owned());
        Ok(())
    }

    /// Whether a value of this type holds `v` exactly: what
    /// [`Self::try_append`] decides, without appending.
    fn accepts(&self, v: &Value) -> bool {
        match (&self.kind, v) {
            (_, Value::Null)
            | (Kind::Bool(_), Value::Bool(_))
            | (Kind::Int32(_), Value::Int2(_) | Value::Int4(_))
            | (Kind::Float32(_), Value::Float4(_))
            | (Kind::Float64(_), Value::Float4(_) | Value::Float8(_))
            | (Kind::Binary(_), Value::Bytea(_))
            | (Kind::Date(_), Value::Date(_))
            | (Kind::Uuid(_), Value::Uuid(_)) => true,
            (Kind::Int64(_), v) => integer_form(v).is_some(),
            (Kind::Utf8(_), v) => text_form(v).is_some(),
            (
                Kind::Decimal {
                    precision, scale, ..
                },
                Value::Numeric(Numeric::Finite(text)),
            ) => decimal_to_i128(text, *scale, *precision).is_some(),
            (Kind::Time(_), Value::Time(t)) => *t < MICROS_PER_DAY,
            (Kind::Timestamp { with_zone, .. }, Value::Timestamp(_)) => !with_zone,
            (Kind::Timestamp { with_zone, .. }, Value::TimestampTz(_)) => *with_zone,
            (Kind::List { child, .. }, Value::Array(items)) => {
                items.iter().all(|item| child.accepts(item))
            }
            _ => false,
        }
    }

    /// Appends `v` when the type holds it exactly; false, with nothing
    /// appended, when it does not.
    fn try_append(&mut self, v: &Value) -> Result<bool> {
        if matches!(v, Value::Null) {
            self.append_null();
            return Ok(true);
        }
        // Appends the converted value, if the value converts.
        macro_rules! put {
            ($builder:expr, $converted:expr) => {
                match $converted {
                    Some(x) => {
                        $builder.append_value(x);
                        true
                    }
                    None => false,
                }
            };
        }
        let fits = match &mut self.kind {
            Kind::Bool(b) => put!(
                b,
                match v {
                    Value::Bool(x) => Some(*x),
                    _ => None,
                }
            ),
            Kind::Int32(b) => put!(
                b,
                match v {
                    Value::Int2(i) => Some(i32::from(*i)),
                    Value::Int4(i) => Some(*i),
                    _ => None,
                }
            ),
            Kind::Int64(b) => put!(b, integer_form(v)),
            Kind::Float32(b) => put!(
                b,
                match v {
                    Value::Float4(f) => Some(*f),
                    _ => None,
                }
            ),
            Kind::Float64(b) => put!(
                b,
                match v {
                    Value::Float4(f) => Some(f64::from(*f)),
                    Value::Float8(f) => Some(*f),
                    _ => None,
                }
            ),
            Kind::Decimal {
                builder,
                precision,
                scale,
            } => put!(
                builder,
                match v {
                    Value::Numeric(Numeric::Finite(text)) =>
                        decimal_to_i128(text, *scale, *precision),
                    _ => None,
                }
            ),
            Kind::Utf8(b) => put!(b, text_form(v)),
            Kind::Binary(b) => put!(
                b,
                match v {
                    Value::Bytea(x) => Some(x),
                    _ => None,
                }
            ),
            Kind::Date(b) => put!(
                b,
                match v {
                    Value::Date(d) => encode_infinite(d, i32::MAX),
                    _ => None,
                }
            ),
            Kind::Time(b) => put!(
                b,
                match v {
                    Value::Time(t) if *t < MICROS_PER_DAY => Some(*t),
                    _ => None,
                }
            ),
            Kind::Timestamp { builder, with_zone } => put!(
                builder,
                match (v, *with_zone) {
                    (Value::Timestamp(t), false) | (Value::TimestampTz(t), true) =>
                        encode_infinite(t, i64::MAX),
                    _ => None,
                }
            ),
            Kind::Uuid(b) => match v {
                Value::Uuid(u) => {
                    b.append_value(u).map_err(|e| {
                        Error::new(ErrorKind::Lake, "cannot build a uuid array").with_source(e)
                    })?;
                    true
                }
                _ => false,
            },
            Kind::List {
                child,
                offsets,
                valid,
                ..
            } => match v {
                // Checked first, so that a list is appended whole or not at all.
                Value::Array(items) if items.iter().all(|item| child.accepts(item)) => {
                    for item in items {
                        child.append(Some(item))?;
                    }
                    let end = offsets.last().copied().unwrap_or(0) as usize + items.len();
                    offsets.push(i32::try_from(end).map_err(|_| {
                        Error::new(ErrorKind::Lake, "a list column exceeds 2^31 elements")
                    })?);
                    valid.push(true);
                    true
                }
                _ => false,
            },
        };
        Ok(fits)
    }

    /// Appends a string to a string column; the text output of a column of
    /// any other type goes through [`Self::append`] as its value.
    pub(crate) fn append_str(&mut self, text: &str) -> bool {
        match &mut self.kind {
            Kind::Utf8(b) => {
                b.append_value(text);
                true
            }
            _ => false,
        }
    }

    /// Appends a `numeric` in its binary format to a decimal column;
    /// false when the column is not a decimal one, or the value is not a
    /// finite number it holds exactly (then [`Self::append`] its value for
    /// the error).
    pub(crate) fn append_numeric(&mut self, numeric: &BinaryNumeric<'_>) -> bool {
        match &mut self.kind {
            Kind::Decimal {
                builder,
                precision,
                scale,
            } => match numeric.unscaled(*scale, *precision) {
                Some(d) => {
                    builder.append_value(d);
                    true
                }
                None => false,
            },
            _ => false,
        }
    }

    pub(crate) fn append_null(&mut self) {
        match &mut self.kind {
            Kind::Bool(b) => b.append_null(),
            Kind::Int32(b) => b.append_null(),
            Kind::Int64(b) => b.append_null(),
            Kind::Float32(b) => b.append_null(),
            Kind::Float64(b) => b.append_null(),
            Kind::Decimal { builder, .. } => builder.append_null(),
            Kind::Utf8(b) => b.append_null(),
            Kind::Binary(b) => b.append_null(),
            Kind::Date(b) => b.append_null(),
            Kind::Time(b) => b.append_null(),
            Kind::Timestamp { builder, .. } => builder.append_null(),
            Kind::Uuid(b) => b.append_null(),
            Kind::List { offsets, valid, .. } => {
                offsets.push(offsets.last().copied().unwrap_or(0));
                valid.push(false);
            }
        }
    }

    /// The array of the values appended so far; the builder starts over.
    pub(crate) fn finish(&mut self) -> Result<ArrayRef> {
        Ok(match &mut self.kind {
            Kind::Bool(b) => Arc::new(b.finish()),
            Kind::Int32(b) => Arc::new(b.finish()),
            Kind::Int64(b) => Arc::new(b.finish()),
            Kind::Float32(b) => Arc::new(b.finish()),
            Kind::Float64(b) => Arc::new(b.finish()),
            Kind::Decimal { builder, .. } => Arc::new(builder.finish()),
            Kind::Utf8(b) => Arc::new(b.finish()),
            Kind::Binary(b) => Arc::new(b.finish()),
            Kind::Date(b) => Arc::new(b.finish()),
            Kind::Time(b) => Arc::new(b.finish()),
            Kind::Timestamp { builder, .. } => Arc::new(builder.finish()),
            Kind::Uuid(b) => Arc::new(b.finish()),
            Kind::List {
                element,
                child,
                offsets,
                valid,
            } => {
                let offsets = std::mem::replace(offsets, vec![0]);
                Arc::new(
                    ListArray::try_new(
                        element.clone(),
                        OffsetBuffer::new(offsets.into()),
                        child.finish()?,
                        Some(NullBuffer::from(std::mem::take(valid))),
                    )
                    .map_err(|e| {
                        Error::new(ErrorKind::Lake, "cannot build a list array").with_source(e)
                    })?,
                )
            }
        })
    }

    fn mismatch(&self, v: &Value) -> Error {
        Error::new(
            ErrorKind::Decode,
            format!(
                "a {} value does not fit the column's type {}",
                value_kind(v),
                self.field.data_type()
            ),
        )
        .with_context("column", self.field.name())
    }
}

/// `max` for infinity, `-max` for -infinity; `None` for a finite value
/// that is one of them, which the column then cannot hold.
fn encode_infinite<T: Copy + PartialEq + std::ops::Neg<Output = T>>(
    value: &MaybeInfinite<T>,
    max: T,
) -> Option<T> {
    match value {
        MaybeInfinite::Finite(v) if *v == max || *v == -max => None,
        MaybeInfinite::Finite(v) => Some(*v),
        MaybeInfinite::Infinity => Some(max),
        MaybeInfinite::NegInfinity => Some(-max),
    }
}

/// The value of an integer of any width.
pub(in crate::lake) fn integer_form(v: &Value) -> Option<i64> {
    match v {
        Value::Int2(i) => Some(i64::from(*i)),
        Value::Int4(i) => Some(i64::from(*i)),
        Value::Int8(i) => Some(*i),
        _ => None,
    }
}

/// The text a string column holds for a value (docs/tables.md), borrowed
/// where the value holds it.
pub(in crate::lake) fn text_form(v: &Value) -> Option<Cow<'_, str>> {
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
mod tests;
