//! `wal2iceberg show`: a lake table read back through our own reader
//! (iceberg-rust's scan) and printed as a text table (as the seed's show.py
//! does), JSON or CSV; optionally as of a source LSN.
//!
//! As of LSN X means the newest snapshot whose last source transaction
//! committed at or before X: a snapshot holds whole batches of
//! transactions, so that is the latest state that holds nothing committed
//! after X. Bronze rows can be cut exactly by `_cdc_commit_lsn` as well.

use std::str::FromStr;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, ListArray, RecordBatch, StringArray, StructArray};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_ord::sort::{SortColumn, lexsort_to_indices};
use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit};
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use futures_util::TryStreamExt;
use iceberg::TableIdent;
use iceberg::table::Table;

use crate::apply::table_set::SOURCE_TABLE;
use crate::cdc::temporal::{MICROS_PER_DAY, PG_EPOCH_DAYS, format_date, format_pg_timestamp};
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::files::arrow::{arrow_value, verbatim_text};
use crate::lake::files::scan::{scan, schema_at};
use crate::lake::files::writer::SUMMARY_COMMIT_LSN;
use crate::lake::schema::{COMMIT_LSN, LSN, SEQ};
use crate::model::Lsn;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Format, String> {
        match s {
            "table" => Ok(Format::Table),
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv),
            other => Err(format!("unknown format {other:?}: use table, json or csv")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ShowOptions {
    /// Columns to print; all when empty.
    pub columns: Vec<String>,
    /// Sort keys; when empty, bronze sorts by (`_cdc_commit_lsn`,
    /// `_cdc_seq`) and silver by its primary key.
    pub order_by: Vec<String>,
    pub limit: Option<usize>,
    pub as_of: Option<Lsn>,
    pub format: Format,
}

impl Default for ShowOptions {
    fn default() -> ShowOptions {
        ShowOptions {
            columns: Vec::new(),
            order_by: Vec::new(),
            limit: None,
            as_of: None,
            format: Format::Table,
        }
    }
}

/// The table `name` names in the lake ([`Lake::resolve_table`]). A name
/// the lake lacks that a source table it replicates has now (renamed
/// after its load: its Iceberg tables keep their names) gets an error
/// naming the Iceberg tables it is in.
pub async fn resolve(lake: &Lake, name: &str, namespace: Option<&str>) -> Result<TableIdent> {
    let missing = match lake.resolve_table(name, namespace).await {
        Ok(ident) => return Ok(ident),
        Err(e) if e.kind() == ErrorKind::Config => e,
        Err(e) => return Err(e),
    };
    let Ok(idents) = lake.tables(namespace).await else {
        return Err(missing);
    };
    let short = name.rsplit('.').next().unwrap_or(name);
    for bronze in idents {
        let Some(silver) = bronze.name().strip_suffix("_changes") else {
            continue;
        };
        let table = lake.catalog_table(&bronze).await?;
        let Some(source) = table.metadata().properties().get(SOURCE_TABLE) else {
            continue;
        };
        let source_short = source.rsplit('.').next();
        // A table under its own name is not renamed: the lake's own answer
        // (a keyless table's history, say) stands.
        if source_short == Some(silver) {
            continue;
        }
        if source == name || source_short == Some(short) {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "no such table in the lake: the source table {source} is replicated into \
                     {silver} and {} (renamed after its load; its Iceberg tables keep their \
                     names)",
                    bronze.name()
                ),
            )
            .with_context("table", name));
        }
    }
    Err(missing)
}

