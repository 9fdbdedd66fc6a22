//! Primary keys as bytes, and silver's index of them.
//!
//! A key is encoded from a change's values while staging, and from a data
//! file's key columns when the index is rebuilt: both must give the same
//! bytes for the same row. The common keys (one integer column, one text
//! column) have a direct encoding that costs no Arrow arrays per row; other
//! keys go through Arrow's row format over the key columns' lake types.

use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, LargeStringArray, StringArray};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{DataType, Field};
use smallvec::SmallVec;

use crate::cdc::value::Value;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::files::arrow::{build_array, integer_form, text_form};

/// Keys of up to 16 bytes (every integer key, most text keys) are held
/// inline, without an allocation of their own.
pub type Key = SmallVec<[u8; 16]>;

const SIGN: u64 = 1 << 63;

/// An integer's key: eight big-endian bytes with the sign bit flipped, so
/// that keys sort as the numbers do. A load in key order then hands the
/// index its keys already sorted.
fn integer_key(i: i64) -> Key {
    Key::from_slice(&((i as u64) ^ SIGN).to_be_bytes())
}

pub(crate) enum KeyCodec {
    /// One integer column (int2, int4 and int8 are Int32 or Int64 in the
    /// lake): [`integer_key`].
    Integer,
    /// One text column: its UTF-8 bytes.
    Text,
    /// Any other key: Arrow's row format over the key columns.
    Rows(RowConverter),
}

impl KeyCodec {
    /// The codec of a key made of `fields`, in key order.
    pub(crate) fn new(fields: &[&Field]) -> Result<KeyCodec> {
        match fields {
            [f] if matches!(f.data_type(), DataType::Int32 | DataType::Int64) => {
                Ok(KeyCodec::Integer)
            }
            [f] if f.data_type() == &DataType::Utf8 => Ok(KeyCodec::Text),
            _ => RowConverter::new(
                fields
                    .iter()
                    .map(|f| SortField::new(f.data_type().clone()))
                    .collect(),
            )
            .map(KeyCodec::Rows)
            .map_err(|e| {
                Error::new(ErrorKind::Lake, "cannot encode the primary key").with_source(e)
            }),
        }
    }

    /// The key of one row from its key values, in key order.
    pub(crate) fn encode_values(&self, fields: &[&Field], values: &[&Value]) -> Result<Key> {
        let mismatch = || {
            Error::new(
                ErrorKind::Decode,
                "a primary-key value does not fit its column's type",
            )
            .with_context("column", fields.first().map_or("", |f| f.name()))
        };
        match (self, values) {
            (KeyCodec::Integer, [v]) => integer_form(v).map(integer_key).ok_or_else(mismatch),
            (KeyCodec::Text, [v]) => text_form(v)
                .map(|s| Key::from_slice(s.as_bytes()))
                .ok_or_else(mismatch),
            (KeyCodec::Rows(converter), _) => {
                let columns = fields
                    .iter()
                    .zip(values)
                    .map(|(f, v)| build_array(f, &[Some(v)]))
                    .collect::<Result<Vec<_>>>()?;
                Ok(rows(converter, &columns)?.remove(0))
            }
            _ => Err(mismatch()),
        }
    }

