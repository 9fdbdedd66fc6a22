//! Typed column values, decoded from PostgreSQL's text output, or for the
//! initial load from the binary send format of the types where that is
//! plain ([`Wire`]).
//!
//! The stream (pgoutput sends text) goes through [`PgType::parse`]; the
//! load (binary COPY) decodes the plain types from their binary form and
//! casts every other column to text in its query, so that it goes through
//! the same parser. Either way a row reads the same.
//!
//! Rules for values with no ordinary number:
//! - `numeric` keeps its exact decimal text; `NaN`, `Infinity` and
//!   `-Infinity` are their own variants, never NULL.
//! - `float4`/`float8` keep NaN and the infinities as IEEE values.
//! - `date`, `timestamp` and `timestamptz` may be [`MaybeInfinite`].
//! - A type we do not model is carried as its text, never as an error.

mod array;
mod numeric;

use serde_json::json;

use self::array::parse_array;
use super::temporal::{self, Interval, MaybeInfinite};

pub(crate) use self::numeric::BinaryNumeric;
pub use self::numeric::Numeric;
use self::numeric::parse_numeric;

/// The decoding of a column type, resolved from its OID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgType {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Numeric,
    /// text, varchar, bpchar, name, "char", and text-like types we know.
    Text,
    Bytea,
    Date,
    Time,
    TimeTz,
    Timestamp,
    TimestampTz,
    Interval,
    Uuid,
    Json,
    Jsonb,
    Inet,
    Cidr,
    /// An enum type; values are its labels.
    Enum,
    /// An array of the element type (any number of dimensions).
    Array(Box<PgType>),
    /// An array whose elements another delimiter than the comma separates
    /// (`box[]`, or a type created with `DELIMITER`): carried as its text,
    /// which the lake keeps verbatim.
    OpaqueArray,
    /// A type we do not model: carried as its text output.
    Unknown,
}

impl PgType {
    /// The built-in types, by the OIDs fixed in `pg_type.dat`. Enums,
    /// domains and arrays of user types need a catalog look-up instead.
    pub fn builtin(oid: u32) -> Option<PgType> {
        use PgType::*;
        let array = |t| Some(Array(Box::new(t)));
        match oid {
            16 => Some(Bool),
            17 => Some(Bytea),
            18 | 19 | 25 | 1042 | 1043 => Some(Text),
            20 => Some(Int8),
            21 => Some(Int2),
            23 => Some(Int4),
            26 | 28 | 29 => Some(Int8),
            114 => Some(Json),
            650 => Some(Cidr),
            700 => Some(Float4),
            701 => Some(Float8),
            869 => Some(Inet),
            1082 => Some(Date),
            1083 => Some(Time),
            1114 => Some(Timestamp),
            1184 => Some(TimestampTz),
            1186 => Some(Interval),
            1266 => Some(TimeTz),
            1700 => Some(Numeric),
            2950 => Some(Uuid),
            3802 => Some(Jsonb),
            1000 => array(Bool),
            1001 => array(Bytea),
            1002 | 1003 | 1009 | 1014 | 1015 => array(Text),
            1005 => array(Int2),
            1007 => array(Int4),
            1016 | 1028 => array(Int8),
            199 => array(Json),
            651 => array(Cidr),
            1021 => array(Float4),
            1022 => array(Float8),
            1041 => array(Inet),
            1182 => array(Date),
            1183 => array(Time),
            1115 => array(Timestamp),
            1185 => array(TimestampTz),
            1187 => array(Interval),
            1270 => array(TimeTz),
            1231 => array(Numeric),
            2951 => array(Uuid),
            3807 => array(Jsonb),
            _ => None,
        }
    }

