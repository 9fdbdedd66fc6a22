//! Iceberg schemas of the two tables written per source table, and the
//! mapping of PostgreSQL column types to Iceberg types (docs/tables.md).
//!
//! - silver `<table>`: the source columns, then `_cdc_commit_lsn` and
//!   `_cdc_commit_ts` of the change that last wrote the row; the primary
//!   key columns are required and are the identifier fields.
//! - bronze `<table>_changes`: `_cdc_commit_lsn`, `_cdc_seq`, `_cdc_lsn`,
//!   `_cdc_xid`, `_cdc_commit_ts`, `_cdc_op`, the source columns (the after
//!   image; the before image for a delete), then `_cdc_before`: a struct
//!   holding `_cdc_image` (`full` or `key`), the source columns, and
//!   `_cdc_not_sent`, the names of the columns the server did not send.
//!
//! Field ids are assigned in order from 1; Iceberg keeps them when a
//! column is added later, so a reader can tell columns apart across
//! schema changes. `evolve` follows ADD, DROP and RENAME COLUMN and type
//! promotions; `staged` holds schema changes committed with a batch's rows.

pub(crate) mod evolve;
pub(crate) mod staged;

use std::sync::Arc;

use iceberg::spec::{
    ListType, MapType, NestedField, NestedFieldRef, PrimitiveType, Schema, StructType, Type,
};

use arrow_schema::FieldRef;

use crate::cdc::relation::{ColumnInfo, RelationInfo};
use crate::cdc::value::PgType;
use crate::error::{Error, ErrorKind, Result};

/// The columns this tool adds; source columns may not use these names.
pub(crate) const COMMIT_LSN: &str = "_cdc_commit_lsn";
pub(crate) const SEQ: &str = "_cdc_seq";
pub(crate) const LSN: &str = "_cdc_lsn";
pub(crate) const XID: &str = "_cdc_xid";
pub(crate) const COMMIT_TS: &str = "_cdc_commit_ts";
pub(crate) const OP: &str = "_cdc_op";
pub(crate) const BEFORE: &str = "_cdc_before";
pub(crate) const BEFORE_IMAGE: &str = "_cdc_image";
pub(crate) const BEFORE_NOT_SENT: &str = "_cdc_not_sent";
/// A map from a column's name to the PostgreSQL text of its value, for the
/// values of the row its column's type cannot hold (the column is null
/// there); null when there are none (docs/values.md).
pub(crate) const VERBATIM: &str = "_cdc_verbatim";

/// The largest precision an Iceberg decimal holds.
const MAX_DECIMAL_PRECISION: u32 = 38;

/// Hands out field ids in order.
pub(crate) struct FieldIds(i32);

impl FieldIds {
    /// Ids from `last + 1`: those of a table whose highest is `last`.
    pub(crate) fn after(last: i32) -> FieldIds {
        FieldIds(last)
    }

    pub(crate) fn take(&mut self) -> i32 {
        self.0 += 1;
        self.0
    }
}

