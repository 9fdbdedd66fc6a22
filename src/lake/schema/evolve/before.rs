//! Bronze's `_cdc_before` struct, which holds the source columns by
//! name, evolved with the top-level fields.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use iceberg::spec::{NestedField, NestedFieldRef, Schema, StructType, Type};

use super::{evolved_type, retire_as, unsupported};
use crate::cdc::relation::{ColumnInfo, RelationInfo};
use crate::error::Result;
use crate::lake::schema::{BEFORE, FieldIds, numbered_type};

/// What bronze's `_cdc_before` takes of an evolution, by the old names of
/// the source columns it holds.
pub(super) struct Before<'a> {
    /// The table's schema before the evolution.
    pub(super) top: &'a Schema,
    /// [`super::Mode::BronzeAhead`]: promoted, not renamed.
    pub(super) keep_names: bool,
    pub(super) by_old_name: &'a HashMap<&'a str, &'a ColumnInfo>,
    pub(super) retired: &'a HashSet<&'a str>,
    /// [`super::plan_schema`]'s names the columns take.
    pub(super) taken: &'a HashSet<&'a str>,
    pub(super) new_columns: &'a [&'a ColumnInfo],
}

impl Before<'_> {
    /// The struct with its source columns renamed, promoted, retired and
    /// added as at the top level.
    pub(super) fn evolve(
        &self,
        field: &NestedFieldRef,
        relation: &RelationInfo,
        ids: &mut FieldIds,
    ) -> Result<NestedFieldRef> {
        let Type::Struct(inner) = field.field_type.as_ref() else {
            return Err(unsupported(relation, format!("{BEFORE} is not a struct")));
        };
        let mut children = Vec::new();
        for child in inner.fields() {
            match self.by_old_name.get(child.name.as_str()) {
                Some(column) => {
                    let child_type = evolved_type(child, column, relation)?;
                    let name = match self.keep_names {
                        true => &child.name,
                        false => &column.name,
                    };
                    children.push(with(child, name, child_type));
                }
                None if self.retired.contains(child.name.as_str())
                    || (!child.name.starts_with("_cdc_")
                        && self.taken.contains(child.name.as_str())) =>
                {
                    // Under the name its top-level twin retires to, so
                    // that the two keep one name should the column come
                    // back to it (added again ahead of the stream).
                    let twin = self.top.as_struct().field_by_name(&child.name);
                    children.push(retire_as(child, twin.map_or(child.id, |f| f.id)));
                }
                None => children.push(child.clone()),
            }
        }
        for column in self.new_columns {
            let id = ids.take();
            children.push(Arc::new(NestedField::optional(
                id,
                &column.name,
                numbered_type(column, ids),
            )));
        }
        Ok(with(field, BEFORE, Type::Struct(StructType::new(children))))
    }
}

pub(super) fn with(field: &NestedFieldRef, name: &str, field_type: Type) -> NestedFieldRef {
    Arc::new(NestedField {
        name: name.to_owned(),
        field_type: Box::new(field_type),
        ..field.as_ref().clone()
    })
}
