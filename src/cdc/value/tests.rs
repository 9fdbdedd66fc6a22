use super::*;

#[test]
fn decodes_scalars_from_text_output() {
    assert_eq!(PgType::Bool.parse("t").unwrap(), Value::Bool(true));
    assert_eq!(PgType::Int2.parse("-32768").unwrap(), Value::Int2(i16::MIN));
    assert_eq!(
        PgType::Int8.parse("9223372036854775807").unwrap(),
        Value::Int8(i64::MAX)
    );
    assert_eq!(
        PgType::Float8.parse("1.5e+300").unwrap(),
        Value::Float8(1.5e300)
    );
    assert_eq!(
        PgType::Bytea.parse("\\x00ff10").unwrap(),
        Value::Bytea(vec![0, 255, 16])
    );
    assert_eq!(
        PgType::Uuid
            .parse("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
            .unwrap()
            .to_json(),
        json!("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    );
}

#[test]
fn numeric_stays_exact_and_keeps_its_special_values() {
    let big = "123456789012345678901234567890123456789012.000000000000000000001";
    assert_eq!(
        PgType::Numeric.parse(big).unwrap(),
        Value::Numeric(Numeric::Finite(big.to_owned()))
    );
    assert_eq!(
        PgType::Numeric.parse("NaN").unwrap(),
        Value::Numeric(Numeric::NaN)
    );
    assert_eq!(
        PgType::Numeric.parse("-Infinity").unwrap(),
        Value::Numeric(Numeric::NegInfinity)
    );
    for bad in ["", "-", "1.", "1e5", "abc", "1.2.3"] {
        assert!(PgType::Numeric.parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn floats_keep_nan_and_infinities_but_reject_rust_only_spellings() {
    let Value::Float8(nan) = PgType::Float8.parse("NaN").unwrap() else {
        panic!()
    };
    assert!(nan.is_nan());
    assert_eq!(
        PgType::Float4.parse("-Infinity").unwrap(),
        Value::Float4(f32::NEG_INFINITY)
    );
    assert!(PgType::Float8.parse("inf").is_err());
    assert_eq!(PgType::Float8.parse("NaN").unwrap().to_json(), json!("NaN"));
}

#[test]
fn parses_one_and_two_dimensional_arrays_with_quoting_and_nulls() {
    let t = PgType::Array(Box::new(PgType::Text));
    assert_eq!(
        t.parse(r#"{plain,"with space","quote\"d",NULL,"NULL"}"#)
            .unwrap(),
        Value::Array(vec![
            Value::Text("plain".into()),
            Value::Text("with space".into()),
            Value::Text("quote\"d".into()),
            Value::Null,
            Value::Text("NULL".into()),
        ])
    );
    let i = PgType::Array(Box::new(PgType::Int4));
    assert_eq!(i.parse("{}").unwrap(), Value::Array(vec![]));
    assert_eq!(
        i.parse("{{1,2},{3,4}}").unwrap().to_json(),
        json!([[1, 2], [3, 4]])
    );
    assert_eq!(i.parse("[0:1]={7,8}").unwrap().to_json(), json!([7, 8]));
    for bad in ["{1,2", "{1,x}", "1,2}", "{1}}", r#"{"a}"#] {
        assert!(i.parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn temporal_values_serialize_with_infinities() {
    assert_eq!(
        PgType::TimestampTz.parse("infinity").unwrap().to_json(),
        json!("infinity")
    );
    assert_eq!(
        PgType::TimestampTz
            .parse("2026-11-29 19:51:00.25+00")
            .unwrap()
            .to_json(),
        json!("2026-11-29T19:51:00.25Z")
    );
    assert_eq!(
        PgType::Timestamp
            .parse("2026-11-29 19:51:00")
            .unwrap()
            .to_json(),
        json!("2026-11-29T19:51:00")
    );
    assert_eq!(
        PgType::Date.parse("-infinity").unwrap().to_json(),
        json!("-infinity")
    );
    assert_eq!(
        PgType::TimeTz.parse("10:00:00-05:30").unwrap().to_json(),
        json!("10:00:00-05:30")
    );
}

#[test]
fn unknown_types_are_carried_as_text() {
    assert_eq!(
        PgType::Unknown.parse("(1,2),(3,4)").unwrap(),
        Value::Unknown("(1,2),(3,4)".into())
    );
}

#[test]
fn errors_never_contain_the_value() {
    let err = PgType::Int4.parse("secret-123").unwrap_err();
    assert!(!err.to_string().contains("secret"), "{err}");
    assert!(err.to_string().contains("int4"));
}
