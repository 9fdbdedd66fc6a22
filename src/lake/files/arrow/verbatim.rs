//! The values a column's type cannot hold, kept as their PostgreSQL
//! text in the row's `_cdc_verbatim` map (docs/values.md), and that text
//! written as PostgreSQL writes it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::builder::{MapBuilder, MapFieldNames, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, Field, Fields};

use super::text_form;
use crate::cdc::temporal;
use crate::cdc::value::Value;
use crate::error::{Error, ErrorKind, Result};

/// The values of a batch that their columns' types cannot hold, by row:
/// the column's name and the value's PostgreSQL text. They become the
/// `_cdc_verbatim` map of their row, the column itself null
/// (docs/values.md).
#[derive(Debug, Default)]
pub struct Verbatim {
    rows: BTreeMap<usize, Vec<(String, String)>>,
}

impl Verbatim {
    pub(crate) fn keep(&mut self, row: usize, column: &str, text: String) {
        self.rows
            .entry(row)
            .or_default()
            .push((column.to_owned(), text));
    }

    /// What a `_cdc_verbatim` column read back from a table holds.
    pub(crate) fn of_column(array: &dyn Array) -> Verbatim {
        let mut verbatim = Verbatim::default();
        for row in 0..array.len() {
            for (column, text) in verbatim_entries(array, row) {
                verbatim.keep(row, &column, text);
            }
        }
        verbatim
    }

    /// Takes `other`'s entries, their column names prefixed.
    pub(crate) fn take_prefixed(&mut self, other: Verbatim, prefix: &str) {
        for (row, kept) in other.rows {
            for (column, text) in kept {
                self.keep(row, &format!("{prefix}{column}"), text);
            }
        }
    }

    /// The entries of `row`, sorted.
    pub(crate) fn entries(&self, row: usize) -> Vec<(String, String)> {
        let mut entries = self.rows.get(&row).cloned().unwrap_or_default();
        entries.sort();
        entries
    }

    /// The `_cdc_verbatim` column (`field`, a map of strings) of a batch of
    /// `rows` rows: null where a row kept nothing.
    pub(crate) fn array(&self, field: &Field, rows: usize) -> Result<ArrayRef> {
        let bad = || {
            Error::new(
                ErrorKind::Lake,
                "the table's _cdc_verbatim column is not a map of strings",
            )
            .with_context("column", field.name())
        };
        let DataType::Map(entries, _) = field.data_type() else {
            return Err(bad());
        };
        let DataType::Struct(kv) = entries.data_type() else {
            return Err(bad());
        };
        let [key, value] = kv.iter().collect::<Vec<_>>()[..] else {
            return Err(bad());
        };
        let names = MapFieldNames {
            entry: entries.name().clone(),
            key: key.name().clone(),
            value: value.name().clone(),
        };
        let mut builder = MapBuilder::new(Some(names), StringBuilder::new(), StringBuilder::new())
            .with_keys_field(key.clone())
            .with_values_field(value.clone());
        for row in 0..rows {
            match self.rows.get(&row) {
                Some(kept) => {
                    for (column, text) in kept {
                        builder.keys().append_value(column);
                        builder.values().append_value(text);
                    }
                    builder.append(true)
                }
                None => builder.append(false),
            }
            .map_err(|e| bad().with_source(e))?;
        }
        Ok(Arc::new(builder.finish()))
    }
}

/// The arrays of a batch's `fields`: `columns` as given, the
/// `_cdc_verbatim` field (left `None` there) built from `verbatim`.
pub(crate) fn with_verbatim(
    fields: &Fields,
    columns: Vec<Option<ArrayRef>>,
    verbatim: &Verbatim,
    rows: usize,
) -> Result<Vec<ArrayRef>> {
    fields
        .iter()
        .zip(columns)
        .map(|(field, column)| match column {
            Some(array) => Ok(array),
            None => verbatim.array(field, rows),
        })
        .collect()
}

/// The map a `_cdc_verbatim` cell holds, column to text.
pub(crate) fn verbatim_entries(array: &dyn Array, row: usize) -> Vec<(String, String)> {
    let Some(map) = array.as_map_opt() else {
        return Vec::new();
    };
    if map.is_null(row) {
        return Vec::new();
    }
    let entries = map.value(row);
    let (Some(keys), Some(values)) = (
        entries.column(0).as_string_opt::<i32>(),
        entries.column(1).as_string_opt::<i32>(),
    ) else {
        return Vec::new();
    };
    (0..entries.len())
        .map(|i| (keys.value(i).to_owned(), values.value(i).to_owned()))
        .collect()
}

/// The PostgreSQL text of a value whose column's type cannot hold it:
/// numeric `NaN` (a decimal has none), the time `24:00:00` (Iceberg's
/// ends at 23:59:59.999999), text kept as itself ([`Value::Unknown`]),
/// and an array holding such values, written as `array_out` writes it.
/// `None` for a value of another type than the column's, a bug.
pub(crate) fn verbatim_text(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::Time(t) => Some(Cow::Owned(temporal::format_time(*t))),
        Value::Array(items) => {
            let mut out = String::from("{");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                match item {
                    Value::Null => out.push_str("NULL"),
                    // A sub-array of a multi-dimensional one, unquoted.
                    Value::Array(_) => out.push_str(&verbatim_text(item)?),
                    item => push_array_element(&mut out, &element_text(item)?),
                }
            }
            out.push('}');
            Some(Cow::Owned(out))
        }
        v => text_form(v),
    }
}

/// The text of an array's element: as [`verbatim_text`] gives it, or,
/// for an element its list could hold (a multi-dimensional array in a
/// table made when its column was a flat list), its JSON form's text,
/// which PostgreSQL reads back as the same value.
pub(super) fn element_text(v: &Value) -> Option<Cow<'_, str>> {
    verbatim_text(v).or_else(|| match v.to_json() {
        serde_json::Value::String(s) => Some(Cow::Owned(s)),
        serde_json::Value::Number(n) => Some(Cow::Owned(n.to_string())),
        serde_json::Value::Bool(b) => Some(Cow::Borrowed(if b { "t" } else { "f" })),
        _ => None,
    })
}

/// An element as `array_out` writes it: in double quotes, with `"` and
/// `\` escaped, when it is empty, reads `NULL`, or holds white space, a
/// brace, a comma, a quote or a backslash.
pub(super) fn push_array_element(out: &mut String, text: &str) {
    let quote = text.is_empty()
        || text.eq_ignore_ascii_case("NULL")
        || text
            .bytes()
            .any(|b| matches!(b, b'{' | b'}' | b',' | b'"' | b'\\') || is_space(b));
    if !quote {
        out.push_str(text);
        return;
    }
    out.push('"');
    for c in text.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// The white space `array_out` quotes (`array_isspace`).
pub(super) fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c')
}
