//! Following the source's schema: a relation (from a new Relation message,
//! or at start) compared with the columns a table already has.
//!
//! - A column the table lacks is added, optional, with new field ids
//!   (iceberg's update-schema action), to both tables and to bronze's
//!   `_cdc_before`; rows written before read it as null.
//! - A column the relation lacks (dropped at the source) stays in the
//!   table for history; rows written from then on hold null there.
//! - Anything else stops the run with an error that says what changed: a
//!   column whose type now maps to another Iceberg type, a changed primary
//!   key, or a column gone and another new in the same change (a rename
//!   cannot be told from a drop and an add).

use iceberg::spec::{Schema, Type};
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};

use super::catalog::{Lake, iceberg_error};
use super::schema::{BEFORE, VERBATIM, iceberg_type, new_verbatim_type};
use crate::cdc::relation::{ColumnInfo, RelationInfo};
use crate::cdc::value::PgType;
use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;

/// What [`follow`] changed.
#[derive(Debug, Default)]
pub struct Followed {
    /// A schema changed.
    pub changed: bool,
    /// The columns added to silver.
    pub added_to_silver: Vec<String>,
}

/// Brings a source table's bronze and silver tables (none for a table
/// without a key) to the relation's columns.
pub async fn follow(
    lake: &Lake,
    bronze: &Table,
    silver: Option<&Table>,
    relation: &RelationInfo,
) -> Result<Followed> {
    if let Some(silver) = silver {
        check_key(silver.metadata().current_schema(), relation)?;
    }
    let mut tables = vec![(add_verbatim(lake, bronze).await?, Some(BEFORE))];
    if let Some(silver) = silver {
        tables.push((add_verbatim(lake, silver).await?, None));
    }
    let mut followed = Followed::default();
    for (table, nested_in) in &tables {
        let columns = missing_columns(table.metadata().current_schema(), relation)?;
        if !columns.is_empty() {
            tracing::info!(
                table = %table.identifier(),
                columns = ?columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
                "adding the source's new columns"
            );
            add_columns(lake, table, &columns, *nested_in).await?;
            failpoint::hit("mid-schema-change");
            followed.changed = true;
            if nested_in.is_none() {
                followed.added_to_silver = columns.iter().map(|c| c.name.clone()).collect();
            }
        }
    }
    Ok(followed)
}

