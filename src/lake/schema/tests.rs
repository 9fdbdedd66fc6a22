use super::*;
use crate::cdc::relation::fixtures::{column, relation, typmod};

fn field_names(schema: &Schema) -> Vec<&str> {
    schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.as_str())
        .collect()
}

fn customers() -> RelationInfo {
    relation(vec![
        column("id", PgType::Int4, -1, true),
        column("name", PgType::Text, -1, false),
        column("amount", PgType::Numeric, typmod(12, 2), false),
        column("tags", PgType::Array(Box::new(PgType::Text)), -1, false),
    ])
}

#[test]
fn numeric_type_modifiers_decode_to_decimal_only_when_iceberg_can_hold_them() {
    assert_eq!(numeric_precision_scale(typmod(10, 2)), Some((10, 2)));
    assert_eq!(numeric_precision_scale(typmod(38, 0)), Some((38, 0)));
    assert_eq!(numeric_precision_scale(typmod(39, 2)), None, "too precise");
    assert_eq!(numeric_precision_scale(typmod(60, 20)), None);
    assert_eq!(
        numeric_precision_scale(typmod(5, -2)),
        None,
        "negative scale"
    );
    assert_eq!(
        numeric_precision_scale(typmod(2, 5)),
        None,
        "scale above precision"
    );
    assert_eq!(numeric_precision_scale(-1), None, "no modifier");
}

#[test]
fn types_map_as_documented() {
    let prim = |t: PgType, m: i32| iceberg_type(&column("c", t, m, false));
    assert_eq!(prim(PgType::Int2, -1), Type::Primitive(PrimitiveType::Int));
    assert_eq!(prim(PgType::Int8, -1), Type::Primitive(PrimitiveType::Long));
    assert_eq!(
        prim(PgType::Float4, -1),
        Type::Primitive(PrimitiveType::Float)
    );
    assert_eq!(
        prim(PgType::Numeric, typmod(12, 2)),
        Type::Primitive(PrimitiveType::Decimal {
            precision: 12,
            scale: 2
        })
    );
    assert_eq!(
        prim(PgType::Numeric, -1),
        Type::Primitive(PrimitiveType::String)
    );
    assert_eq!(
        prim(PgType::TimestampTz, -1),
        Type::Primitive(PrimitiveType::Timestamptz)
    );
    assert_eq!(
        prim(PgType::Interval, -1),
        Type::Primitive(PrimitiveType::String)
    );
    assert_eq!(
        prim(PgType::Bytea, -1),
        Type::Primitive(PrimitiveType::Binary)
    );
    let Type::List(list) = prim(
        PgType::Array(Box::new(PgType::Array(Box::new(PgType::Int4)))),
        -1,
    ) else {
        panic!("arrays are lists")
    };
    assert!(
        matches!(*list.element_field.field_type, Type::List(_)),
        "two dimensions, two lists"
    );
}

#[test]
fn silver_has_the_source_columns_then_position_and_the_key_as_identifier() {
    let schema = silver_schema(&customers()).unwrap();
    let names = field_names(&schema);
    assert_eq!(
        names,
        [
            "id", "name", "amount", "tags", COMMIT_LSN, COMMIT_TS, VERBATIM
        ]
    );
    let id = schema.field_by_name("id").unwrap();
    assert!(id.required);
    assert_eq!(
        schema.identifier_field_ids().collect::<Vec<_>>(),
        vec![id.id]
    );
    assert!(!schema.field_by_name("name").unwrap().required);
}

#[test]
fn bronze_has_change_columns_source_columns_and_a_before_struct() {
    let schema = bronze_schema(&customers()).unwrap();
    let names = field_names(&schema);
    assert_eq!(
        names,
        [
            COMMIT_LSN, SEQ, LSN, XID, COMMIT_TS, OP, "id", "name", "amount", "tags", BEFORE,
            VERBATIM
        ]
    );
    assert!(
        !schema.field_by_name("id").unwrap().required,
        "a truncate row has no source values"
    );
    let Type::Struct(before) = &*schema.field_by_name(BEFORE).unwrap().field_type else {
        panic!("before is a struct")
    };
    let inner: Vec<&str> = before.fields().iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        inner,
        [
            BEFORE_IMAGE,
            "id",
            "name",
            "amount",
            "tags",
            BEFORE_NOT_SENT,
            VERBATIM
        ]
    );
    let Type::Map(verbatim) = &*schema.field_by_name(VERBATIM).unwrap().field_type else {
        panic!("_cdc_verbatim is a map")
    };
    assert!(!schema.field_by_name(VERBATIM).unwrap().required);
    assert_eq!(
        *verbatim.value_field.field_type,
        Type::Primitive(PrimitiveType::String)
    );
    assert_eq!(schema.identifier_field_ids().count(), 0);
}

#[test]
fn reserved_names_and_missing_keys_are_refused() {
    let bad = relation(vec![
        column("id", PgType::Int4, -1, true),
        column("_cdc_op", PgType::Text, -1, false),
    ]);
    let err = silver_schema(&bad).unwrap_err();
    assert!(err.to_string().contains("_cdc_op"), "{err}");
    assert!(bronze_schema(&bad).is_err());
    // A table without a key has a history (bronze) but no silver.
    let keyless = relation(vec![column("v", PgType::Text, -1, false)]);
    assert_eq!(
        silver_schema(&keyless).unwrap_err().kind(),
        ErrorKind::Preflight
    );
    assert!(bronze_schema(&keyless).is_ok());
    assert!(!has_silver(&keyless));
}
