use iceberg::spec::PrimitiveType;

use super::*;
use crate::cdc::relation::fixtures::{column, relation, typmod};
use crate::cdc::value::PgType;
use crate::lake::schema::{BEFORE, VERBATIM, bronze_schema, iceberg_type, silver_schema};

mod lists;

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
fn made(mode: Mode) -> (Schema, String) {
    let schema = match mode {
        Mode::Bronze | Mode::BronzeAhead => bronze_schema(&base()),
        _ => silver_schema(&base()),
    }
    .unwrap();
    let evolution = plan_schema(
        &schema,
        schema.highest_field_id(),
        Records::default(),
        &base(),
        mode,
    )
    .unwrap()
    .expect("a first follow records the numbers");
    assert!(evolution.changes.is_empty(), "{:?}", evolution.changes);
    (schema, evolution.attnums)
}

/// A table's records: these attnums, nothing retyped ahead.
fn recording(attnums: &str) -> Records<'_> {
    Records {
        attnums: Some(attnums),
        retyped_ahead: None,
    }
}

fn next(mode: Mode, relation: &RelationInfo) -> Result<Option<Evolution>> {
    let (schema, attnums) = made(mode);
    plan_schema(
        &schema,
        schema.highest_field_id(),
        recording(&attnums),
        relation,
        mode,
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
    for mode in [Mode::Bronze, Mode::Silver] {
        assert!(next(mode, &base()).unwrap().is_none(), "{mode:?}");
    }
}

#[test]
fn a_rename_keeps_the_field_id_at_every_level() {
    let mut renamed = base();
    renamed.columns[2].name = "total".into();
    for mode in [Mode::Bronze, Mode::Silver] {
        let (old, _) = made(mode);
        let new = next(mode, &renamed).unwrap().unwrap().schema;
        assert_eq!(
            field(&new, "total").id,
            field(&old, "amount").id,
            "{mode:?}"
        );
        assert!(new.as_struct().field_by_name("amount").is_none());
        assert_eq!(
            new.highest_field_id(),
            old.highest_field_id(),
            "no new field"
        );
    }
    let (old, _) = made(Mode::Bronze);
    let new = next(Mode::Bronze, &renamed).unwrap().unwrap().schema;
    assert_eq!(
        before_field(&new, "total").id,
        before_field(&old, "amount").id
    );
    // Two columns that swapped names keep their fields.
    let mut swapped = base();
    swapped.columns[1].name = "amount".into();
    swapped.columns[2].name = "tags".into();
    let new = next(Mode::Silver, &swapped).unwrap().unwrap().schema;
    let (old, _) = made(Mode::Silver);
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
        Records::default(),
        &renamed,
        Mode::Bronze,
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
    let new = next(Mode::Bronze, &widened).unwrap().unwrap().schema;
    let (old, _) = made(Mode::Bronze);
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
    next(Mode::Silver, &widened).unwrap().unwrap();

    // Narrowed, the column keeps its wider type: its values fit.
    let mut narrowed = base();
    narrowed.columns[2].type_modifier = typmod(10, 2);
    assert!(next(Mode::Silver, &narrowed).unwrap().is_none());
}

#[test]
fn a_retyped_column_is_retired_in_bronze_and_asks_silver_for_a_reload() {
    let retypes = |edit: &dyn Fn(&mut ColumnInfo)| {
        let mut relation = base();
        edit(&mut relation.columns[2]);
        relation
    };
    let rescaled = retypes(&|c| c.type_modifier = typmod(14, 3));
    let to_text = retypes(&|c| c.pg_type = PgType::Text);
    let to_list = retypes(&|c| c.pg_type = PgType::Array(Box::new(PgType::Int4)));
    for relation in [&rescaled, &to_text, &to_list] {
        let (old, _) = made(Mode::Bronze);
        let bronze = next(Mode::Bronze, relation).unwrap().unwrap();
        let old_id = field(&old, "amount").id;
        let kept = field(&bronze.schema, &format!("amount__{old_id}"));
        assert_eq!(kept.id, old_id, "the old field keeps its id and type");
        assert_eq!(kept.field_type, field(&old, "amount").field_type);
        let new = field(&bronze.schema, "amount");
        assert!(new.id > old.highest_field_id(), "{:?}", bronze.changes);
        assert_eq!(
            new.field_type.to_string(),
            iceberg_type(&relation.columns[2]).to_string()
        );
        // Inside the before image, under the name of its top-level twin.
        let before_old = before_field(&old, "amount").id;
        assert_eq!(
            before_field(&bronze.schema, &format!("amount__{old_id}")).id,
            before_old
        );
        assert!(bronze.attnums.contains(&format!("3:{}", new.id)));

        let silver = next(Mode::Silver, relation).unwrap().unwrap();
        assert!(silver.reload, "{:?}", silver.changes);
        let (old, attnums) = made(Mode::Silver);
        assert_eq!(
            silver.schema, old,
            "silver is not changed before its reload"
        );
        let reloaded = plan_schema(
            &old,
            old.highest_field_id(),
            recording(&attnums),
            relation,
            Mode::SilverReload,
        )
        .unwrap()
        .unwrap();
        let new = field(&reloaded.schema, "amount");
        assert!(new.id > old.highest_field_id());
        assert_eq!(
            reloaded.schema.as_struct().fields().len(),
            old.as_struct().fields().len()
        );
    }
}

#[test]
fn a_changed_or_retyped_key_reloads_silver_under_the_new_key() {
    let reload = |relation: &RelationInfo| {
        let planned = next(Mode::Silver, relation).unwrap().unwrap();
        assert!(planned.reload, "{:?}", planned.changes);
        planned.changes
    };
    let (old, _) = made(Mode::Silver);
    let mut rekeyed = base();
    rekeyed.columns[0].is_primary_key = false;
    rekeyed.columns[2].is_primary_key = true;
    assert!(reload(&rekeyed)[0].contains("primary key changed"));
    // The reload's schema: `amount`, optional until now, gets a new
    // required field; `id` is no longer required.
    let reloaded = next(Mode::SilverReload, &rekeyed).unwrap().unwrap();
    let amount = field(&reloaded.schema, "amount");
    assert!(amount.required && amount.id > old.highest_field_id());
    assert!(!field(&reloaded.schema, "id").required);
    assert_eq!(
        reloaded.schema.identifier_field_ids().collect::<Vec<_>>(),
        [amount.id]
    );

    let mut key_retyped = base();
    key_retyped.columns[0].pg_type = PgType::Text;
    assert!(reload(&key_retyped)[0].contains("retype \"id\""));
    let reloaded = next(Mode::SilverReload, &key_retyped).unwrap().unwrap();
    let id = field(&reloaded.schema, "id");
    assert_eq!(*id.field_type, Type::Primitive(PrimitiveType::String));
    assert!(id.required && id.id > old.highest_field_id());
    assert_eq!(
        reloaded.schema.identifier_field_ids().collect::<Vec<_>>(),
        [id.id]
    );

    // A relation naming no key (a catalog that moved on from a renamed
    // key column) keeps silver keyed as it is.
    let mut unnamed = base();
    unnamed.columns[0].is_primary_key = false;
    assert!(next(Mode::Silver, &unnamed).unwrap().is_none());
}

#[test]
fn reserved_names_are_refused_with_what_changed() {
    let refused = |relation: RelationInfo| next(Mode::Silver, &relation).unwrap_err().to_string();
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
    let (old_silver, _) = made(Mode::Silver);
    let silver = next(Mode::Silver, &changed).unwrap().unwrap();
    assert_eq!(silver.added, ["note"]);
    assert!(silver.schema.as_struct().field_by_name("tags").is_none());
    let note = field(&silver.schema, "note");
    assert!(!note.required);
    assert!(note.id > old_silver.highest_field_id());
    assert!(
        silver.schema.highest_field_id() > note.id,
        "its element too"
    );

    let bronze = next(Mode::Bronze, &changed).unwrap().unwrap().schema;
    assert!(
        bronze.as_struct().field_by_name("tags").is_some(),
        "history"
    );
    assert_ne!(before_field(&bronze, "note").id, field(&bronze, "note").id);
}

#[test]
fn a_column_dropped_and_added_again_under_its_name_gets_a_new_field() {
    // DROP COLUMN amount; ADD COLUMN amount numeric(12,2): another column
    // number, so another column, whose rows before read null.
    let mut again = base();
    again.columns[2].attnum = Some(4);
    let (old, _) = made(Mode::Silver);
    let old_amount = field(&old, "amount").id;
    let silver = next(Mode::Silver, &again).unwrap().unwrap();
    let new_amount = field(&silver.schema, "amount").id;
    assert!(new_amount > old.highest_field_id(), "{:?}", silver.changes);
    assert!(silver.attnums.contains(&format!("4:{new_amount}")));
    // The dropped column's number stays with its field: PostgreSQL never
    // gives it to another column.
    assert!(silver.attnums.contains(&format!("3:{old_amount}")));
    assert_eq!(silver.added, ["amount"]);
    // Bronze keeps the dropped column's history under a retired name.
    let (old_bronze, _) = made(Mode::Bronze);
    let old_amount = field(&old_bronze, "amount").id;
    let bronze = next(Mode::Bronze, &again).unwrap().unwrap().schema;
    assert_eq!(
        field(&bronze, &format!("amount__{old_amount}")).id,
        old_amount
    );
    assert!(field(&bronze, "amount").id > old_bronze.highest_field_id());
    // The drop and the add followed one at a time (two ALTERs of one
    // transaction): the record the drop left still tells them apart.
    let mut dropped = base();
    dropped.columns.remove(2);
    let (schema, attnums) = made(Mode::Bronze);
    let after_drop = plan_schema(
        &schema,
        schema.highest_field_id(),
        recording(&attnums),
        &dropped,
        Mode::Bronze,
    )
    .unwrap();
    assert!(
        after_drop.is_none(),
        "bronze keeps the field and its number"
    );
    let after_add = plan_schema(
        &schema,
        schema.highest_field_id(),
        recording(&attnums),
        &again,
        Mode::Bronze,
    )
    .unwrap()
    .unwrap()
    .schema;
    assert_eq!(
        field(&after_add, &format!("amount__{old_amount}")).id,
        old_amount
    );
    // Without column numbers, by name: the field continues.
    let mut unnumbered = again.clone();
    unnumbered.columns[2].attnum = None;
    let by_name = next(Mode::Silver, &unnumbered).unwrap();
    assert!(by_name.is_none_or(|e| field(&e.schema, "amount").id == field(&old, "amount").id));
    // A rename, then a new column under the old name: the field stays with
    // the renamed column.
    let mut reused = base();
    reused.columns[2].name = "total".into();
    reused
        .columns
        .push(column("amount", PgType::Text, -1, false));
    reused.columns[3].attnum = Some(4);
    let new = next(Mode::Silver, &reused).unwrap().unwrap().schema;
    assert_eq!(field(&new, "total").id, field(&old, "amount").id);
    assert!(field(&new, "amount").id > old.highest_field_id());
}

#[test]
fn a_promoted_column_of_a_key_of_several_columns_reloads_silver() {
    let two = |t: PgType| {
        numbered(relation(vec![
            column("a", PgType::Int4, -1, true),
            column("b", t, -1, true),
        ]))
    };
    let schema = silver_schema(&two(PgType::Int4)).unwrap();
    let attnums = plan_schema(
        &schema,
        10,
        Records::default(),
        &two(PgType::Int4),
        Mode::Silver,
    )
    .unwrap()
    .unwrap()
    .attnums;
    let plan = |mode| {
        plan_schema(&schema, 10, recording(&attnums), &two(PgType::Int8), mode)
            .unwrap()
            .unwrap()
    };
    assert!(
        plan(Mode::Silver).reload,
        "a key of several columns is encoded by its types"
    );
    let reloaded = plan(Mode::SilverReload);
    assert!(!reloaded.reload);
    assert_eq!(
        *field(&reloaded.schema, "b").field_type,
        Type::Primitive(PrimitiveType::Long)
    );
}

#[test]
fn a_rename_to_a_dropped_columns_name_retires_the_dropped_field_in_bronze() {
    // DROP COLUMN amount; RENAME COLUMN tags TO amount.
    let mut relation = base();
    relation.columns.remove(2);
    relation.columns[1].name = "amount".into();
    let (old, _) = made(Mode::Bronze);
    let bronze = next(Mode::Bronze, &relation).unwrap().unwrap();
    let old_amount = field(&old, "amount").id;
    assert_eq!(field(&bronze.schema, "amount").id, field(&old, "tags").id);
    assert_eq!(
        field(&bronze.schema, &format!("amount__{old_amount}")).id,
        old_amount
    );
    let before = before_field(&old, "amount").id;
    assert_eq!(
        before_field(&bronze.schema, &format!("amount__{old_amount}")).id,
        before
    );
    let silver = next(Mode::Silver, &relation).unwrap().unwrap().schema;
    assert_eq!(
        field(&silver, "amount").id,
        made(Mode::Silver)
            .0
            .as_struct()
            .field_by_name("tags")
            .unwrap()
            .id
    );
}

#[test]
fn ahead_of_its_stream_bronze_records_no_number_for_a_column_it_did_not_add() {
    // RENAME tags TO labels; ADD COLUMN tags: bronze still calls the field
    // of `labels` tags, so the new column waits for the stream.
    let mut relation = base();
    relation.columns[1].name = "labels".into();
    let mut tags = column("tags", PgType::Text, -1, false);
    tags.attnum = Some(4);
    relation.columns.push(tags);
    let ahead = next(Mode::BronzeAhead, &relation).unwrap();
    assert!(
        ahead.as_ref().is_none_or(|e| !e.attnums.contains("4:")),
        "{ahead:?}"
    );
}

#[test]
fn a_single_key_column_other_than_an_integer_reloads_silver_when_promoted() {
    let keyed = |t: PgType, modifier: i32| numbered(relation(vec![column("k", t, modifier, true)]));
    let plan = |from: &RelationInfo, to: &RelationInfo| {
        let schema = silver_schema(from).unwrap();
        let attnums = plan_schema(&schema, 10, Records::default(), from, Mode::Silver)
            .unwrap()
            .unwrap()
            .attnums;
        plan_schema(&schema, 10, recording(&attnums), to, Mode::Silver)
            .unwrap()
            .unwrap()
    };
    let decimal = plan(
        &keyed(PgType::Numeric, typmod(10, 2)),
        &keyed(PgType::Numeric, typmod(12, 2)),
    );
    assert!(decimal.reload, "a decimal key is encoded by its type");
    let integer = plan(&keyed(PgType::Int4, -1), &keyed(PgType::Int8, -1));
    assert!(!integer.reload, "an integer key's encoding is the same");
}

#[test]
fn ahead_of_its_stream_bronze_takes_promotions_but_keeps_its_names() {
    // RENAME amount TO total; ALTER total TYPE numeric(20,2).
    let mut relation = base();
    relation.columns[2].name = "total".into();
    relation.columns[2].type_modifier = typmod(20, 2);
    let ahead = next(Mode::BronzeAhead, &relation).unwrap().unwrap();
    let wider = Type::Primitive(PrimitiveType::Decimal {
        precision: 20,
        scale: 2,
    });
    assert_eq!(*field(&ahead.schema, "amount").field_type, wider);
    assert_eq!(*before_field(&ahead.schema, "amount").field_type, wider);
    assert!(ahead.schema.as_struct().field_by_name("total").is_none());
}

#[test]
fn a_retype_ahead_of_the_stream_waits_in_a_field_the_streams_retype_then_takes() {
    // ALTER amount TYPE numeric(12,4), seen first by a reload's snapshot.
    let mut retyped = base();
    retyped.columns[2].type_modifier = typmod(12, 4);
    let wanted = Type::Primitive(PrimitiveType::Decimal {
        precision: 12,
        scale: 4,
    });
    let (made, attnums) = made(Mode::Bronze);
    let old = field(&made, "amount").id;
    let ahead = plan_schema(
        &made,
        made.highest_field_id(),
        recording(&attnums),
        &retyped,
        Mode::BronzeAhead,
    )
    .unwrap()
    .unwrap();
    let waiting = ahead
        .schema
        .as_struct()
        .fields()
        .iter()
        .find(|f| f.id > made.highest_field_id() && f.name != VERBATIM)
        .expect("a field waits for the reload's values")
        .clone();
    assert_eq!(waiting.name, format!("amount__{}", waiting.id));
    assert_eq!(*waiting.field_type, wanted);
    assert_eq!(
        field(&ahead.schema, "amount").id,
        old,
        "the stream's field stays"
    );
    let record = ahead
        .retyped_ahead
        .clone()
        .expect("the waiting field is recorded");
    assert_eq!(record, format!("{old}:{}", waiting.id));
    assert_eq!(
        ahead.attnums, attnums,
        "the numbers still name the old field"
    );

    // The stream reaches the retype: the column takes the waiting field.
    let stream = plan_schema(
        &ahead.schema,
        ahead.schema.highest_field_id(),
        Records {
            attnums: Some(&ahead.attnums),
            retyped_ahead: Some(&record),
        },
        &retyped,
        Mode::Bronze,
    )
    .unwrap()
    .unwrap();
    assert_eq!(field(&stream.schema, "amount").id, waiting.id);
    assert_eq!(*field(&stream.schema, "amount").field_type, wanted);
    assert_eq!(
        field(&stream.schema, &format!("amount__{old}")).id,
        old,
        "the old field is retired"
    );
    assert!(
        stream
            .schema
            .as_struct()
            .field_by_name(&waiting.name)
            .is_none()
    );
    assert_eq!(*before_field(&stream.schema, "amount").field_type, wanted);
    assert_eq!(stream.retyped_ahead.as_deref(), Some(""));
    assert!(stream.attnums.contains(&format!("3:{}", waiting.id)));
    assert_eq!(
        stream.schema.highest_field_id(),
        ahead.schema.highest_field_id() + 1
    );
}