/// The table's rows printed as `options` say.
pub async fn show(lake: &Lake, ident: &TableIdent, options: &ShowOptions) -> Result<String> {
    let table = lake.catalog_table(ident).await?;
    let snapshot = options
        .as_of
        .map(|lsn| snapshot_as_of(&table, lsn))
        .transpose()?;
    // The columns of that time, under their names then.
    let full = schema_at(&table, snapshot)?;
    let columns: Vec<&str> = if options.columns.is_empty() {
        full.fields().iter().map(|f| f.name().as_str()).collect()
    } else {
        options.columns.iter().map(String::as_str).collect()
    };
    let selected: Vec<String> = columns.iter().map(|c| (*c).to_owned()).collect();
    let batches: Vec<RecordBatch> = scan(&table, snapshot, &selected)
        .await?
        .try_collect()
        .await?;
    let schema = match batches.first() {
        Some(b) => b.schema(),
        None => Arc::new(
            full.project(&indices_of(&full, &columns)?)
                .map_err(|e| arrow_error(e, ident))?,
        ),
    };
    let all = concat_batches(&schema, &batches).map_err(|e| arrow_error(e, ident))?;
    let order_by = if options.order_by.is_empty() {
        default_order(&table, &all)
    } else {
        options.order_by.clone()
    };
    let mut rows = sort(all, &order_by, ident)?;
    if let Some(limit) = options.limit {
        rows = rows.slice(0, limit.min(rows.num_rows()));
    }
    let rows = printable(&rows).map_err(|e| arrow_error(e, ident))?;
    render(&rows, options.format).map_err(|e| e.with_context("table", ident))
}

/// The newest snapshot whose last source transaction committed at or
/// before `lsn`; when there is none, whether expiry removed it, and the
/// oldest snapshot kept.
fn snapshot_as_of(table: &Table, lsn: Lsn) -> Result<i64> {
    let positioned: Vec<(i64, u64, &iceberg::spec::Snapshot)> = table
        .metadata()
        .snapshots()
        .filter_map(|s| {
            let committed: u64 = s
                .summary()
                .additional_properties
                .get(SUMMARY_COMMIT_LSN)?
                .parse()
                .ok()?;
            Some((s.sequence_number(), committed, s.as_ref()))
        })
        .collect();
    if let Some((_, _, s)) = positioned
        .iter()
        .filter(|(_, committed, _)| *committed <= lsn.0)
        .max_by_key(|(sequence, ..)| *sequence)
    {
        return Ok(s.snapshot_id());
    }
    let oldest = positioned
        .iter()
        .min_by_key(|(sequence, ..)| *sequence)
        .map_or_else(
            || "it has none yet".to_owned(),
            |(_, committed, s)| {
                format!(
                    "the oldest kept is snapshot {} at LSN {}",
                    s.snapshot_id(),
                    Lsn(*committed)
                )
            },
        );
    // The first snapshot kept has a parent: older ones were expired.
    let expired = table
        .metadata()
        .snapshots()
        .min_by_key(|s| s.sequence_number())
        .is_some_and(|s| s.parent_snapshot_id().is_some());
    let why = if expired {
        "expiry removed the snapshots that far back (snapshot_retention, retain_snapshots)"
    } else {
        "its history starts later"
    };
    Err(Error::new(
        ErrorKind::Config,
        format!("the table has no snapshot as of LSN {lsn}: {why}; {oldest}"),
    )
    .with_context("table", table.identifier()))
}

fn default_order(table: &Table, rows: &RecordBatch) -> Vec<String> {
    let has = |name: &str| rows.column_by_name(name).is_some();
    if has(COMMIT_LSN) && has(SEQ) {
        return vec![COMMIT_LSN.to_owned(), SEQ.to_owned()];
    }
    let schema = table.metadata().current_schema();
    schema
        .identifier_field_ids()
        .filter_map(|id| schema.name_by_field_id(id))
        .filter(|name| has(name))
        .map(str::to_owned)
        .collect()
}

fn sort(rows: RecordBatch, order_by: &[String], ident: &TableIdent) -> Result<RecordBatch> {
    let keys: Vec<SortColumn> = order_by
        .iter()
        .map(|name| {
            rows.column_by_name(name)
                .map(|values| SortColumn {
                    values: values.clone(),
                    options: None,
                })
                .ok_or_else(|| {
                    Error::new(ErrorKind::Config, format!("no column {name} to sort by"))
                        .with_context("table", ident)
                })
        })
        .collect::<Result<_>>()?;
    if keys.is_empty() || rows.num_rows() == 0 {
        return Ok(rows);
    }
    let indices = lexsort_to_indices(&keys, None).map_err(|e| arrow_error(e, ident))?;
    take_record_batch(&rows, &indices).map_err(|e| arrow_error(e, ident))
}