    /// Decodes one value from its text output. `None` means the text did
    /// not have the shape this type's output function produces.
    pub(crate) fn parse(&self, text: &str) -> Result<Value, ValueError> {
        let bad = || ValueError {
            type_name: self.name(),
            form: "text output",
            len: text.len(),
            hint: match self {
                PgType::Timestamp | PgType::TimestampTz => TIMESTAMP_HINT,
                _ => "",
            },
        };
        let value = match self {
            PgType::Bool => match text {
                "t" => Value::Bool(true),
                "f" => Value::Bool(false),
                _ => return Err(bad()),
            },
            PgType::Int2 => Value::Int2(text.parse().map_err(|_| bad())?),
            PgType::Int4 => Value::Int4(text.parse().map_err(|_| bad())?),
            PgType::Int8 => Value::Int8(text.parse().map_err(|_| bad())?),
            PgType::Float4 => Value::Float4(parse_float(text).ok_or_else(bad)? as f32),
            PgType::Float8 => Value::Float8(parse_float(text).ok_or_else(bad)?),
            PgType::Numeric => Value::Numeric(parse_numeric(text).ok_or_else(bad)?),
            PgType::Text => Value::Text(text.to_owned()),
            PgType::Bytea => Value::Bytea(parse_bytea(text).ok_or_else(bad)?),
            PgType::Date => Value::Date(temporal::parse_date(text).ok_or_else(bad)?),
            PgType::Time => Value::Time(temporal::parse_time(text).ok_or_else(bad)?),
            PgType::TimeTz => {
                let (micros, offset_secs) = temporal::parse_timetz(text).ok_or_else(bad)?;
                Value::TimeTz {
                    micros,
                    offset_secs,
                }
            }
            PgType::Timestamp | PgType::TimestampTz => {
                let with_zone = *self == PgType::TimestampTz;
                match temporal::parse_timestamp(text, with_zone) {
                    Some(t) if temporal::is_sentinel(&t) => Value::Unknown(text.to_owned()),
                    Some(t) if with_zone => Value::TimestampTz(t),
                    Some(t) => Value::Timestamp(t),
                    // Past what microseconds since 1970 hold: as its text.
                    None if temporal::is_well_formed_timestamp(text, with_zone) => {
                        Value::Unknown(text.to_owned())
                    }
                    None => return Err(bad()),
                }
            }
            PgType::Interval => Value::Interval(temporal::parse_interval(text).ok_or_else(bad)?),
            PgType::Uuid => {
                Value::Uuid(*uuid::Uuid::try_parse(text).map_err(|_| bad())?.as_bytes())
            }
            PgType::Json => Value::Json(text.to_owned()),
            PgType::Jsonb => Value::Jsonb(text.to_owned()),
            PgType::Inet => Value::Inet(text.to_owned()),
            PgType::Cidr => Value::Cidr(text.to_owned()),
            PgType::Enum => Value::Enum(text.to_owned()),
            PgType::Array(element) => parse_array(element, text).ok_or_else(bad)??,
            PgType::Unknown | PgType::OpaqueArray => Value::Unknown(text.to_owned()),
        };
        Ok(value)
    }

    /// A short name for error messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            PgType::Bool => "bool",
            PgType::Int2 => "int2",
            PgType::Int4 => "int4",
            PgType::Int8 => "int8",
            PgType::Float4 => "float4",
            PgType::Float8 => "float8",
            PgType::Numeric => "numeric",
            PgType::Text => "text",
            PgType::Bytea => "bytea",
            PgType::Date => "date",
            PgType::Time => "time",
            PgType::TimeTz => "timetz",
            PgType::Timestamp => "timestamp",
            PgType::TimestampTz => "timestamptz",
            PgType::Interval => "interval",
            PgType::Uuid => "uuid",
            PgType::Json => "json",
            PgType::Jsonb => "jsonb",
            PgType::Inet => "inet",
            PgType::Cidr => "cidr",
            PgType::Enum => "enum",
            PgType::Array(_) | PgType::OpaqueArray => "array",
            PgType::Unknown => "unknown type",
        }
    }
}

/// A value did not have the shape of its type's text output (or binary
/// send format). Carries the type and length only: row values never go
/// into errors or logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode {type_name} from its {form} ({len} bytes){hint}")]
pub struct ValueError {
    pub(crate) type_name: &'static str,
    /// `text output` or `binary format`.
    pub(crate) form: &'static str,
    pub(crate) len: usize,
    /// What may be wrong, when the type has a known limit.
    pub(crate) hint: &'static str,
}

const TIMESTAMP_HINT: &str = "; a timestamp after 294247-01-10 04:00:54.775807 UTC does not fit \
                              in microseconds since 1970, the form Iceberg stores";

/// How the initial load's binary COPY carries a column: the binary send
/// format of a built-in type whose format is plain, or [`Wire::Text`], the
/// type's text output (binary text types send exactly that; the COPY query
/// turns every other column into its output text).
/// (<https://www.postgresql.org/docs/current/sql-copy.html>, Binary Format;
/// the send functions are in PostgreSQL's `src/backend/utils/adt`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    /// [`BinaryNumeric`].
    Numeric,
    Bytea,
    /// int4 days since 2000-01-01; `i32::MAX`/`MIN` are the infinities.
    Date,
    /// int8 microseconds since midnight.
    Time,
    /// int8 microseconds since 2000-01-01; `i64::MAX`/`MIN` are the
    /// infinities.
    Timestamp,
    TimestampTz,
    Uuid,
    Text,
}

