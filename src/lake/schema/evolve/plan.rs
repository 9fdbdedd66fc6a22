//! A table's next schema, planned in steps: the fields that hold the
//! relation's columns (by attribute number, else by name), each held
//! field's next type or its retirement, the fields rebuilt in order, and
//! the fields added. A change silver cannot take in place ends the plan
//! with a reload instead ([`Evolution::reload`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use iceberg::spec::{NestedField, NestedFieldRef, PrimitiveType, Schema, Type};

use super::before::{Before, with};
use super::holders::{attnum_record, holders, pairs_text, parse_pairs};
use super::types::promoted;
use super::{
    Evolution, Mode, Records, check_new_name, key_change, retire, unsupported, waiting_for,
};
use crate::cdc::relation::{ColumnInfo, RelationInfo};
use crate::error::{Error, ErrorKind, Result};
use crate::lake::schema::{BEFORE, FieldIds, VERBATIM, iceberg_type, numbered_type, verbatim_type};

/// [`super::plan`] for a table of `schema`, whose highest field id ever is
/// `last_column_id`, and which records `records`.
pub(super) fn plan_schema(
    schema: &Schema,
    last_column_id: i32,
    records: Records<'_>,
    relation: &RelationInfo,
    mode: Mode,
) -> Result<Option<Evolution>> {
    let mut planner = Planner::new(schema, last_column_id, records, relation, mode);
    if matches!(mode, Mode::Bronze | Mode::BronzeAhead) {
        planner.take_up_dropped_names();
    }
    let key_change = match mode.silver() {
        true => key_change(schema, relation, &planner.holders),
        false => None,
    };
    if let Some(change) = key_change.clone().filter(|_| mode == Mode::Silver) {
        return Ok(Some(planner.reload(change)));
    }
    planner.changes.extend(key_change);
    if let Some(change) = planner.evolve_held()? {
        return Ok(Some(planner.reload(change)));
    }
    let (mut fields, new_columns) = planner.held_fields()?;
    let added = planner.add_fields(&mut fields, &new_columns)?;
    planner.finish(fields, added)
}

/// A plan underway: what is known of the table's fields so far.
struct Planner<'a> {
    schema: &'a Schema,
    last_column_id: i32,
    records: Records<'a>,
    /// [`Records::attnums`], parsed.
    recorded: Option<HashMap<i16, i32>>,
    relation: &'a RelationInfo,
    mode: Mode,
    /// The fields that wait for a retype's values ([`super::RETYPED_AHEAD`]).
    ahead: HashMap<i32, i32>,
    /// The field holding each of the relation's columns, if one does.
    holders: Vec<Option<&'a NestedFieldRef>>,
    /// Ahead of the stream: the fields whose columns need a field of their
    /// own until the stream's retype (or add) gives it them.
    waiting: Vec<(&'a NestedFieldRef, &'a ColumnInfo)>,
    /// Of the stream: the columns retyped (or added) into a field that
    /// waited for them.
    arrived: Vec<&'a ColumnInfo>,
    /// What changed, for the log.
    changes: Vec<String>,
    ids: FieldIds,
    key_ids: HashSet<i32>,
    /// A reload takes the source's key, when the relation names one: an
    /// identifier field is required, so a column that becomes one gets a
    /// new required field.
    rekeying: bool,
    /// Each held field's column and new type, by id.
    evolved: HashMap<i32, (&'a ColumnInfo, Type)>,
    /// The fields of retyped columns, which get new fields, by id.
    retyped: HashSet<i32>,
}

