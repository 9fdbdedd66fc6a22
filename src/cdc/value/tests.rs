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
fn parses_arrays_with_quoting_and_nulls() {
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
    for bad in [
        "{1,2", "{1,x}", "1,2}", "{1}}", r#"{"a}"#, "{1,,2}", "{,}", "{1 2\"}",
    ] {
        assert!(i.parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn quoted_array_elements_hold_any_character() {
    let t = PgType::Array(Box::new(PgType::Text));
    let text =
        |items: &[&str]| Value::Array(items.iter().map(|s| Value::Text((*s).into())).collect());
    // What array_out prints for ARRAY['a{', '{br}', '}', '', ' x ', 'a,b', 'back\slash'].
    assert_eq!(
        t.parse(r#"{"a{","{br}","}",""," x ","a,b","back\\slash"}"#)
            .unwrap(),
        text(&["a{", "{br}", "}", "", " x ", "a,b", "back\\slash"])
    );
    // Unquoted NULL in any case is null; quoted or escaped it is text.
    assert_eq!(
        t.parse(r#"{null,NuLl,"null",\NULL}"#).unwrap(),
        Value::Array(vec![
            Value::Null,
            Value::Null,
            Value::Text("null".into()),
            Value::Text("NULL".into()),
        ])
    );
}

#[test]
fn array_input_whitespace_rules_hold() {
    let t = PgType::Array(Box::new(PgType::Text));
    // Around tokens it is dropped, inside an unquoted element kept, and an
    // escaped one at the end is kept too.
    assert_eq!(
        t.parse("  { a b ,\t\"c\" , d\\  }  ").unwrap(),
        Value::Array(vec![
            Value::Text("a b".into()),
            Value::Text("c".into()),
            Value::Text("d ".into()),
        ])
    );
    assert_eq!(
        t.parse(r#"{a\,b,c\}d,e\"f}"#).unwrap(),
        Value::Array(vec![
            Value::Text("a,b".into()),
            Value::Text("c}d".into()),
            Value::Text("e\"f".into()),
        ])
    );
}

#[test]
fn arrays_a_list_cannot_hold_are_kept_as_their_text() {
    let i = PgType::Array(Box::new(PgType::Int4));
    for kept in [
        "{{1,2},{3,4}}",
        "[0:1]={7,8}",
        "[1:2][1:1]={{1},{2}}",
        "{{}}",
        " [ -3 : -2 ] = { 1 , 2 } ",
    ] {
        assert_eq!(
            i.parse(kept).unwrap(),
            Value::Unknown(kept.to_owned()),
            "{kept}"
        );
    }
    // Bounds that are the default lose nothing.
    assert_eq!(
        i.parse("[1:2]={7,8}").unwrap(),
        Value::Array(vec![Value::Int4(7), Value::Int4(8)])
    );
    for bad in ["[0:1]{7,8}", "[x]={1}", "{{{{{{{1}}}}}}}", "[1:2]="] {
        assert!(i.parse(bad).is_err(), "{bad:?}");
    }
    let deep = "{".repeat(100_000) + &"}".repeat(100_000);
    assert!(i.parse(&deep).is_err());
}

#[test]
fn arrays_of_the_declared_dimensions_are_nested_and_others_kept_as_their_text() {
    let grid = PgType::Array(Box::new(PgType::Array(Box::new(PgType::Int4))));
    let ints = |v: &[Option<i32>]| {
        Value::Array(
            v.iter()
                .map(|i| i.map_or(Value::Null, Value::Int4))
                .collect(),
        )
    };
    assert_eq!(
        grid.parse(" { {1, 2} , {NULL,4} } ").unwrap(),
        Value::Array(vec![ints(&[Some(1), Some(2)]), ints(&[None, Some(4)])])
    );
    assert_eq!(grid.parse("{}").unwrap(), Value::Array(vec![]));
    assert_eq!(
        grid.parse("[1:1][1:2]={{1,2}}").unwrap(),
        Value::Array(vec![ints(&[Some(1), Some(2)])])
    );
    for kept in ["{1,2}", "{{{1}}}", "[0:0][1:1]={{1}}", "{{1},2}"] {
        assert_eq!(
            grid.parse(kept).unwrap(),
            Value::Unknown(kept.to_owned()),
            "{kept}"
        );
    }
    let texts = PgType::Array(Box::new(PgType::Array(Box::new(PgType::Text))));
    assert_eq!(
        texts.parse(r#"{{"a{","\"b\""},{NULL,"NULL"}}"#).unwrap(),
        Value::Array(vec![
            Value::Array(vec![Value::Text("a{".into()), Value::Text("\"b\"".into())]),
            Value::Array(vec![Value::Null, Value::Text("NULL".into())]),
        ])
    );
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

/// A `numeric` as `numeric_send` writes it.
fn numeric_bytes(weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
    let mut b = (digits.len() as u16).to_be_bytes().to_vec();
    b.extend(weight.to_be_bytes());
    b.extend(sign.to_be_bytes());
    b.extend(dscale.to_be_bytes());
    digits.iter().for_each(|d| b.extend(d.to_be_bytes()));
    b
}

#[test]
fn binary_numerics_read_as_numeric_out_prints_them_and_convert_exactly() {
    let cases: [(Vec<u8>, &str, Option<i128>); 6] = [
        (numeric_bytes(0, 0, 4, &[12, 3400]), "12.3400", Some(1234)),
        (numeric_bytes(-1, 0, 3, &[10]), "0.001", None),
        (
            numeric_bytes(1, 0x4000, 0, &[10]),
            "-100000",
            Some(-10_000_000),
        ),
        (numeric_bytes(0, 0, 2, &[]), "0.00", Some(0)),
        (numeric_bytes(-2, 0, 8, &[1234]), "0.00001234", None),
        (numeric_bytes(2, 0, 0, &[1, 0, 5]), "100000005", None),
    ];
    for (bytes, text, at_scale_2) in cases {
        let n = BinaryNumeric::parse(&bytes).unwrap();
        assert_eq!(n.numeric(), Numeric::Finite(text.to_owned()));
        assert_eq!(n.unscaled(2, 8), at_scale_2, "{text} as numeric(8,2)");
    }
    let nan = numeric_bytes(0, 0xC000, 0, &[]);
    assert_eq!(BinaryNumeric::parse(&nan).unwrap().numeric(), Numeric::NaN);
    assert_eq!(BinaryNumeric::parse(&nan).unwrap().unscaled(2, 8), None);
    assert!(BinaryNumeric::parse(&numeric_bytes(0, 0, 0, &[10_000])).is_none());
    assert!(BinaryNumeric::parse(&numeric_bytes(0, 0x1234, 0, &[1])).is_none());
    assert!(BinaryNumeric::parse(&[0, 1, 0, 0]).is_none(), "cut short");
}

#[test]
fn binary_fields_decode_to_the_values_their_text_gives() {
    let epoch_2000_micros = 946_684_800_000_000i64;
    let ts = Wire::TimestampTz
        .decode(&PgType::TimestampTz, &0i64.to_be_bytes())
        .unwrap();
    assert_eq!(
        ts,
        PgType::TimestampTz.parse("2000-01-01 00:00:00+00").unwrap()
    );
    assert_eq!(
        ts,
        Value::TimestampTz(MaybeInfinite::Finite(epoch_2000_micros))
    );
    assert_eq!(
        Wire::Date
            .decode(&PgType::Date, &i32::MAX.to_be_bytes())
            .unwrap(),
        PgType::Date.parse("infinity").unwrap()
    );
    assert_eq!(
        Wire::Int2
            .decode(&PgType::Int2, &(-2i16).to_be_bytes())
            .unwrap(),
        PgType::Int2.parse("-2").unwrap()
    );
    // Past what microseconds since 1970 hold: kept as PostgreSQL's text.
    assert_eq!(
        Wire::TimestampTz
            .decode(&PgType::TimestampTz, &(i64::MAX - 1).to_be_bytes())
            .unwrap(),
        Value::Unknown("294277-01-09 04:00:54.775806+00".into())
    );
    // i64::MAX microseconds since 1970, what infinity is stored as: its
    // text too, from the load's binary form and the stream's text alike.
    let edge = "294247-01-10 04:00:54.775807";
    let pg_micros = i64::MAX - 946_684_800_000_000;
    assert_eq!(
        Wire::Timestamp
            .decode(&PgType::Timestamp, &pg_micros.to_be_bytes())
            .unwrap(),
        Value::Unknown(edge.into())
    );
    assert_eq!(
        PgType::Timestamp.parse(edge).unwrap(),
        Value::Unknown(edge.into())
    );
    assert_eq!(
        PgType::TimestampTz
            .parse("294276-12-31 23:59:59+00")
            .unwrap(),
        Value::Unknown("294276-12-31 23:59:59+00".into()),
        "past i64 microseconds, without an error"
    );
    assert!(PgType::Timestamp.parse("2026-13-01 00:00:00").is_err());
    assert!(
        Wire::Int4.decode(&PgType::Int4, &[0, 1]).is_err(),
        "wrong length"
    );
    assert!(
        Wire::Text.decode(&PgType::Text, &[0xff]).is_err(),
        "not UTF-8"
    );
}