/// The names of a table's top-level columns, in its current schema.
pub(crate) fn column_names(table: &iceberg::table::Table) -> Vec<String> {
    table
        .metadata()
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

/// The Iceberg type of a column, from its decoding and type modifier.
pub(crate) fn iceberg_type(column: &ColumnInfo) -> Type {
    numbered_type(column, &mut FieldIds(0))
}

/// [`iceberg_type`], the fields nested in it (a list's element) numbered
/// from `ids`.
pub(crate) fn numbered_type(column: &ColumnInfo, ids: &mut FieldIds) -> Type {
    map_type(&column.pg_type, column.type_modifier, ids)
}

fn map_type(pg: &PgType, type_modifier: i32, ids: &mut FieldIds) -> Type {
    let primitive = match pg {
        PgType::Bool => PrimitiveType::Boolean,
        PgType::Int2 | PgType::Int4 => PrimitiveType::Int,
        PgType::Int8 => PrimitiveType::Long,
        PgType::Float4 => PrimitiveType::Float,
        PgType::Float8 => PrimitiveType::Double,
        PgType::Numeric => match numeric_precision_scale(type_modifier) {
            Some((precision, scale)) => PrimitiveType::Decimal { precision, scale },
            None => PrimitiveType::String,
        },
        PgType::Bytea => PrimitiveType::Binary,
        PgType::Date => PrimitiveType::Date,
        PgType::Time => PrimitiveType::Time,
        PgType::Timestamp => PrimitiveType::Timestamp,
        PgType::TimestampTz => PrimitiveType::Timestamptz,
        PgType::Uuid => PrimitiveType::Uuid,
        // As a list of strings, the type an array of an unmodelled type has.
        PgType::OpaqueArray => {
            return map_type(
                &PgType::Array(Box::new(PgType::Unknown)),
                type_modifier,
                ids,
            );
        }
        PgType::Array(element) => {
            let element_type = map_type(element, type_modifier, ids);
            let element = NestedField::list_element(ids.take(), element_type, false);
            return Type::List(ListType::new(Arc::new(element)));
        }
        PgType::Text
        | PgType::TimeTz
        | PgType::Interval
        | PgType::Json
        | PgType::Jsonb
        | PgType::Inet
        | PgType::Cidr
        | PgType::Enum
        | PgType::Unknown => PrimitiveType::String,
    };
    Type::Primitive(primitive)
}

/// `numeric(p,s)` fits an Iceberg decimal when 1 <= p <= 38 and
/// 0 <= s <= p. Without a type modifier, or beyond that, the column is an
/// exact string. The modifier is `((p << 16) | (s & 0x7ff)) + 4`, the scale
/// signed (negative scales exist from PostgreSQL 15).
pub(crate) fn numeric_precision_scale(type_modifier: i32) -> Option<(u32, u32)> {
    if type_modifier < 4 {
        return None;
    }
    let packed = type_modifier - 4;
    let precision = ((packed >> 16) & 0xffff) as u32;
    let raw_scale = packed & 0x7ff;
    let scale = if raw_scale & 0x400 != 0 {
        raw_scale - 0x800
    } else {
        raw_scale
    };
    let scale = u32::try_from(scale).ok()?;
    (1..=MAX_DECIMAL_PRECISION)
        .contains(&precision)
        .then_some(())
        .filter(|()| scale <= precision)
        .map(|()| (precision, scale))
}

fn check_names(relation: &RelationInfo) -> Result<()> {
    for column in &relation.columns {
        if column.name.starts_with("_cdc_") {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "column {:?} uses the prefix _cdc_, which wal2iceberg reserves for its own columns",
                    column.name
                ),
            )
            .with_context("table", &relation.name));
        }
    }
    Ok(())
}

/// The property of a bronze table whose source table has no primary key:
/// it is the table's history only, with no silver beside it.
pub(crate) const HISTORY_ONLY: (&str, &str) = ("wal2iceberg.silver", "none");

/// Its value once the source table gained a primary key, and with it a
/// silver table.
pub(crate) const KEYED: &str = "keyed";

/// Its value once the source table lost its primary key, until the silver
/// table it had is dropped (then [`HISTORY_ONLY`]).
pub(crate) const RETIRED: &str = "retired";

/// Whether `bronze` is the history of a table without silver.
pub(crate) fn history_only(bronze: &iceberg::table::Table) -> bool {
    matches!(
        bronze.metadata().properties().get(HISTORY_ONLY.0).map(String::as_str),
        Some(value) if value == HISTORY_ONLY.1 || value == RETIRED
    )
}

/// Whether `bronze`'s table lost its primary key and its silver table is
/// still to be dropped.
pub(crate) fn silver_retired(bronze: &iceberg::table::Table) -> bool {
    bronze
        .metadata()
        .properties()
        .get(HISTORY_ONLY.0)
        .map(String::as_str)
        == Some(RETIRED)
}

/// Whether the table has a primary key, which silver keeps rows by. A
/// table without one (under REPLICA IDENTITY FULL) has bronze only.
pub(crate) fn has_silver(relation: &RelationInfo) -> bool {
    relation.columns.iter().any(|c| c.is_primary_key)
}

fn source_fields(
    relation: &RelationInfo,
    ids: &mut FieldIds,
    keys_required: bool,
) -> Vec<NestedFieldRef> {
    let mut fields = Vec::with_capacity(relation.columns.len());
    for column in &relation.columns {
        let id = ids.take();
        let field_type = map_type(&column.pg_type, column.type_modifier, ids);
        let required = keys_required && column.is_primary_key;
        fields.push(Arc::new(NestedField::new(
            id,
            &column.name,
            field_type,
            required,
        )));
    }
    fields
}

/// The optional `_cdc_verbatim` column: a map of strings to strings.
fn verbatim_field(ids: &mut FieldIds) -> NestedFieldRef {
    let id = ids.take();
    Arc::new(NestedField::optional(id, VERBATIM, verbatim_type(ids)))
}

/// The type of `_cdc_verbatim`, its key and value with ids from `ids`.
pub(crate) fn verbatim_type(ids: &mut FieldIds) -> Type {
    let string = Type::Primitive(PrimitiveType::String);
    let key = NestedField::map_key_element(ids.take(), string.clone());
    let value = NestedField::map_value_element(ids.take(), string, true);
    Type::Map(MapType::new(Arc::new(key), Arc::new(value)))
}