impl Wire {
    /// The form a column of type `type_oid` comes in, and whether the COPY
    /// query must cast it to text for that.
    pub fn of(type_oid: u32) -> (Wire, bool) {
        let binary = match type_oid {
            16 => Wire::Bool,
            17 => Wire::Bytea,
            19 | 25 | 1042 | 1043 => Wire::Text,
            20 => Wire::Int8,
            21 => Wire::Int2,
            23 => Wire::Int4,
            700 => Wire::Float4,
            701 => Wire::Float8,
            1700 => Wire::Numeric,
            1082 => Wire::Date,
            1083 => Wire::Time,
            1114 => Wire::Timestamp,
            1184 => Wire::TimestampTz,
            2950 => Wire::Uuid,
            _ => return (Wire::Text, true),
        };
        (binary, false)
    }

    /// Decodes one field as a value of `pg_type`, the column's decoding.
    pub fn decode(self, pg_type: &PgType, bytes: &[u8]) -> Result<Value, ValueError> {
        let bad = |hint| ValueError {
            type_name: pg_type.name(),
            form: "binary format",
            len: bytes.len(),
            hint,
        };
        let fixed = |n: usize| bytes.get(..n).filter(|_| bytes.len() == n).ok_or(bad(""));
        let be8 = || fixed(8).map(|b| <[u8; 8]>::try_from(b).unwrap_or_default());
        let be4 = || fixed(4).map(|b| <[u8; 4]>::try_from(b).unwrap_or_default());
        // A timestamp past what microseconds since 1970 hold is kept as
        // its text, as the stream's parser does.
        let pg_timestamp = |micros: i64, with_zone: bool| match micros {
            i64::MAX => Ok(MaybeInfinite::Infinity),
            i64::MIN => Ok(MaybeInfinite::NegInfinity),
            m => m
                .checked_add(temporal::PG_EPOCH_DAYS * temporal::MICROS_PER_DAY)
                .map(MaybeInfinite::Finite)
                .filter(|t| !temporal::is_sentinel(t))
                .ok_or_else(|| temporal::format_pg_timestamp(m, with_zone)),
        };
        Ok(match self {
            Wire::Bool => match bytes {
                [0] => Value::Bool(false),
                [1] => Value::Bool(true),
                _ => return Err(bad("")),
            },
            Wire::Int2 => Value::Int2(i16::from_be_bytes(fixed(2)?.try_into().unwrap_or_default())),
            Wire::Int4 => Value::Int4(i32::from_be_bytes(be4()?)),
            Wire::Int8 => Value::Int8(i64::from_be_bytes(be8()?)),
            Wire::Float4 => Value::Float4(f32::from_be_bytes(be4()?)),
            Wire::Float8 => Value::Float8(f64::from_be_bytes(be8()?)),
            Wire::Numeric => Value::Numeric(BinaryNumeric::parse(bytes).ok_or(bad(""))?.numeric()),
            Wire::Bytea => Value::Bytea(bytes.to_vec()),
            Wire::Date => Value::Date(match i32::from_be_bytes(be4()?) {
                i32::MAX => MaybeInfinite::Infinity,
                i32::MIN => MaybeInfinite::NegInfinity,
                d => MaybeInfinite::Finite(
                    d.checked_add(temporal::PG_EPOCH_DAYS as i32)
                        .ok_or(bad(""))?,
                ),
            }),
            Wire::Time => Value::Time(i64::from_be_bytes(be8()?)),
            Wire::Timestamp => match pg_timestamp(i64::from_be_bytes(be8()?), false) {
                Ok(t) => Value::Timestamp(t),
                Err(text) => Value::Unknown(text),
            },
            Wire::TimestampTz => match pg_timestamp(i64::from_be_bytes(be8()?), true) {
                Ok(t) => Value::TimestampTz(t),
                Err(text) => Value::Unknown(text),
            },
            Wire::Uuid => Value::Uuid(fixed(16)?.try_into().unwrap_or_default()),
            Wire::Text => {
                let text = std::str::from_utf8(bytes).map_err(|_| bad(": not valid UTF-8"))?;
                return pg_type.parse(text);
            }
        })
    }
}

/// One column of a row image.
#[derive(Debug, Clone, PartialEq)]
pub enum Datum {
    /// The value (possibly SQL NULL).
    Value(Value),
    /// A TOASTed value the update did not change; the server did not send
    /// it. Its value is the one the row had before.
    UnchangedToast,
    /// A column a key-only before image does not carry.
    NotSent,
}

/// One decoded column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int2(i16),
    Int4(i32),
    Int8(i64),
    Float4(f32),
    Float8(f64),
    Numeric(Numeric),
    Text(String),
    Bytea(Vec<u8>),
    /// Days since 1970-01-01.
    Date(MaybeInfinite<i32>),
    /// Microseconds since midnight.
    Time(i64),
    TimeTz {
        micros: i64,
        offset_secs: i32,
    },
    /// Microseconds since 1970-01-01 00:00:00, no zone.
    Timestamp(MaybeInfinite<i64>),
    /// Microseconds since 1970-01-01 00:00:00 UTC.
    TimestampTz(MaybeInfinite<i64>),
    Interval(Interval),
    Uuid([u8; 16]),
    Json(String),
    Jsonb(String),
    Inet(String),
    Cidr(String),
    Enum(String),
    Array(Vec<Value>),
    /// The text output of a type we do not model.
    Unknown(String),
}

