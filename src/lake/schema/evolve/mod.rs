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
mod types;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use iceberg::TableUpdate;
use iceberg::spec::{NestedField, NestedFieldRef, PrimitiveType, Schema, Type};
use iceberg::table::Table;

use self::before::{Before, with};

pub(crate) use self::holders::held_names;
use self::holders::{attnum_record, holders, pairs_text, parse_pairs, recorded};
use self::types::{depth_of, evolved_type, list_depth, promoted};
use crate::cdc::relation::{ColumnInfo, RelationInfo};
use crate::cdc::value::PgType;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::schema::{BEFORE, FieldIds, VERBATIM, iceberg_type, numbered_type, verbatim_type};

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

/// [`plan`] for a table of `schema`, whose highest field id ever is
/// `last_column_id`, and which records `records`.
fn plan_schema(
    schema: &Schema,
    last_column_id: i32,
    records: Records<'_>,
    relation: &RelationInfo,
    mode: Mode,
) -> Result<Option<Evolution>> {
    let recorded_text = records.attnums;
    let recorded = recorded_text.map(parse_pairs::<i16>);
    let mut ahead: HashMap<i32, i32> = records
        .retyped_ahead
        .map(parse_pairs::<i32>)
        .unwrap_or_default();
    let mut holders = holders(schema, relation, recorded.as_ref());
    // A column added under a dropped column's name, ahead of the stream:
    // its values wait in a field of their own, which the stream's add then
    // gives it (as for a retype ahead).
    let mut waiting: Vec<(&NestedFieldRef, &ColumnInfo)> = Vec::new();
    let mut arrived: Vec<&ColumnInfo> = Vec::new();
    if matches!(mode, Mode::Bronze | Mode::BronzeAhead) {
        let held: HashSet<i32> = holders.iter().flatten().map(|f| f.id).collect();
        for (column, holder) in relation.columns.iter().zip(holders.iter_mut()) {
            let Some(dropped) = schema
                .as_struct()
                .field_by_name(&column.name)
                .filter(|f| holder.is_none() && !held.contains(&f.id))
            else {
                continue;
            };
            match waiting_for(schema, &ahead, dropped, &iceberg_type(column)) {
                Some((waited, _)) if mode == Mode::Bronze => {
                    ahead.remove(&dropped.id);
                    *holder = Some(waited);
                    arrived.push(column);
                }
                Some(_) => {}
                None if mode == Mode::BronzeAhead => waiting.push((dropped, column)),
                None => {}
            }
        }
    }
    let key_change = match mode.silver() {
        true => key_change(schema, relation, &holders),
        false => None,
    };
    let reload = |change: String| {
        Ok(Some(Evolution {
            schema: schema.clone(),
            attnums: recorded_text.unwrap_or_default().to_owned(),
            retyped_ahead: None,
            changes: vec![change],
            added: Vec::new(),
            reload: true,
        }))
    };
    if let Some(change) = key_change.clone().filter(|_| mode == Mode::Silver) {
        return reload(change);
    }
    let mut ids = FieldIds::after(last_column_id);
    let mut changes = Vec::from_iter(key_change);
    let key_ids: HashSet<i32> = schema.identifier_field_ids().collect();
    // A reload takes the source's key, when the relation names one: an
    // identifier field is required, so a column that becomes one gets a
    // new required field.
    let rekeying = mode == Mode::SilverReload && relation.columns.iter().any(|c| c.is_primary_key);
    let rekeyed = |column: &ColumnInfo, field: &NestedField| {
        rekeying && column.is_primary_key && !field.required
    };
    // Each held field's column and new type, by id; the fields of retyped
    // columns, which get new fields, by id.
    let mut evolved: HashMap<i32, (&ColumnInfo, Type)> = HashMap::new();
    let mut retyped: HashSet<i32> = HashSet::new();
    // Ahead of the stream: the fields that wait for a retype's values.
    // Of the stream: the columns retyped into a field that waited for them
    // (`arrived`, above).
    for (column, holder) in relation.columns.iter().zip(holders.iter_mut()) {
        let Some(field) = *holder else {
            continue;
        };
        let wanted = iceberg_type(column);
        if mode == Mode::BronzeAhead {
            // Widened ahead of the stream: the load's values need the
            // wider type, and the stream's narrower ones fit it. Retyped
            // ahead of it: they need a field of their own until the
            // stream's retype gives it the column.
            let (field, wider) = match promoted(&field.field_type, &wanted) {
                Some(wider) => (field, wider),
                None => match waiting_for(schema, &ahead, field, &wanted) {
                    Some(found) => found,
                    None => {
                        waiting.push((field, column));
                        continue;
                    }
                },
            };
            if wider != *field.field_type {
                changes.push(format!("promote {:?} to {wider}", field.name));
                evolved.insert(field.id, (column, wider));
            }
            continue;
        }
        let Some(field_type) = promoted(&field.field_type, &wanted) else {
            let change = format!(
                "retype {:?} from {} to {wanted}",
                column.name, field.field_type
            );
            if mode == Mode::Silver {
                return reload(change);
            }
            retyped.insert(field.id);
            *holder = None;
            // A reload ahead of the stream made the column's new field.
            let Some((waited, field_type)) = waiting_for(schema, &ahead, field, &wanted) else {
                changes.push(change);
                continue;
            };
            changes.push(format!("{change}, into {:?}", waited.name));
            ahead.remove(&field.id);
            *holder = Some(waited);
            evolved.insert(waited.id, (column, field_type));
            arrived.push(column);
            continue;
        };
        if rekeyed(column, field) {
            retyped.insert(field.id);
            *holder = None;
            continue;
        }
        if field.name != column.name {
            check_new_name(relation, column)?;
            changes.push(format!("rename {:?} to {:?}", field.name, column.name));
        }
        if field_type != *field.field_type {
            let change = format!("promote {:?} to {field_type}", column.name);
            // A key is encoded by its types, but for one integer column.
            let integer = matches!(
                (field.field_type.as_ref(), &field_type),
                (
                    Type::Primitive(PrimitiveType::Int),
                    Type::Primitive(PrimitiveType::Long)
                )
            );
            if mode == Mode::Silver
                && key_ids.contains(&field.id)
                && (key_ids.len() > 1 || !integer)
            {
                return reload(change);
            }
            changes.push(change);
        }
        evolved.insert(field.id, (column, field_type));
    }
    // Names in bronze's before images, whose struct holds the source
    // columns by name: what each column's field was called.
    let old_name = |id: &i32| schema.name_by_field_id(*id);
    let by_old_name: HashMap<&str, &ColumnInfo> = evolved
        .iter()
        .filter_map(|(id, (column, _))| Some((old_name(id)?, *column)))
        .collect();
    let retired: HashSet<&str> = retyped.iter().filter_map(old_name).collect();
    // Ahead of bronze's stream, a name bronze still holds waits for it.
    let new_columns: Vec<&ColumnInfo> = relation
        .columns
        .iter()
        .zip(&holders)
        .filter(|(c, h)| {
            h.is_none()
                && (mode != Mode::BronzeAhead
                    || schema.as_struct().field_by_name(&c.name).is_none())
        })
        .map(|(c, _)| c)
        .collect();
    // The names the relation's columns take: a field no column holds that
    // has one (a dropped column's, which bronze keeps) is retired.
    let taken: HashSet<&str> = evolved
        .values()
        .map(|(c, _)| c.name.as_str())
        .chain(new_columns.iter().map(|c| c.name.as_str()))
        .collect();
    let displaced = |field: &NestedField| {
        !mode.silver() && !field.name.starts_with("_cdc_") && taken.contains(field.name.as_str())
    };
    let mut fields: Vec<NestedFieldRef> = Vec::new();
    for field in schema.as_struct().fields() {
        match evolved.get(&field.id) {
            Some((column, field_type)) => {
                let name = match mode {
                    Mode::BronzeAhead => &field.name,
                    _ => &column.name,
                };
                let mut field = with(field, name, field_type.clone());
                if rekeying && !column.is_primary_key {
                    // No longer of the key: optional, as other columns are.
                    Arc::make_mut(&mut field).required = false;
                }
                fields.push(field)
            }
            None if retyped.contains(&field.id) && mode == Mode::Bronze => {
                fields.push(retire(field));
            }
            None if displaced(field) => {
                changes.push(format!("retire {:?}, whose name is taken", field.name));
                fields.push(retire(field));
            }
            None if field.name == BEFORE && !mode.silver() => {
                let before = Before {
                    top: schema,
                    keep_names: mode == Mode::BronzeAhead,
                    by_old_name: &by_old_name,
                    retired: &retired,
                    taken: &taken,
                    new_columns: &[&new_columns[..], &arrived].concat(),
                };
                fields.push(before.evolve(field, relation, &mut ids)?);
            }
            None if mode.silver() && !field.name.starts_with("_cdc_") => {
                if !retyped.contains(&field.id) {
                    changes.push(format!("drop {:?} from the current schema", field.name));
                }
            }
            None => fields.push(field.clone()),
        }
    }
    let mut added = Vec::new();
    for column in &new_columns {
        check_new_name(relation, column)?;
        let id = ids.take();
        let field_type = numbered_type(column, &mut ids);
        fields.push(Arc::new(match mode.silver() && column.is_primary_key {
            true => NestedField::required(id, &column.name, field_type),
            false => NestedField::optional(id, &column.name, field_type),
        }));
        if fields.iter().filter(|f| f.name == column.name).count() > 1 {
            return Err(unsupported(
                relation,
                format!("column {:?} would be two fields", column.name),
            ));
        }
        changes.push(format!("add {:?}", column.name));
        added.push(column.name.clone());
    }
    for (field, column) in waiting {
        let id = ids.take();
        let name = format!("{}__{id}", field.name);
        fields.push(Arc::new(NestedField::optional(
            id,
            &name,
            numbered_type(column, &mut ids),
        )));
        changes.push(format!(
            "add {name:?} for the values of {:?}, retyped ahead of the stream",
            column.name
        ));
        ahead.insert(field.id, id);
    }
    if schema.as_struct().field_by_name(VERBATIM).is_none() {
        // A table written before that column existed.
        let id = ids.take();
        fields.push(Arc::new(NestedField::optional(
            id,
            VERBATIM,
            verbatim_type(&mut ids),
        )));
        changes.push(format!("add {VERBATIM}"));
    }
    let added_fields: Vec<NestedFieldRef> = fields
        .iter()
        .filter(|f| f.id > last_column_id)
        .cloned()
        .collect();
    let attnums = attnum_record(relation, &holders, &added_fields, recorded.as_ref());
    let retyped_ahead = (records.retyped_ahead.is_some() || !ahead.is_empty())
        .then(|| pairs_text(ahead.into_iter().collect()));
    if changes.is_empty()
        && recorded_text == Some(attnums.as_str())
        && retyped_ahead.as_deref() == records.retyped_ahead
    {
        return Ok(None);
    }
    let key_ids: Vec<i32> = match rekeying {
        true => relation
            .columns
            .iter()
            .filter(|c| c.is_primary_key)
            .filter_map(|c| fields.iter().find(|f| f.name == c.name).map(|f| f.id))
            .collect(),
        false => key_ids.into_iter().collect(),
    };
    let schema = Schema::builder()
        .with_schema_id(schema.schema_id() + 1)
        .with_fields(fields)
        .with_identifier_field_ids(key_ids)
        .build()
        .map_err(|e| {
            Error::new(ErrorKind::Lake, "cannot build the table's next schema")
                .with_context("table", &relation.name)
                .with_source(e)
        })?;
    Ok(Some(Evolution {
        schema,
        attnums,
        retyped_ahead,
        changes,
        added,
        reload: false,
    }))
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