fn build(
    fields: Vec<NestedFieldRef>,
    identifiers: Vec<i32>,
    relation: &RelationInfo,
) -> Result<Schema> {
    Schema::builder()
        .with_schema_id(0)
        .with_fields(fields)
        .with_identifier_field_ids(identifiers)
        .build()
        .map_err(|e| {
            Error::new(ErrorKind::Config, "cannot build the Iceberg schema")
                .with_context("table", &relation.name)
                .with_source(e)
        })
}

/// The silver (current state) schema of a relation.
pub fn silver_schema(relation: &RelationInfo) -> Result<Schema> {
    if !has_silver(relation) {
        return Err(Error::new(
            ErrorKind::Preflight,
            "the table has no primary key: silver needs one to keep rows in step with the source",
        )
        .with_context("table", &relation.name));
    }
    current_state_schema(relation)
}

/// Silver's schema, of a table with a key or not.
fn current_state_schema(relation: &RelationInfo) -> Result<Schema> {
    check_names(relation)?;
    let mut ids = FieldIds(0);
    let mut fields = source_fields(relation, &mut ids, true);
    let identifiers = fields
        .iter()
        .zip(&relation.columns)
        .filter(|(_, c)| c.is_primary_key)
        .map(|(f, _)| f.id)
        .collect();
    fields.push(Arc::new(NestedField::required(
        ids.take(),
        COMMIT_LSN,
        Type::Primitive(PrimitiveType::Long),
    )));
    fields.push(Arc::new(NestedField::required(
        ids.take(),
        COMMIT_TS,
        Type::Primitive(PrimitiveType::Timestamptz),
    )));
    fields.push(verbatim_field(&mut ids));
    build(fields, identifiers, relation)
}

/// The relation's columns as Arrow fields of silver's types (with their
/// field ids), in column order: what the initial load decodes into (for a
/// table without a key too, which has bronze only), and what verify
/// compares.
pub(crate) fn source_arrow_fields(relation: &RelationInfo) -> Result<Vec<FieldRef>> {
    let bad = |e: &dyn std::fmt::Display| {
        Error::new(
            ErrorKind::Lake,
            format!("cannot map the table's columns to Arrow: {e}"),
        )
        .with_context("table", &relation.name)
    };
    let silver = iceberg::arrow::schema_to_arrow_schema(&current_state_schema(relation)?)
        .map_err(|e| bad(&e))?;
    relation
        .columns
        .iter()
        .map(|c| {
            silver
                .field_with_name(&c.name)
                .map(|f| Arc::new(f.clone()))
                .map_err(|e| bad(&e))
        })
        .collect()
}

/// The bronze (change history) schema of a relation.
pub fn bronze_schema(relation: &RelationInfo) -> Result<Schema> {
    check_names(relation)?;
    let mut ids = FieldIds(0);
    let long = Type::Primitive(PrimitiveType::Long);
    let string = Type::Primitive(PrimitiveType::String);
    let mut fields = vec![
        Arc::new(NestedField::required(ids.take(), COMMIT_LSN, long.clone())),
        Arc::new(NestedField::required(ids.take(), SEQ, long.clone())),
        Arc::new(NestedField::required(ids.take(), LSN, long.clone())),
        Arc::new(NestedField::required(ids.take(), XID, long)),
        Arc::new(NestedField::required(
            ids.take(),
            COMMIT_TS,
            Type::Primitive(PrimitiveType::Timestamptz),
        )),
        Arc::new(NestedField::required(ids.take(), OP, string.clone())),
    ];
    fields.extend(source_fields(relation, &mut ids, false));
    let before_id = ids.take();
    let mut before = vec![Arc::new(NestedField::required(
        ids.take(),
        BEFORE_IMAGE,
        string.clone(),
    ))];
    before.extend(source_fields(relation, &mut ids, false));
    let not_sent_id = ids.take();
    let element = NestedField::list_element(ids.take(), string, true);
    before.push(Arc::new(NestedField::required(
        not_sent_id,
        BEFORE_NOT_SENT,
        Type::List(ListType::new(Arc::new(element))),
    )));
    before.push(verbatim_field(&mut ids));
    fields.push(Arc::new(NestedField::optional(
        before_id,
        BEFORE,
        Type::Struct(StructType::new(before)),
    )));
    fields.push(verbatim_field(&mut ids));
    build(fields, Vec::new(), relation)
}

#[cfg(test)]
mod tests;
