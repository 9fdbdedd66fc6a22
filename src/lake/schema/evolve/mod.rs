//! Following the source's schema: a relation (from a new Relation message,
//! or at start) compared with the columns a table already has, and the
//! schema updates that bring the table to it (docs/tables.md, Schema
//! changes), staged with the batch that brought the relation and committed
//! in its snapshot ([`crate::lake::schema::staged`]). Each source column is
//! matched to the field that holds it by its attribute number, which a
//! rename keeps and an added column never reuses; the table records each
//! field's number ([`ATTNUMS`]) in the same commit (a table's first follow
//! writes the record alone: the catalog numbers a new table's fields
//! itself). Where a number is unknown (a table written before this
//! record, a relation the catalog had moved on from when asked), by name.
//!
//! - A renamed column keeps its field, and so its id: in silver, at
//!   bronze's top level and inside bronze's `_cdc_before`.
//! - A column whose type widened to one Iceberg promotes to (int to long,
//!   float to double, a decimal's precision) keeps its field, promoted; one
//!   narrowed keeps its field and its wider type.
//! - A new column gets a new optional field (in silver, a required one
//!   when it is part of the key); rows written before read null there.
//! - A column gone from the source leaves silver's current schema; bronze
//!   keeps it for history, null from then on.
//! - A column whose new type Iceberg cannot promote to (int to text, a new
//!   numeric scale) is retired in bronze ([`Mode::Bronze`]) and gets a new
//!   field; silver is loaded anew instead ([`Followed::reload_silver`]),
//!   as it is for a promoted column of a key of several columns, a
//!   changed primary key, or a key column's type Iceberg cannot promote
//!   ([`Mode::SilverReload`] then takes the source's key).

mod before;
mod holders;
mod plan;
mod types;

use std::collections::HashMap;

use iceberg::TableUpdate;
use iceberg::spec::{NestedField, NestedFieldRef, Schema, Type};
use iceberg::table::Table;

use self::before::with;

pub(crate) use self::holders::held_names;
use self::holders::recorded;
use self::plan::plan_schema;
use self::types::{depth_of, evolved_type, list_depth, promoted};
use crate::cdc::relation::{ColumnInfo, RelationInfo};
use crate::cdc::value::PgType;
use crate::error::{Error, ErrorKind, Result};

/// The table property that records, for each source column a table holds,
/// its attribute number and the field holding it: `attnum:field id` pairs,
/// comma-separated.
pub(crate) const ATTNUMS: &str = "wal2iceberg.attnums";
/// The OID of the source table whose numbers [`ATTNUMS`] records: those
/// of a table dropped and created again under the same name are not its.
pub(crate) const ATTNUMS_OF: &str = "wal2iceberg.attnums-of";
/// Bronze's fields added for the values of a reload whose relation was
/// ahead of bronze's stream by a retype ([`Mode::BronzeAhead`]): `old field
/// id:new field id` pairs, comma-separated. The stream's retype gives the
/// column the new field, so the reload's rows read under its name.
pub(crate) const RETYPED_AHEAD: &str = "wal2iceberg.retyped-ahead";

/// What [`follow`] changed.
#[derive(Debug, Default)]
pub(crate) struct Followed {
    /// A schema changed.
    pub(crate) changed: bool,
    /// The columns added to silver.
    pub(crate) added_to_silver: Vec<String>,
    /// Silver cannot take the change in place: its rows must be loaded
    /// anew ([`Mode::SilverReload`]). Nothing of silver was changed.
    pub(crate) reload_silver: bool,
    /// Each table's updates, in the order [`follow`] was given them.
    pub(crate) updates: Vec<Vec<TableUpdate>>,
}

/// How a table follows a relation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Bronze, at the relation's place in the stream. A column whose new
    /// type Iceberg cannot promote to is retired: its field stays, renamed
    /// `<name>__<field id>`, and the column gets a new field.
    Bronze,
    /// Bronze taking the rows of a load whose relation may be ahead of
    /// bronze's stream: new columns only, existing fields as they are but
    /// promoted; a column retyped ahead gets a waiting field
    /// `<name>__<field id>` ([`RETYPED_AHEAD`]) that the stream's retype
    /// then gives it.
    BronzeAhead,
    /// Silver taking changes: a change it cannot take in place asks for a
    /// reload ([`Followed::reload_silver`]) and changes nothing.
    Silver,
    /// Silver about to be loaded anew: a retyped column's field is
    /// replaced by a new one, and a key of several columns may change
    /// type.
    SilverReload,
}

impl Mode {
    fn silver(self) -> bool {
        matches!(self, Mode::Silver | Mode::SilverReload)
    }
}

/// The updates that bring `tables` of one source table (bronze's and
/// silver's, each in its [`Mode`], as the open batch sees them) to the
/// relation's columns, one list per table in [`Followed::updates`].
pub(crate) fn follow(tables: &[(&Table, Mode)], relation: &RelationInfo) -> Result<Followed> {
    // Everything is checked before anything is staged.
    let mut plans = Vec::new();
    for &(table, mode) in tables {
        plans.push((table, mode, plan(table, relation, mode)?));
    }
    let mut followed = Followed::default();
    for (table, mode, planned) in plans {
        let Some(evolution) = planned else {
            followed.updates.push(Vec::new());
            continue;
        };
        if evolution.reload {
            tracing::info!(
                table = %table.identifier(), changes = ?evolution.changes,
                "the table cannot take the source's schema change in place: it is loaded anew"
            );
            followed.reload_silver = true;
            followed.updates.push(Vec::new());
            continue;
        }
        if !evolution.changes.is_empty() {
            tracing::info!(
                table = %table.identifier(), changes = ?evolution.changes,
                "following the source's schema"
            );
        }
        let mut properties = HashMap::from([
            (ATTNUMS.to_owned(), evolution.attnums),
            (ATTNUMS_OF.to_owned(), relation.oid.to_string()),
        ]);
        if let Some(ahead) = evolution.retyped_ahead {
            properties.insert(RETYPED_AHEAD.to_owned(), ahead);
        }
        let record = TableUpdate::SetProperties {
            updates: properties,
        };
        if evolution.changes.is_empty() {
            // The attnum record alone, of a table written before it.
            followed.updates.push(vec![record]);
            continue;
        }
        followed.updates.push(vec![
            TableUpdate::AddSchema {
                schema: evolution.schema,
            },
            TableUpdate::SetCurrentSchema { schema_id: -1 },
            record,
        ]);
        followed.changed = true;
        if mode.silver() {
            followed.added_to_silver = evolution.added;
        }
    }
    Ok(followed)
}

