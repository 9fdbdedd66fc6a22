use super::*;
use crate::cdc::relation::fixtures::{column, relation, typmod};
use crate::cdc::value::PgType;
use crate::lake::schema::{bronze_schema, silver_schema};

/// `public.customers (id int4 key, tags text[], amount numeric(12,2))`,
/// columns numbered from 1.
fn base() -> RelationInfo {
    numbered(relation(vec![
        column("id", PgType::Int4, -1, true),
        column("tags", PgType::Array(Box::new(PgType::Text)), -1, false),
        column("amount", PgType::Numeric, typmod(12, 2), false),
    ]))
}

fn numbered(mut relation: RelationInfo) -> RelationInfo {
    for (i, c) in relation.columns.iter_mut().enumerate() {
        c.attnum = Some(i as i16 + 1);
    }
    relation
}

/// A table made from `base()` and followed once, so that it records its
/// columns' numbers.
fn made(role: Role) -> (Schema, String) {
    let schema = match role {
        Role::Bronze => bronze_schema(&base()),
        Role::Silver => silver_schema(&base()),
    }
    .unwrap();
    let evolution = plan_schema(&schema, schema.highest_field_id(), None, &base(), role)
        .unwrap()
        .expect("a first follow records the numbers");
    assert!(evolution.changes.is_empty(), "{:?}", evolution.changes);
    (schema, evolution.attnums)
}

fn next(role: Role, relation: &RelationInfo) -> Result<Option<Evolution>> {
    let (schema, attnums) = made(role);
    plan_schema(
        &schema,
        schema.highest_field_id(),
        Some(&attnums),
        relation,
        role,
    )
}

fn field<'a>(schema: &'a Schema, name: &str) -> &'a NestedField {
    schema.as_struct().field_by_name(name).expect(name)
}

fn before_field(schema: &Schema, name: &str) -> NestedField {
    let Type::Struct(before) = field(schema, BEFORE).field_type.as_ref() else {
        panic!("{BEFORE} is a struct")
    };
    before.field_by_name(name).expect(name).as_ref().clone()
}

#[test]
fn the_same_columns_change_nothing() {
    for role in [Role::Bronze, Role::Silver] {
        assert!(next(role, &base()).unwrap().is_none(), "{role:?}");
    }
}

#[test]
fn a_rename_keeps_the_field_id_at_every_level() {
    let mut renamed = base();
    renamed.columns[2].name = "total".into();
    for role in [Role::Bronze, Role::Silver] {
        let (old, _) = made(role);
        let new = next(role, &renamed).unwrap().unwrap().schema;
        assert_eq!(
            field(&new, "total").id,
            field(&old, "amount").id,
            "{role:?}"
        );
        assert!(new.as_struct().field_by_name("amount").is_none());
        assert_eq!(
            new.highest_field_id(),
            old.highest_field_id(),
            "no new field"
        );
    }
    let (old, _) = made(Role::Bronze);
    let new = next(Role::Bronze, &renamed).unwrap().unwrap().schema;
    assert_eq!(
        before_field(&new, "total").id,
        before_field(&old, "amount").id
    );
    // Two columns that swapped names keep their fields.
    let mut swapped = base();
    swapped.columns[1].name = "amount".into();
    swapped.columns[2].name = "tags".into();
    let new = next(Role::Silver, &swapped).unwrap().unwrap().schema;
    let (old, _) = made(Role::Silver);
    assert_eq!(field(&new, "tags").id, field(&old, "amount").id);
}

#[test]
fn without_a_record_a_rename_is_a_drop_and_an_add() {
    let mut renamed = base();
    renamed.columns[2].name = "total".into();
    let schema = bronze_schema(&base()).unwrap();
    let evolution = plan_schema(
        &schema,
        schema.highest_field_id(),
        None,
        &renamed,
        Role::Bronze,
    )
    .unwrap()
    .unwrap();
    assert_eq!(evolution.added, ["total"]);
    assert!(
        evolution
            .schema
            .as_struct()
            .field_by_name("amount")
            .is_some()
    );
}

#[test]
fn promotions_keep_the_field_and_widen_its_type() {
    let mut widened = base();
    widened.columns[0].pg_type = PgType::Int8;
    widened.columns[2].type_modifier = typmod(20, 2);
    let new = next(Role::Bronze, &widened).unwrap().unwrap().schema;
    let (old, _) = made(Role::Bronze);
    assert_eq!(field(&new, "id").id, field(&old, "id").id);
    assert_eq!(
        *field(&new, "id").field_type,
        Type::Primitive(PrimitiveType::Long)
    );
    assert_eq!(
        *before_field(&new, "amount").field_type,
        Type::Primitive(PrimitiveType::Decimal {
            precision: 20,
            scale: 2
        })
    );
    // A single-column key may widen: its encoding does not change.
    next(Role::Silver, &widened).unwrap().unwrap();

    // Narrowed, the column keeps its wider type: its values fit.
    let mut narrowed = base();
    narrowed.columns[2].type_modifier = typmod(10, 2);
    assert!(next(Role::Silver, &narrowed).unwrap().is_none());
}