    /// The keys of every row of the key columns, in row order. A column of
    /// another type than the key's (a file another writer made) is an
    /// error, never a panic.
    pub(crate) fn encode_columns(&self, columns: &[ArrayRef]) -> Result<Vec<Key>> {
        let unreadable = || {
            Error::new(
                ErrorKind::Lake,
                "the key columns of a data file do not match the key",
            )
        };
        let single = match (self, columns) {
            (KeyCodec::Rows(converter), _) => return rows(converter, columns),
            (_, [c]) if c.null_count() > 0 => {
                return Err(Error::new(
                    ErrorKind::Lake,
                    "a primary-key column holds a null",
                ));
            }
            (_, [c]) => c,
            _ => return Err(unreadable()),
        };
        let bytes = |b: &[u8]| Key::from_slice(b);
        let any = single.as_any();
        Ok(match self {
            KeyCodec::Integer => {
                if let Some(a) = any.downcast_ref::<Int32Array>() {
                    a.values().iter().map(|&i| integer_key(i.into())).collect()
                } else if let Some(a) = any.downcast_ref::<Int64Array>() {
                    a.values().iter().map(|&i| integer_key(i)).collect()
                } else {
                    return Err(unreadable());
                }
            }
            _ => {
                if let Some(a) = any.downcast_ref::<StringArray>() {
                    a.iter()
                        .map(|s| bytes(s.unwrap_or_default().as_bytes()))
                        .collect()
                } else if let Some(a) = any.downcast_ref::<LargeStringArray>() {
                    a.iter()
                        .map(|s| bytes(s.unwrap_or_default().as_bytes()))
                        .collect()
                } else {
                    return Err(unreadable());
                }
            }
        })
    }
}