fn render(rows: &RecordBatch, format: Format) -> Result<String> {
    let bad = |e: arrow_schema::ArrowError| {
        Error::new(ErrorKind::Io, "cannot print the table").with_source(e)
    };
    match format {
        Format::Table => Ok(format!(
            "{}\n",
            arrow_cast::pretty::pretty_format_batches(&[arrays_as_text(rows).map_err(bad)?])
                .map_err(bad)?
        )),
        Format::Json => {
            // A NULL is `null`, not a missing key.
            let mut writer = arrow_json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow_json::writer::JsonArray>(Vec::new());
            writer.write(rows).map_err(bad)?;
            writer.finish().map_err(bad)?;
            let mut out = String::from_utf8(writer.into_inner()).map_err(|e| {
                Error::new(ErrorKind::Io, "the JSON writer produced invalid UTF-8").with_source(e)
            })?;
            if out.is_empty() {
                out.push_str("[]");
            }
            out.push('\n');
            Ok(out)
        }
        Format::Csv => {
            let flat = flatten(&arrays_as_text(rows).map_err(bad)?).map_err(bad)?;
            let mut writer = arrow_csv::WriterBuilder::new()
                .with_header(true)
                .build(Vec::new());
            writer.write(&flat).map_err(bad)?;
            String::from_utf8(writer.into_inner()).map_err(|e| {
                Error::new(ErrorKind::Io, "the CSV writer produced invalid UTF-8").with_source(e)
            })
        }
    }
}

/// The columns as they print: the LSN columns (integers in the lake) in
/// PostgreSQL's form, `0/1C21998`, as `status`, the logs and `--as-of`
/// write them, and dates and timestamps whose sentinel stands for
/// PostgreSQL's `infinity` (docs/values.md) as that word.
fn printable(rows: &RecordBatch) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let (fields, columns): (Vec<Field>, Vec<ArrayRef>) = rows
        .schema()
        .fields()
        .iter()
        .zip(rows.columns())
        .map(|(field, column)| printable_column(field, column))
        .collect::<std::result::Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// One column as [`printable`] prints it, inside structs and lists too
/// (`_cdc_before`, a `timestamp[]` column).
fn printable_column(
    field: &Field,
    column: &ArrayRef,
) -> std::result::Result<(Field, ArrayRef), arrow_schema::ArrowError> {
    let text: StringArray = match column.data_type() {
        DataType::Int64 if [COMMIT_LSN, LSN].contains(&field.name().as_str()) => column
            .as_primitive::<Int64Type>()
            .iter()
            .map(|v| v.map(|v| Lsn(v as u64).to_string()))
            .collect(),
        // Iceberg's uuid: sixteen bytes, printed as PostgreSQL does.
        DataType::FixedSizeBinary(16) => column
            .as_fixed_size_binary()
            .iter()
            .map(|v| {
                v.and_then(|b| uuid::Uuid::from_slice(b).ok())
                    .map(|u| u.to_string())
            })
            .collect(),
        // Exact in every format: JSON readers would parse a number into a
        // double.
        DataType::Decimal128(..) => {
            let formatter = ArrayFormatter::try_new(column, &FormatOptions::default())?;
            (0..column.len())
                .map(|i| (!column.is_null(i)).then(|| formatter.value(i).to_string()))
                .collect()
        }
        DataType::Date32 => {
            let days = |i| i64::from(column.as_primitive::<Date32Type>().value(i));
            temporal_text(
                column,
                |i| infinity_of(days(i), i64::from(i32::MAX)),
                |i| format_date(days(i)),
            )?
        }
        DataType::Timestamp(TimeUnit::Microsecond, zone) => {
            let micros = |i| column.as_primitive::<TimestampMicrosecondType>().value(i);
            temporal_text(
                column,
                |i| infinity_of(micros(i), i64::MAX),
                |i| format_pg_timestamp(micros(i) - PG_EPOCH_MICROS, zone.is_some()),
            )?
        }
        DataType::Struct(_) => {
            let parts = column.as_struct();
            let (fields, children): (Vec<Field>, Vec<ArrayRef>) = parts
                .fields()
                .iter()
                .zip(parts.columns())
                .map(|(f, c)| printable_column(f, c))
                .collect::<std::result::Result<Vec<_>, _>>()?
                .into_iter()
                .unzip();
            let fields = Fields::from(fields);
            let array = StructArray::try_new(fields.clone(), children, parts.nulls().cloned())?;
            let field = Field::new(field.name(), DataType::Struct(fields), field.is_nullable());
            return Ok((field, Arc::new(array)));
        }
        DataType::List(item) => {
            let list = column.as_list::<i32>();
            let (item, values) = printable_column(item, list.values())?;
            let item = Arc::new(item);
            let array = ListArray::try_new(
                item.clone(),
                list.offsets().clone(),
                values,
                list.nulls().cloned(),
            )?;
            let field = Field::new(field.name(), DataType::List(item), field.is_nullable());
            return Ok((field, Arc::new(array)));
        }
        _ => return Ok((field.clone(), column.clone())),
    };
    let field = Field::new(field.name(), DataType::Utf8, field.is_nullable());
    Ok((field, Arc::new(text)))
}