/// A table's next schema and attnum record.
#[derive(Debug)]
struct Evolution {
    schema: Schema,
    attnums: String,
    /// The next [`RETYPED_AHEAD`], where the table has or needs one.
    retyped_ahead: Option<String>,
    /// What changed, for the log.
    changes: Vec<String>,
    /// The columns added.
    added: Vec<String>,
    /// [`Followed::reload_silver`]: `schema` is the table's own.
    reload: bool,
}

/// The table's next schema, or `None` when it already is the relation's.
fn plan(table: &Table, relation: &RelationInfo, mode: Mode) -> Result<Option<Evolution>> {
    let metadata = table.metadata();
    plan_schema(
        metadata.current_schema(),
        metadata.last_column_id(),
        Records {
            attnums: recorded(table, relation),
            retyped_ahead: metadata.properties().get(RETYPED_AHEAD).map(String::as_str),
        },
        relation,
        mode,
    )
}

/// What a table records of the source columns it holds: its [`ATTNUMS`]
/// (when they are of the relation's table) and [`RETYPED_AHEAD`].
#[derive(Debug, Default, Clone, Copy)]
struct Records<'a> {
    attnums: Option<&'a str>,
    retyped_ahead: Option<&'a str>,
}

/// The field that waits, ahead of the stream, for the values of `field`'s
/// column retyped to `wanted` ([`RETYPED_AHEAD`]), and the type it takes.
fn waiting_for<'a>(
    schema: &'a Schema,
    ahead: &HashMap<i32, i32>,
    field: &NestedField,
    wanted: &Type,
) -> Option<(&'a NestedFieldRef, Type)> {
    let id = ahead.get(&field.id)?;
    let waiting = schema.as_struct().fields().iter().find(|f| f.id == *id)?;
    Some((waiting, promoted(&waiting.field_type, wanted)?))
}

/// A retyped column's old field in bronze, kept under `<name>__<field id>`
/// for its history (docs/tables.md, Schema changes).
fn retire(field: &NestedFieldRef) -> NestedFieldRef {
    retire_as(field, field.id)
}

/// `field` retired under `<name>__<id>`.
fn retire_as(field: &NestedFieldRef, id: i32) -> NestedFieldRef {
    with(
        field,
        &format!("{}__{id}", field.name),
        (*field.field_type).clone(),
    )
}

/// What changed in the primary key, when it changed: silver, whose rows
/// are keyed by it, is then loaded anew ([`Mode::SilverReload`]). A
/// relation that names no key (the key dropped, or renamed in a catalog
/// that moved on since) leaves silver keyed as it is.
fn key_change(
    silver: &Schema,
    relation: &RelationInfo,
    holders: &[Option<&NestedFieldRef>],
) -> Option<String> {
    let source: Vec<&str> = relation
        .columns
        .iter()
        .filter(|c| c.is_primary_key)
        .map(|c| c.name.as_str())
        .collect();
    if source.is_empty() {
        return None;
    }
    let mut table_key: Vec<i32> = silver.identifier_field_ids().collect();
    let mut source_key: Vec<Option<i32>> = relation
        .columns
        .iter()
        .zip(holders)
        .filter(|(c, _)| c.is_primary_key)
        .map(|(_, h)| h.map(|f| f.id))
        .collect();
    table_key.sort_unstable();
    source_key.sort_unstable();
    if source_key == table_key.iter().copied().map(Some).collect::<Vec<_>>() {
        return None;
    }
    let names: Vec<&str> = table_key
        .iter()
        .filter_map(|id| silver.name_by_field_id(*id))
        .collect();
    Some(format!(
        "the primary key changed from {names:?} to {source:?}"
    ))
}

fn check_new_name(relation: &RelationInfo, column: &ColumnInfo) -> Result<()> {
    if column.name.starts_with("_cdc_") {
        return Err(unsupported(
            relation,
            format!(
                "column {:?} uses the prefix _cdc_, which wal2iceberg reserves",
                column.name
            ),
        ));
    }
    Ok(())
}

/// `relation` with each array column as deep as `schema`'s list holds it:
/// a table made when a column was declared with fewer dimensions keeps
/// its list ([`promoted`]), and a comparison with it must use that shape.
pub(crate) fn as_table_holds(relation: &RelationInfo, schema: &Schema) -> RelationInfo {
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

fn unsupported(relation: &RelationInfo, change: String) -> Error {
    Error::new(
        ErrorKind::Lake,
        format!(
            "unsupported schema change: {change}. wal2iceberg follows ADD, DROP and RENAME \
             COLUMN and type promotions; to take this change, drop the table from the lake \
             (wal2iceberg drop-table) and run again to load it afresh (docs/tables.md, Schema \
             changes)"
        ),
    )
    .with_context("table", &relation.name)
}

#[cfg(test)]
mod tests;