impl<'a> Planner<'a> {
    fn new(
        schema: &'a Schema,
        last_column_id: i32,
        records: Records<'a>,
        relation: &'a RelationInfo,
        mode: Mode,
    ) -> Planner<'a> {
        let recorded = records.attnums.map(parse_pairs::<i16>);
        Planner {
            schema,
            last_column_id,
            records,
            ahead: records
                .retyped_ahead
                .map(parse_pairs::<i32>)
                .unwrap_or_default(),
            holders: holders(schema, relation, recorded.as_ref()),
            recorded,
            relation,
            mode,
            waiting: Vec::new(),
            arrived: Vec::new(),
            changes: Vec::new(),
            ids: FieldIds::after(last_column_id),
            key_ids: schema.identifier_field_ids().collect(),
            rekeying: mode == Mode::SilverReload
                && relation.columns.iter().any(|c| c.is_primary_key),
            evolved: HashMap::new(),
            retyped: HashSet::new(),
        }
    }

    /// The table as it is, to be loaded anew for `change`.
    fn reload(&self, change: String) -> Evolution {
        Evolution {
            schema: self.schema.clone(),
            attnums: self.records.attnums.unwrap_or_default().to_owned(),
            retyped_ahead: None,
            changes: vec![change],
            added: Vec::new(),
            reload: true,
        }
    }

    /// Bronze: a column added under a dropped column's name, ahead of the
    /// stream, has its values wait in a field of their own, which the
    /// stream's add then gives it (as for a retype ahead).
    fn take_up_dropped_names(&mut self) {
        let (schema, mode) = (self.schema, self.mode);
        let held: HashSet<i32> = self.holders.iter().flatten().map(|f| f.id).collect();
        for (column, holder) in self.relation.columns.iter().zip(self.holders.iter_mut()) {
            let Some(dropped) = schema
                .as_struct()
                .field_by_name(&column.name)
                .filter(|f| holder.is_none() && !held.contains(&f.id))
            else {
                continue;
            };
            match waiting_for(schema, &self.ahead, dropped, &iceberg_type(column)) {
                Some((waited, _)) if mode == Mode::Bronze => {
                    self.ahead.remove(&dropped.id);
                    *holder = Some(waited);
                    self.arrived.push(column);
                }
                Some(_) => {}
                None if mode == Mode::BronzeAhead => self.waiting.push((dropped, column)),
                None => {}
            }
        }
    }

    /// Each held field's next type, or its retirement; the change that
    /// asks for a reload instead, if one does.
    fn evolve_held(&mut self) -> Result<Option<String>> {
        let (schema, relation, mode) = (self.schema, self.relation, self.mode);
        let rekeying = self.rekeying;
        let rekeyed = |column: &ColumnInfo, field: &NestedField| {
            rekeying && column.is_primary_key && !field.required
        };
        for (column, holder) in relation.columns.iter().zip(self.holders.iter_mut()) {
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
                    None => match waiting_for(schema, &self.ahead, field, &wanted) {
                        Some(found) => found,
                        None => {
                            self.waiting.push((field, column));
                            continue;
                        }
                    },
                };
                if wider != *field.field_type {
                    self.changes
                        .push(format!("promote {:?} to {wider}", field.name));
                    self.evolved.insert(field.id, (column, wider));
                }
                continue;
            }
            let Some(field_type) = promoted(&field.field_type, &wanted) else {
                let change = format!(
                    "retype {:?} from {} to {wanted}",
                    column.name, field.field_type
                );
                if mode == Mode::Silver {
                    return Ok(Some(change));
                }
                self.retyped.insert(field.id);
                *holder = None;
                // A reload ahead of the stream made the column's new field.
                let Some((waited, field_type)) = waiting_for(schema, &self.ahead, field, &wanted)
                else {
                    self.changes.push(change);
                    continue;
                };
                self.changes
                    .push(format!("{change}, into {:?}", waited.name));
                self.ahead.remove(&field.id);
                *holder = Some(waited);
                self.evolved.insert(waited.id, (column, field_type));
                self.arrived.push(column);
                continue;
            };
            if rekeyed(column, field) {
                self.retyped.insert(field.id);
                *holder = None;
                continue;
            }
            if field.name != column.name {
                check_new_name(relation, column)?;
                self.changes
                    .push(format!("rename {:?} to {:?}", field.name, column.name));
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
                    && self.key_ids.contains(&field.id)
                    && (self.key_ids.len() > 1 || !integer)
                {
                    return Ok(Some(change));
                }
                self.changes.push(change);
            }
            self.evolved.insert(field.id, (column, field_type));
        }
        Ok(None)
    }

    /// The table's fields in their order, each as the plan leaves it
    /// (evolved, retired, dropped from silver's current schema, or as it
    /// was); and the relation's columns that need a new field.
    fn held_fields(&mut self) -> Result<(Vec<NestedFieldRef>, Vec<&'a ColumnInfo>)> {
        let (schema, relation, mode) = (self.schema, self.relation, self.mode);
        // Names in bronze's before images, whose struct holds the source
        // columns by name: what each column's field was called.
        let old_name = |id: &i32| schema.name_by_field_id(*id);
        let by_old_name: HashMap<&str, &ColumnInfo> = self
            .evolved
            .iter()
            .filter_map(|(id, (column, _))| Some((old_name(id)?, *column)))
            .collect();
        let retired: HashSet<&str> = self.retyped.iter().filter_map(old_name).collect();
        // Ahead of bronze's stream, a name bronze still holds waits for it.
        let new_columns: Vec<&'a ColumnInfo> = relation
            .columns
            .iter()
            .zip(&self.holders)
            .filter(|(c, h)| {
                h.is_none()
                    && (mode != Mode::BronzeAhead
                        || schema.as_struct().field_by_name(&c.name).is_none())
            })
            .map(|(c, _)| c)
            .collect();
        // The names the relation's columns take: a field no column holds that
        // has one (a dropped column's, which bronze keeps) is retired.
        let taken: HashSet<&str> = self
            .evolved
            .values()
            .map(|(c, _)| c.name.as_str())
            .chain(new_columns.iter().map(|c| c.name.as_str()))
            .collect();
        let displaced = |field: &NestedField| {
            !mode.silver()
                && !field.name.starts_with("_cdc_")
                && taken.contains(field.name.as_str())
        };
        let mut fields: Vec<NestedFieldRef> = Vec::new();
        for field in schema.as_struct().fields() {
            match self.evolved.get(&field.id) {
                Some((column, field_type)) => {
                    let name = match mode {
                        Mode::BronzeAhead => &field.name,
                        _ => &column.name,
                    };
                    let mut field = with(field, name, field_type.clone());
                    if self.rekeying && !column.is_primary_key {
                        // No longer of the key: optional, as other columns are.
                        Arc::make_mut(&mut field).required = false;
                    }
                    fields.push(field)
                }
                None if self.retyped.contains(&field.id) && mode == Mode::Bronze => {
                    fields.push(retire(field));
                }
                None if displaced(field) => {
                    self.changes
                        .push(format!("retire {:?}, whose name is taken", field.name));
                    fields.push(retire(field));
                }
                None if field.name == BEFORE && !mode.silver() => {
                    let before = Before {
                        top: schema,
                        keep_names: mode == Mode::BronzeAhead,
                        by_old_name: &by_old_name,
                        retired: &retired,
                        taken: &taken,
                        new_columns: &[&new_columns[..], &self.arrived].concat(),
                    };
                    fields.push(before.evolve(field, relation, &mut self.ids)?);
                }
                None if mode.silver() && !field.name.starts_with("_cdc_") => {
                    if !self.retyped.contains(&field.id) {
                        self.changes
                            .push(format!("drop {:?} from the current schema", field.name));
                    }
                }
                None => fields.push(field.clone()),
            }
        }
        Ok((fields, new_columns))
    }

    /// New fields: one per column in `new_columns`, one for each column
    /// that waits ahead of the stream, and `_cdc_verbatim` where a table
    /// was written before it existed. The columns added.
    fn add_fields(
        &mut self,
        fields: &mut Vec<NestedFieldRef>,
        new_columns: &[&ColumnInfo],
    ) -> Result<Vec<String>> {
        let (relation, mode) = (self.relation, self.mode);
        let ids = &mut self.ids;
        let mut added = Vec::new();
        for column in new_columns {
            check_new_name(relation, column)?;
            let id = ids.take();
            let field_type = numbered_type(column, ids);
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
            self.changes.push(format!("add {:?}", column.name));
            added.push(column.name.clone());
        }
        for (field, column) in std::mem::take(&mut self.waiting) {
            let id = ids.take();
            let name = format!("{}__{id}", field.name);
            fields.push(Arc::new(NestedField::optional(
                id,
                &name,
                numbered_type(column, ids),
            )));
            self.changes.push(format!(
                "add {name:?} for the values of {:?}, retyped ahead of the stream",
                column.name
            ));
            self.ahead.insert(field.id, id);
        }
        if self.schema.as_struct().field_by_name(VERBATIM).is_none() {
            // A table written before that column existed.
            let id = ids.take();
            fields.push(Arc::new(NestedField::optional(
                id,
                VERBATIM,
                verbatim_type(ids),
            )));
            self.changes.push(format!("add {VERBATIM}"));
        }
        Ok(added)
    }

    /// The next schema of `fields`, with its attnum record; `None` when
    /// nothing changed.
    fn finish(self, fields: Vec<NestedFieldRef>, added: Vec<String>) -> Result<Option<Evolution>> {
        let relation = self.relation;
        let added_fields: Vec<NestedFieldRef> = fields
            .iter()
            .filter(|f| f.id > self.last_column_id)
            .cloned()
            .collect();
        let attnums = attnum_record(
            relation,
            &self.holders,
            &added_fields,
            self.recorded.as_ref(),
        );
        let retyped_ahead = (self.records.retyped_ahead.is_some() || !self.ahead.is_empty())
            .then(|| pairs_text(self.ahead.into_iter().collect()));
        if self.changes.is_empty()
            && self.records.attnums == Some(attnums.as_str())
            && retyped_ahead.as_deref() == self.records.retyped_ahead
        {
            return Ok(None);
        }
        let key_ids: Vec<i32> = match self.rekeying {
            true => relation
                .columns
                .iter()
                .filter(|c| c.is_primary_key)
                .filter_map(|c| fields.iter().find(|f| f.name == c.name).map(|f| f.id))
                .collect(),
            false => self.key_ids.into_iter().collect(),
        };
        let schema = Schema::builder()
            .with_schema_id(self.schema.schema_id() + 1)
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
            changes: self.changes,
            added,
            reload: false,
        }))
    }
}