impl Value {
    /// A rough count of the bytes the value holds.
    pub(crate) fn approx_bytes(&self) -> usize {
        let heap = match self {
            Value::Numeric(Numeric::Finite(s))
            | Value::Text(s)
            | Value::Json(s)
            | Value::Jsonb(s)
            | Value::Inet(s)
            | Value::Cidr(s)
            | Value::Enum(s)
            | Value::Unknown(s) => s.len(),
            Value::Bytea(b) => b.len(),
            Value::Array(items) => items.iter().map(Value::approx_bytes).sum(),
            _ => 0,
        };
        std::mem::size_of::<Value>() + heap
    }

    /// The JSON form used by `wal2iceberg tail`: numbers stay numbers where
    /// JSON holds them exactly; numeric, the infinities and NaN are strings.
    pub fn to_json(&self) -> serde_json::Value {
        fn infinite(v: &MaybeInfinite<String>) -> serde_json::Value {
            match v {
                MaybeInfinite::Finite(s) => json!(s),
                MaybeInfinite::Infinity => json!("infinity"),
                MaybeInfinite::NegInfinity => json!("-infinity"),
            }
        }
        fn float(f: f64) -> serde_json::Value {
            if f.is_finite() {
                json!(f)
            } else if f.is_nan() {
                json!("NaN")
            } else if f > 0.0 {
                json!("Infinity")
            } else {
                json!("-Infinity")
            }
        }
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => json!(b),
            Value::Int2(i) => json!(i),
            Value::Int4(i) => json!(i),
            Value::Int8(i) => json!(i),
            Value::Float4(f) => float(f64::from(*f)),
            Value::Float8(f) => float(*f),
            Value::Numeric(Numeric::Finite(s)) => json!(s),
            Value::Numeric(Numeric::NaN) => json!("NaN"),
            Value::Numeric(Numeric::Infinity) => json!("Infinity"),
            Value::Numeric(Numeric::NegInfinity) => json!("-Infinity"),
            Value::Bytea(b) => json!(format!("\\x{}", hex(b))),
            Value::Date(d) => infinite(&map_finite(d, |d| temporal::format_date(i64::from(d)))),
            Value::Time(t) => json!(temporal::format_time(*t)),
            Value::TimeTz {
                micros,
                offset_secs,
            } => json!(format!(
                "{}{}{:02}:{:02}",
                temporal::format_time(*micros),
                if *offset_secs < 0 { '-' } else { '+' },
                offset_secs.abs() / 3600,
                offset_secs.abs() / 60 % 60
            )),
            Value::Timestamp(t) => infinite(&map_finite(t, |t| {
                temporal::format_timestamp_utc(t)
                    .trim_end_matches('Z')
                    .to_owned()
            })),
            Value::TimestampTz(t) => infinite(&map_finite(t, temporal::format_timestamp_utc)),
            Value::Interval(iv) => json!(temporal::format_interval(iv)),
            Value::Uuid(u) => json!(uuid::Uuid::from_bytes(*u).hyphenated().to_string()),
            Value::Json(s) | Value::Jsonb(s) => {
                serde_json::from_str(s).unwrap_or_else(|_| json!(s))
            }
            Value::Text(s)
            | Value::Inet(s)
            | Value::Cidr(s)
            | Value::Enum(s)
            | Value::Unknown(s) => json!(s),
            Value::Array(items) => items.iter().map(Value::to_json).collect(),
        }
    }
}

fn map_finite<T: Copy>(v: &MaybeInfinite<T>, f: impl FnOnce(T) -> String) -> MaybeInfinite<String> {
    match *v {
        MaybeInfinite::Finite(x) => MaybeInfinite::Finite(f(x)),
        MaybeInfinite::Infinity => MaybeInfinite::Infinity,
        MaybeInfinite::NegInfinity => MaybeInfinite::NegInfinity,
    }
}

fn parse_float(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        // Rust would also accept "inf" and "nan", which PostgreSQL never prints.
        _ if text
            .bytes()
            .any(|b| b.is_ascii_alphabetic() && b != b'e' && b != b'E') =>
        {
            None
        }
        _ => text.parse().ok(),
    }
}

/// `bytea_output = hex` (set on both connections): `\x0a1b...`.
fn parse_bytea(text: &str) -> Option<Vec<u8>> {
    let hex = text.strip_prefix("\\x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    hex.as_bytes()
        .chunks(2)
        .map(|pair| Some((hex_digit(pair[0])? << 4) | hex_digit(pair[1])?))
        .collect()
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests;
