//! Which field holds each source column: by the attribute numbers a
//! table records ([`super::ATTNUMS`]), else by name; and the record
//! itself.

use std::collections::{HashMap, HashSet};

use iceberg::spec::{NestedFieldRef, Schema};
use iceberg::table::Table;

use super::{ATTNUMS, ATTNUMS_OF, RETYPED_AHEAD, promoted, waiting_for};
use crate::cdc::relation::RelationInfo;
use crate::lake::schema::iceberg_type;

/// The table's [`ATTNUMS`] text, when it is of the relation's table.
pub(super) fn recorded<'a>(table: &'a Table, relation: &RelationInfo) -> Option<&'a str> {
    let properties = table.metadata().properties();
    let of_relation = properties
        .get(ATTNUMS_OF)
        .is_none_or(|oid| *oid == relation.oid.to_string());
    properties
        .get(ATTNUMS)
        .filter(|_| of_relation)
        .map(String::as_str)
}

/// The name of the top-level field of `table` that holds each of the
/// relation's columns, by its number where the table recorded it: a load
/// whose relation is ahead of the table's stream ([`Mode::BronzeAhead`])
/// names a column renamed since as the table does not yet, and one
/// retyped since by the field that waits for it ([`RETYPED_AHEAD`]).
pub(crate) fn held_names(table: &Table, relation: &RelationInfo) -> Vec<String> {
    let metadata = table.metadata();
    let schema = metadata.current_schema();
    let recorded = recorded(table, relation).map(parse_pairs::<i16>);
    let ahead: HashMap<i32, i32> = metadata
        .properties()
        .get(RETYPED_AHEAD)
        .map(|text| parse_pairs(text))
        .unwrap_or_default();
    let holders = holders(schema, relation, recorded.as_ref());
    let held: HashSet<&str> = holders.iter().flatten().map(|f| f.name.as_str()).collect();
    holders
        .iter()
        .zip(&relation.columns)
        .map(|(holder, column)| match holder {
            Some(field) => {
                let wanted = iceberg_type(column);
                let waiting = promoted(&field.field_type, &wanted)
                    .is_none()
                    .then(|| waiting_for(schema, &ahead, field, &wanted))
                    .flatten();
                waiting.map_or(&field.name, |(f, _)| &f.name).clone()
            }
            // The table has no field for it yet; the name is another's.
            None if held.contains(column.name.as_str()) => String::new(),
            // Added under a dropped column's name: the field waiting for it
            // ahead of the stream, not the dropped one's.
            None => match schema.as_struct().field_by_name(&column.name) {
                Some(dropped) => ahead
                    .get(&dropped.id)
                    .and_then(|id| schema.as_struct().fields().iter().find(|f| f.id == *id))
                    .map_or_else(String::new, |waiting| waiting.name.clone()),
                None => column.name.clone(),
            },
        })
        .collect()
}

/// The field that holds each of the relation's columns, `None` for a new
/// column: the one its attribute number was recorded with, else the field
/// of its name that no other column holds by number.
pub(super) fn holders<'a>(
    schema: &'a Schema,
    relation: &RelationInfo,
    recorded: Option<&HashMap<i16, i32>>,
) -> Vec<Option<&'a NestedFieldRef>> {
    let by_number: Vec<Option<&NestedFieldRef>> = relation
        .columns
        .iter()
        .map(|c| {
            let id = recorded?.get(&c.attnum?)?;
            schema.as_struct().fields().iter().find(|f| f.id == *id)
        })
        .collect();
    let claimed: HashSet<i32> = by_number.iter().flatten().map(|f| f.id).collect();
    // Fields the record gives a column number: a column of another number
    // is not theirs, whatever its name.
    let numbered: HashSet<i32> = recorded
        .into_iter()
        .flat_map(|r| r.values().copied())
        .collect();
    relation
        .columns
        .iter()
        .zip(by_number)
        .map(|(c, held)| {
            held.or_else(|| {
                // A field another column holds by number is that column's
                // (renamed); one recorded for a number no column has now
                // is a dropped column's, which a column added again under
                // its name does not continue. Without numbers, by name.
                let field = schema.as_struct().field_by_name(&c.name)?;
                let dropped = c.attnum.is_some() && numbered.contains(&field.id);
                (!claimed.contains(&field.id) && !dropped).then_some(field)
            })
        })
        .collect()
}

/// The record of [`ATTNUMS`] for the relation's columns: each held one's
/// field, or the one added for it among `added`; a column whose number is
/// unknown keeps the one `recorded` for its field.
pub(super) fn attnum_record(
    relation: &RelationInfo,
    holders: &[Option<&NestedFieldRef>],
    added: &[NestedFieldRef],
    recorded: Option<&HashMap<i16, i32>>,
) -> String {
    let pairs: Vec<(i16, i32)> = relation
        .columns
        .iter()
        .zip(holders)
        .filter_map(|(column, holder)| {
            let id = match holder {
                Some(field) => field.id,
                None => added.iter().find(|f| f.name == column.name)?.id,
            };
            let number = column.attnum.or_else(|| {
                recorded?
                    .iter()
                    .find(|(_, field)| **field == id)
                    .map(|(number, _)| *number)
            })?;
            Some((number, id))
        })
        .collect();
    // A dropped column's number, which PostgreSQL never gives another
    // column of the table, stays with its field: a column added again
    // under its name is told from it, in this batch or a later one.
    let numbers: HashSet<i16> = relation.columns.iter().filter_map(|c| c.attnum).collect();
    let ids: HashSet<i32> = pairs.iter().map(|(_, id)| *id).collect();
    let dropped: Vec<(i16, i32)> = recorded
        .into_iter()
        .flatten()
        .filter(|(number, id)| !numbers.contains(number) && !ids.contains(id))
        .map(|(number, id)| (*number, *id))
        .collect();
    pairs_text([pairs, dropped].concat())
}

/// `a:b` pairs, sorted, comma-separated: [`ATTNUMS`], [`RETYPED_AHEAD`].
pub(super) fn pairs_text<K: Ord + std::fmt::Display>(mut pairs: Vec<(K, i32)>) -> String {
    pairs.sort_unstable();
    pairs
        .iter()
        .map(|(from, id)| format!("{from}:{id}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A table's [`ATTNUMS`] (field ids by attribute number) or
/// [`RETYPED_AHEAD`] (field ids by field id).
pub(super) fn parse_pairs<K: std::str::FromStr + std::hash::Hash + Eq>(
    text: &str,
) -> HashMap<K, i32> {
    text.split(',')
        .filter_map(|pair| {
            let (from, id) = pair.split_once(':')?;
            Some((from.parse().ok()?, id.parse().ok()?))
        })
        .collect()
}