/// Microseconds from 1970 to 2000, PostgreSQL's epoch.
const PG_EPOCH_MICROS: i64 = PG_EPOCH_DAYS * MICROS_PER_DAY;

/// `infinity` or `-infinity` for the sentinels `max` and `-max`.
fn infinity_of(value: i64, max: i64) -> Option<&'static str> {
    match value {
        v if v == max => Some("infinity"),
        v if v == -max => Some("-infinity"),
        _ => None,
    }
}

/// A temporal column's display text: its sentinels as words, and values
/// Arrow's calendar does not reach (a date in the year 5874897, which
/// PostgreSQL takes) in PostgreSQL's form.
fn temporal_text(
    column: &ArrayRef,
    word: impl Fn(usize) -> Option<&'static str>,
    beyond: impl Fn(usize) -> String,
) -> std::result::Result<StringArray, arrow_schema::ArrowError> {
    let formatter = ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())?;
    Ok((0..column.len())
        .map(|i| {
            (!column.is_null(i)).then(|| match word(i) {
                Some(word) => word.to_owned(),
                None => formatter
                    .value(i)
                    .try_to_string()
                    .unwrap_or_else(|_| beyond(i)),
            })
        })
        .collect())
}

/// Array columns as PostgreSQL writes arrays (`{a,"b,c",NULL}`), as psql
/// shows them: Arrow's display (`[a, b,c, ]`) cannot tell an element's
/// comma from a separator, or a null from an empty string.
fn arrays_as_text(
    rows: &RecordBatch,
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let mut fields = Vec::with_capacity(rows.num_columns());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(rows.num_columns());
    for (field, column) in rows.schema().fields().iter().zip(rows.columns()) {
        if !matches!(field.data_type(), DataType::List(_)) {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
            continue;
        }
        let display = ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())?;
        let text = (0..column.len())
            .map(|i| {
                if column.is_null(i) {
                    return Ok(None);
                }
                let value = arrow_value(column.as_ref(), i)
                    .map_err(|e| arrow_schema::ArrowError::CastError(e.to_string()))?;
                Ok(Some(match verbatim_text(&value) {
                    Some(text) => text.into_owned(),
                    None => display.value(i).to_string(),
                }))
            })
            .collect::<std::result::Result<StringArray, arrow_schema::ArrowError>>()?;
        fields.push(Field::new(field.name(), DataType::Utf8, true));
        columns.push(Arc::new(text));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// CSV has no nested values: lists and structs become their display text.
fn flatten(rows: &RecordBatch) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let mut fields = Vec::with_capacity(rows.num_columns());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(rows.num_columns());
    for (field, column) in rows.schema().fields().iter().zip(rows.columns()) {
        if field.data_type().is_nested() {
            let formatter = ArrayFormatter::try_new(column.as_ref(), &FormatOptions::default())?;
            let text: StringArray = (0..column.len())
                .map(|i| (!column.is_null(i)).then(|| formatter.value(i).to_string()))
                .collect();
            fields.push(Field::new(field.name(), DataType::Utf8, true));
            columns.push(Arc::new(text));
        } else {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

fn indices_of(schema: &Schema, columns: &[&str]) -> Result<Vec<usize>> {
    columns
        .iter()
        .map(|c| {
            schema
                .index_of(c)
                .map_err(|e| Error::new(ErrorKind::Config, format!("no column {c}")).with_source(e))
        })
        .collect()
}

fn arrow_error(e: arrow_schema::ArrowError, ident: &TableIdent) -> Error {
    Error::new(ErrorKind::Lake, "cannot prepare the table for printing")
        .with_context("table", ident)
        .with_source(e)
}
