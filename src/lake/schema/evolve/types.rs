//! A column's next type: what Iceberg promotes a held field's type to,
//! and how deep an array's lists go.

use std::sync::Arc;

use iceberg::spec::{ListType, NestedField, PrimitiveType, Type};

use super::unsupported;
use crate::cdc::relation::{ColumnInfo, RelationInfo};
use crate::cdc::value::PgType;
use crate::error::Result;
use crate::lake::schema::iceberg_type;

/// The type the field holding `column` takes: its own when the column's
/// maps to it, the column's where Iceberg promotes one to the other.
pub(super) fn evolved_type(
    field: &NestedField,
    column: &ColumnInfo,
    relation: &RelationInfo,
) -> Result<Type> {
    let wanted = iceberg_type(column);
    promoted(&field.field_type, &wanted).ok_or_else(|| {
        unsupported(
            relation,
            format!(
                "column {:?} changed type: the table holds {}, the source now sends {wanted}",
                field.name, field.field_type
            ),
        )
    })
}

/// `held`, promoted where `wanted` is wider, kept where it is narrower
/// (its values fit; a column narrowed at the source, or a relation of an
/// earlier point than the table's schema); `None` where Iceberg cannot
/// hold one as the other. Lists compare by their innermost elements: a
/// table made before multi-dimensional arrays became nested lists keeps
/// its list, and holds the values of more dimensions verbatim.
pub(super) fn promoted(held: &Type, wanted: &Type) -> Option<Type> {
    use PrimitiveType::{Decimal, Double, Float, Int, Long};
    match (held, wanted) {
        (Type::List(list), Type::List(_)) => {
            let element = &list.element_field;
            let inner = match element.field_type.as_ref() {
                Type::List(_) => promoted(&element.field_type, wanted)?,
                t => promoted(t, innermost(wanted))?,
            };
            Some(Type::List(ListType::new(Arc::new(NestedField {
                field_type: Box::new(inner),
                ..element.as_ref().clone()
            }))))
        }
        (Type::Primitive(a), Type::Primitive(b)) => {
            let wider = match (a, b) {
                _ if a == b => a,
                (Int, Long) | (Float, Double) => b,
                (Long, Int) | (Double, Float) => a,
                (
                    Decimal {
                        precision: p,
                        scale: s,
                    },
                    Decimal {
                        precision: q,
                        scale: t,
                    },
                ) if s == t => {
                    if q > p {
                        b
                    } else {
                        a
                    }
                }
                _ => return None,
            };
            Some(Type::Primitive(wider.clone()))
        }
        _ => None,
    }
}

pub(super) fn list_depth(t: &Type) -> usize {
    match t {
        Type::List(list) => 1 + list_depth(&list.element_field.field_type),
        _ => 0,
    }
}

pub(super) fn depth_of(t: &PgType) -> usize {
    match t {
        PgType::Array(inner) => 1 + depth_of(inner),
        _ => 0,
    }
}

pub(super) fn innermost(t: &Type) -> &Type {
    match t {
        Type::List(list) => innermost(&list.element_field.field_type),
        t => t,
    }
}