impl KeyCodec {
    /// A key as people read it: `id=42`, or `a=1, b=x` for a composite
    /// one; `fields` are the key columns in key order.
    pub(crate) fn describe(&self, fields: &[&Field], key: &[u8]) -> String {
        let values: Vec<String> = match self {
            KeyCodec::Integer => match <[u8; 8]>::try_from(key) {
                Ok(bytes) => vec![((u64::from_be_bytes(bytes) ^ SIGN) as i64).to_string()],
                Err(_) => vec![format!("{key:?}")],
            },
            KeyCodec::Text => vec![String::from_utf8_lossy(key).into_owned()],
            KeyCodec::Rows(converter) => {
                let parser = converter.parser();
                match converter.convert_rows([parser.parse(key)]) {
                    Ok(columns) => columns
                        .iter()
                        .map(|c| {
                            let options = FormatOptions::default();
                            ArrayFormatter::try_new(c.as_ref(), &options)
                                .map_or_else(|e| e.to_string(), |f| f.value(0).to_string())
                        })
                        .collect(),
                    Err(e) => vec![e.to_string()],
                }
            }
        };
        fields
            .iter()
            .zip(values)
            .map(|(f, v)| format!("{}={v}", f.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn rows(converter: &RowConverter, columns: &[ArrayRef]) -> Result<Vec<Key>> {
    let rows = converter
        .convert_columns(columns)
        .map_err(|e| Error::new(ErrorKind::Lake, "cannot encode the primary key").with_source(e))?;
    Ok(rows.iter().map(|r| Key::from_slice(r.as_ref())).collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::TimeUnit;
    use proptest::prelude::*;

    use super::*;
    use crate::cdc::temporal::MaybeInfinite;

    fn field(name: &str, data_type: DataType) -> Field {
        Field::new(name, data_type, false)
    }

    /// Staging and the index rebuild must agree: the key of each row from
    /// its values equals the key read back from the column it is stored in.
    fn agree(fields: &[Field], rows: &[Vec<Value>]) {
        let refs: Vec<&Field> = fields.iter().collect();
        let codec = KeyCodec::new(&refs).unwrap();
        let columns: Vec<ArrayRef> = fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let cells: Vec<Option<&Value>> = rows.iter().map(|r| Some(&r[i])).collect();
                build_array(f, &cells).unwrap()
            })
            .collect();
        let from_columns = codec.encode_columns(&columns).unwrap();
        for (row, key) in rows.iter().zip(&from_columns) {
            let values: Vec<&Value> = row.iter().collect();
            assert_eq!(
                &codec.encode_values(&refs, &values).unwrap(),
                key,
                "{row:?}"
            );
        }
        for (row, key) in rows.iter().zip(&from_columns) {
            let described = codec.describe(&refs, key);
            for (f, v) in fields.iter().zip(row) {
                assert!(
                    described.contains(&format!("{}={}", f.name(), plain(v))),
                    "{described} for {row:?}"
                );
            }
        }
        let distinct: std::collections::HashSet<_> = from_columns.iter().collect();
        let rows_distinct: std::collections::HashSet<_> =
            rows.iter().map(|r| format!("{r:?}")).collect();
        assert_eq!(distinct.len(), rows_distinct.len(), "keys collide");
    }

    /// A key value as `describe` prints it.
    fn plain(v: &Value) -> String {
        match v {
            Value::Int2(i) => i.to_string(),
            Value::Int4(i) => i.to_string(),
            Value::Int8(i) => i.to_string(),
            Value::Text(t) => t.clone(),
            other => panic!("no key test uses {other:?}"),
        }
    }

    proptest! {
        #[test]
        fn integer_keys_agree(ids in proptest::collection::vec(any::<i64>(), 1..50)) {
            let rows: Vec<Vec<Value>> = ids.iter().map(|&i| vec![Value::Int8(i)]).collect();
            agree(&[field("id", DataType::Int64)], &rows);
        }

        #[test]
        fn small_integer_keys_agree(ids in proptest::collection::vec(any::<i16>(), 1..50)) {
            let rows: Vec<Vec<Value>> = ids.iter().map(|&i| vec![Value::Int2(i)]).collect();
            agree(&[field("id", DataType::Int32)], &rows);
        }

        #[test]
        fn text_keys_agree(names in proptest::collection::vec(".*", 1..50)) {
            let rows: Vec<Vec<Value>> = names.into_iter().map(|s| vec![Value::Text(s)]).collect();
            agree(&[field("name", DataType::Utf8)], &rows);
        }

        #[test]
        fn composite_keys_agree(pairs in proptest::collection::vec((any::<i32>(), ".*"), 1..50)) {
            let rows: Vec<Vec<Value>> = pairs
                .into_iter()
                .map(|(i, s)| vec![Value::Int4(i), Value::Text(s)])
                .collect();
            agree(&[field("a", DataType::Int32), field("b", DataType::Utf8)], &rows);
        }
    }

    #[test]
    fn columns_of_other_string_and_integer_widths_read_and_others_are_errors() {
        let text = field("name", DataType::Utf8);
        let codec = KeyCodec::new(&[&text]).unwrap();
        let large: ArrayRef = Arc::new(LargeStringArray::from(vec!["a", "b"]));
        assert_eq!(
            codec.encode_columns(&[large]).unwrap(),
            [Key::from_slice(b"a"), Key::from_slice(b"b")]
        );
        let numbers: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        assert!(
            codec
                .encode_columns(std::slice::from_ref(&numbers))
                .is_err()
        );
        let id = field("id", DataType::Int64);
        let codec = KeyCodec::new(&[&id]).unwrap();
        let narrow: ArrayRef = Arc::new(Int32Array::from(vec![7]));
        assert_eq!(codec.encode_columns(&[narrow]).unwrap(), [integer_key(7)]);
        let words: ArrayRef = Arc::new(StringArray::from(vec!["7"]));
        assert!(codec.encode_columns(&[words]).is_err());
        assert!(codec.encode_columns(&[numbers.clone(), numbers]).is_err());
    }

    proptest! {
        #[test]
        fn integer_keys_sort_as_their_numbers_and_read_back(mut numbers in proptest::collection::vec(any::<i64>(), 0..50)) {
            let f = field("id", DataType::Int64);
            let codec = KeyCodec::new(&[&f]).unwrap();
            let mut keys: Vec<Key> = numbers.iter().map(|&i| integer_key(i)).collect();
            keys.sort();
            numbers.sort();
            let described: Vec<String> = keys.iter().map(|k| codec.describe(&[&f], k)).collect();
            let expected: Vec<String> = numbers.iter().map(|i| format!("id={i}")).collect();
            prop_assert_eq!(described, expected);
        }
    }

    proptest! {
        /// The chunked backfill compares keys as encoded
        /// (src/pg/source/chunk.rs admits a key by this): a key of an
        /// integer, a text and a uuid column encodes in the order of its
        /// columns' values, compared column by column: numbers as numbers,
        /// text and uuid byte by byte (PostgreSQL's order for `int4`, text
        /// under the `C` collation and `uuid`: tests/backfill.rs checks
        /// that against the server).
        #[test]
        fn composite_keys_sort_as_their_columns_do(
            mut rows in proptest::collection::vec((any::<i32>(), ".{0,4}", any::<[u8; 16]>()), 0..50)
        ) {
            let fields = [
                field("a", DataType::Int32),
                field("b", DataType::Utf8),
                field("c", DataType::FixedSizeBinary(16)),
            ];
            let refs: Vec<&Field> = fields.iter().collect();
            let codec = KeyCodec::new(&refs).unwrap();
            let encode = |(a, b, c): &(i32, String, [u8; 16])| {
                let values = [Value::Int4(*a), Value::Text(b.clone()), Value::Uuid(*c)];
                codec.encode_values(&refs, &values.iter().collect::<Vec<_>>()).unwrap()
            };
            let mut by_key = rows.clone();
            by_key.sort_by_key(|row| encode(row));
            rows.sort_by(|x, y| (x.0, x.1.as_bytes(), x.2).cmp(&(y.0, y.1.as_bytes(), y.2)));
            prop_assert_eq!(by_key, rows);
        }
    }

    proptest! {
        /// The same for `date` and `timestamptz` keys, infinities among
        /// them: days and microseconds, -infinity first, infinity last
        /// (PostgreSQL's order: tests/backfill.rs checks it against the
        /// server).
        #[test]
        fn date_and_timestamp_keys_sort_as_their_values_do(
            mut rows in proptest::collection::vec((0..5u8, any::<i32>(), 0..5u8, any::<i64>()), 0..50)
        ) {
            fn infinite<T>(kind: u8, v: T) -> MaybeInfinite<T> {
                match kind {
                    0 => MaybeInfinite::NegInfinity,
                    1 => MaybeInfinite::Infinity,
                    _ => MaybeInfinite::Finite(v),
                }
            }
            // A finite value the column cannot hold (what infinity is
            // stored as) is not a key: PostgreSQL has no such date.
            let rows_of = |(dk, d, tk, t): &(u8, i32, u8, i64)| {
                (infinite(*dk, (*d).clamp(-i32::MAX + 1, i32::MAX - 1)),
                 infinite(*tk, (*t).clamp(-i64::MAX + 1, i64::MAX - 1)))
            };
            let fields = [
                field("d", DataType::Date32),
                field("t", DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))),
            ];
            let refs: Vec<&Field> = fields.iter().collect();
            let codec = KeyCodec::new(&refs).unwrap();
            let mut values: Vec<_> = rows.drain(..).map(|r| rows_of(&r)).collect();
            let encode = |(d, t): &(MaybeInfinite<i32>, MaybeInfinite<i64>)| {
                let values = [Value::Date(*d), Value::TimestampTz(*t)];
                codec.encode_values(&refs, &values.iter().collect::<Vec<_>>()).unwrap()
            };
            let mut by_key = values.clone();
            by_key.sort_by_key(|row| encode(row));
            values.sort();
            prop_assert_eq!(by_key, values);
        }
    }

    #[test]
    fn int4_and_int8_of_one_number_are_one_key_in_an_int64_column() {
        let f = field("id", DataType::Int64);
        let codec = KeyCodec::new(&[&f]).unwrap();
        assert_eq!(
            codec.encode_values(&[&f], &[&Value::Int4(7)]).unwrap(),
            codec.encode_values(&[&f], &[&Value::Int8(7)]).unwrap()
        );
    }

    #[test]
    fn a_value_of_another_type_is_an_error_naming_the_column() {
        let f = field("id", DataType::Int64);
        let codec = KeyCodec::new(&[&f]).unwrap();
        let err = codec
            .encode_values(&[&f], &[&Value::Text("7".into())])
            .unwrap_err();
        assert!(err.to_string().contains("id"), "{err}");
    }
}