#[test]
fn changes_iceberg_cannot_hold_in_place_are_refused_with_what_changed() {
    let refused = |relation: RelationInfo| next(Role::Silver, &relation).unwrap_err().to_string();
    let mut rescaled = base();
    rescaled.columns[2].type_modifier = typmod(14, 3);
    let err = refused(rescaled);
    assert!(
        err.contains("\"amount\" changed type") && err.contains("decimal(12, 2)"),
        "{err}"
    );
    let mut element = base();
    element.columns[1].pg_type = PgType::Array(Box::new(PgType::Int4));
    refused(element);
    let mut scalar = base();
    scalar.columns[1].pg_type = PgType::Text;
    refused(scalar);
    let mut rekeyed = base();
    rekeyed.columns[2].is_primary_key = true;
    let err = refused(rekeyed);
    assert!(err.contains("primary key changed"), "{err}");
    let mut reserved = base();
    reserved
        .columns
        .push(column("_cdc_extra", PgType::Text, -1, false));
    refused(numbered(reserved));
    let mut renamed_reserved = base();
    renamed_reserved.columns[2].name = "_cdc_amount".into();
    let err = refused(renamed_reserved);
    assert!(err.contains("reserves"), "{err}");
}

#[test]
fn added_columns_get_new_ids_and_dropped_ones_leave_silver_only() {
    let mut changed = base();
    changed.columns.remove(1);
    changed.columns.push(column(
        "note",
        PgType::Array(Box::new(PgType::Text)),
        -1,
        false,
    ));
    changed.columns[2].attnum = Some(4);
    let (old_silver, _) = made(Role::Silver);
    let silver = next(Role::Silver, &changed).unwrap().unwrap();
    assert_eq!(silver.added, ["note"]);
    assert!(silver.schema.as_struct().field_by_name("tags").is_none());
    let note = field(&silver.schema, "note");
    assert!(!note.required);
    assert!(note.id > old_silver.highest_field_id());
    assert!(
        silver.schema.highest_field_id() > note.id,
        "its element too"
    );

    let bronze = next(Role::Bronze, &changed).unwrap().unwrap().schema;
    assert!(
        bronze.as_struct().field_by_name("tags").is_some(),
        "history"
    );
    assert_ne!(before_field(&bronze, "note").id, field(&bronze, "note").id);
}

#[test]
fn a_column_dropped_and_added_again_under_its_name_continues_its_field() {
    let mut again = base();
    again.columns[2].attnum = Some(4);
    let (old, _) = made(Role::Silver);
    let evolution = next(Role::Silver, &again).unwrap().unwrap();
    assert!(evolution.changes.is_empty(), "{:?}", evolution.changes);
    assert_eq!(
        field(&evolution.schema, "amount").id,
        field(&old, "amount").id
    );
    assert!(
        evolution
            .attnums
            .contains(&format!("4:{}", field(&old, "amount").id))
    );
    // A rename, then a new column under the old name: the field stays with
    // the renamed column.
    let mut reused = base();
    reused.columns[2].name = "total".into();
    reused
        .columns
        .push(column("amount", PgType::Text, -1, false));
    reused.columns[3].attnum = Some(4);
    let new = next(Role::Silver, &reused).unwrap().unwrap().schema;
    assert_eq!(field(&new, "total").id, field(&old, "amount").id);
    assert!(field(&new, "amount").id > old.highest_field_id());
}

#[test]
fn a_promoted_column_of_a_key_of_several_columns_is_refused() {
    let two = |t: PgType| {
        numbered(relation(vec![
            column("a", PgType::Int4, -1, true),
            column("b", t, -1, true),
        ]))
    };
    let schema = silver_schema(&two(PgType::Int4)).unwrap();
    let attnums = plan_schema(&schema, 10, None, &two(PgType::Int4), Role::Silver)
        .unwrap()
        .unwrap()
        .attnums;
    let err = plan_schema(
        &schema,
        10,
        Some(&attnums),
        &two(PgType::Int8),
        Role::Silver,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("several columns"), "{err}");
}

#[test]
fn a_list_of_other_depth_of_the_same_elements_is_no_type_change() {
    let mut deeper = base();
    deeper.columns[1].pg_type = PgType::Array(Box::new(PgType::Array(Box::new(PgType::Text))));
    assert!(next(Role::Silver, &deeper).unwrap().is_none());
    deeper.columns[1].pg_type = PgType::Array(Box::new(PgType::Array(Box::new(PgType::Int4))));
    assert!(next(Role::Silver, &deeper).is_err());
}

#[test]
fn a_relation_is_compared_at_the_list_depth_its_table_holds() {
    let silver = silver_schema(&base()).unwrap();
    let mut deeper = base();
    deeper.columns[1].pg_type = PgType::Array(Box::new(PgType::Array(Box::new(PgType::Text))));
    let held = as_table_holds(&deeper, &silver);
    assert_eq!(held.columns[1].pg_type, base().columns[1].pg_type);
    let nested = silver_schema(&deeper).unwrap();
    assert_eq!(as_table_holds(&deeper, &nested).columns, deeper.columns);
}

#[test]
fn nested_lists_of_several_columns_keep_their_fields() {
    let list = |t: PgType, depth: usize| (0..depth).fold(t, |t, _| PgType::Array(Box::new(t)));
    let grids = numbered(relation(vec![
        column("id", PgType::Int4, -1, true),
        column("g", list(PgType::Int4, 2), -1, false),
        column("t", list(PgType::Text, 3), -1, false),
        column("n", list(PgType::Numeric, 2), typmod(12, 2), false),
    ]));
    for role in [Role::Bronze, Role::Silver] {
        let schema = match role {
            Role::Bronze => bronze_schema(&grids),
            Role::Silver => silver_schema(&grids),
        }
        .unwrap();
        let attnums = plan_schema(&schema, schema.highest_field_id(), None, &grids, role)
            .unwrap()
            .unwrap()
            .attnums;
        let planned = plan_schema(
            &schema,
            schema.highest_field_id(),
            Some(&attnums),
            &grids,
            role,
        )
        .unwrap();
        assert!(planned.is_none(), "{role:?}: {attnums} {planned:?}");
    }
}