/// The relation's columns `schema` lacks, in column order; an error for a
/// column whose type no longer matches.
pub fn missing_columns<'a>(
    schema: &Schema,
    relation: &'a RelationInfo,
) -> Result<Vec<&'a ColumnInfo>> {
    let mut missing = Vec::new();
    for column in &relation.columns {
        let wanted = iceberg_type(column);
        match schema.as_struct().field_by_name(&column.name) {
            None => {
                if column.name.starts_with("_cdc_") {
                    return Err(unsupported(
                        relation,
                        format!(
                            "new column {:?} uses the prefix _cdc_, which wal2iceberg reserves",
                            column.name
                        ),
                    ));
                }
                missing.push(column);
            }
            Some(field) if !same_type(&field.field_type, &wanted) => {
                return Err(unsupported(
                    relation,
                    format!(
                        "column {:?} changed type: the table holds {}, the source now sends {}",
                        column.name, field.field_type, wanted
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(missing)
}

/// The primary key must stay what silver's identifier fields are.
pub fn check_key(silver: &Schema, relation: &RelationInfo) -> Result<()> {
    let mut table_key: Vec<&str> = silver
        .identifier_field_ids()
        .filter_map(|id| silver.name_by_field_id(id))
        .collect();
    let mut source_key: Vec<&str> = relation
        .columns
        .iter()
        .filter(|c| c.is_primary_key)
        .map(|c| c.name.as_str())
        .collect();
    table_key.sort_unstable();
    source_key.sort_unstable();
    if table_key != source_key {
        return Err(unsupported(
            relation,
            format!("the primary key changed from {table_key:?} to {source_key:?}"),
        ));
    }
    Ok(())
}

/// A column gone and another new in one change may be a rename, which
/// cannot be followed as a drop and an add without splitting the column's
/// history silently.
pub fn check_rename(previous: &RelationInfo, relation: &RelationInfo) -> Result<()> {
    let has = |r: &RelationInfo, name: &str| r.columns.iter().any(|c| c.name == name);
    let gone: Vec<&str> = previous
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| !has(relation, n))
        .collect();
    let new: Vec<&str> = relation
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| !has(previous, n))
        .collect();
    if !gone.is_empty() && !new.is_empty() {
        return Err(unsupported(
            relation,
            format!(
                "columns {gone:?} are gone and {new:?} are new in one change, which may be a rename"
            ),
        ));
    }
    Ok(())
}

/// Adds `columns` (optional) to the table, at the top level and, when
/// `nested_in` names a struct column, inside it too.
pub async fn add_columns(
    lake: &Lake,
    table: &Table,
    columns: &[&ColumnInfo],
    nested_in: Option<&str>,
) -> Result<Table> {
    let context = |e: iceberg::Error| {
        iceberg_error(e, "cannot add columns to the table")
            .with_context("table", table.identifier())
    };
    let tx = Transaction::new(table);
    let mut action = tx.update_schema();
    for column in columns {
        action = action.add_column(AddColumn::optional(&column.name, iceberg_type(column)));
        if let Some(parent) = nested_in {
            action = action.add_column(
                AddColumn::builder()
                    .parent(parent)
                    .name(column.name.clone())
                    .field_type(iceberg_type(column))
                    .build(),
            );
        }
    }
    let tx = action.apply(tx).map_err(context)?;
    tx.commit(lake.catalog()).await.map_err(context)
}

/// The table with `_cdc_verbatim` (docs/values.md), added at the top
/// level to a table written before that column existed. Not inside
/// bronze's `_cdc_before`: iceberg-rust 0.10 matches a struct's fields by
/// position when it reads a file written before the struct gained one
/// (apache/iceberg-rust#2617), so `show` and `verify` could no longer read
/// the table; such a table keeps its before images' verbatim values in the
/// top-level map instead ([`super::bronze`]).
async fn add_verbatim(lake: &Lake, table: &Table) -> Result<Table> {
    let schema = table.metadata().current_schema().as_struct();
    if schema.field_by_name(VERBATIM).is_some() {
        return Ok(table.clone());
    }
    tracing::info!(table = %table.identifier(), "adding the column {VERBATIM}");
    let context = |e: iceberg::Error| {
        iceberg_error(e, "cannot add _cdc_verbatim to the table")
            .with_context("table", table.identifier())
    };
    let tx = Transaction::new(table);
    let action = tx
        .update_schema()
        .add_column(AddColumn::optional(VERBATIM, new_verbatim_type()));
    let tx = action.apply(tx).map_err(context)?;
    tx.commit(lake.catalog()).await.map_err(context)
}

/// Types equal but for the ids of nested fields.
/// `relation` with each array column as deep as `schema`'s list holds it:
/// a table made when a column was declared with fewer dimensions keeps
/// its list ([`same_type`]), and a comparison with it must use that shape.
pub fn as_table_holds(relation: &RelationInfo, schema: &Schema) -> RelationInfo {
    let mut relation = relation.clone();
    for column in &mut relation.columns {
        let Some(field) = schema.as_struct().field_by_name(&column.name) else {
            continue;
        };
        let held = list_depth(&field.field_type);
        while held > 0 && depth_of(&column.pg_type) > held {
            if let PgType::Array(inner) = &column.pg_type {
                column.pg_type = (**inner).clone();
            }
        }
    }
    relation
}

fn list_depth(t: &Type) -> usize {
    match t {
        Type::List(list) => 1 + list_depth(&list.element_field.field_type),
        _ => 0,
    }
}

fn depth_of(t: &PgType) -> usize {
    match t {
        PgType::Array(inner) => 1 + depth_of(inner),
        _ => 0,
    }
}

/// Lists are the same type when their innermost elements are: a table
/// made before multi-dimensional arrays became nested lists keeps its
/// list, and holds the values of more dimensions verbatim.
fn same_type(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (Type::Primitive(a), Type::Primitive(b)) => a == b,
        (Type::List(_), Type::List(_)) => same_type(innermost(a), innermost(b)),
        _ => false,
    }
}

fn innermost(t: &Type) -> &Type {
    match t {
        Type::List(list) => innermost(&list.element_field.field_type),
        t => t,
    }
}

fn unsupported(relation: &RelationInfo, change: String) -> Error {
    Error::new(
        ErrorKind::Lake,
        format!(
            "unsupported schema change: {change}. wal2iceberg follows ADD COLUMN and DROP \
             COLUMN only; to take this change, remove the table's Iceberg tables and run \
             again to load it afresh (docs/tables.md, Schema changes)"
        ),
    )
    .with_context("table", &relation.name)
}

#[cfg(test)]
mod tests;
