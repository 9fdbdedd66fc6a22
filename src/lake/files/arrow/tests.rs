use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Float64Type};
use arrow_array::{Array, Decimal128Array, ListArray, StringArray};

use super::*;

#[test]
fn decimals_convert_exactly_or_not_at_all() {
    assert_eq!(decimal_to_i128("12.30", 2, 12), Some(1230));
    assert_eq!(decimal_to_i128("-0.5", 2, 12), Some(-50));
    assert_eq!(decimal_to_i128("7", 3, 12), Some(7000));
    assert_eq!(decimal_to_i128("1.234", 2, 12), None, "would round");
    assert_eq!(decimal_to_i128("1000", 0, 3), None, "beyond precision");
    let max38 = "9".repeat(38);
    assert_eq!(decimal_to_i128(&max38, 0, 38), Some(10i128.pow(38) - 1));
}

#[test]
fn builds_decimal_string_and_list_arrays() {
    let dec = Field::new("d", DataType::Decimal128(12, 2), true);
    let values = [Value::Numeric(Numeric::Finite("1.50".into()))];
    let array = build_array(&dec, &[Some(&values[0]), None]).unwrap();
    let array = array.as_any().downcast_ref::<Decimal128Array>().unwrap();
    assert_eq!(array.value(0), 150);
    assert!(array.is_null(1));

    let text = Field::new("t", DataType::Utf8, true);
    let nan = Value::Numeric(Numeric::NaN);
    let array = build_array(&text, &[Some(&nan)]).unwrap();
    assert_eq!(
        array
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .value(0),
        "NaN"
    );

    let list = Field::new(
        "l",
        DataType::List(Arc::new(Field::new("element", DataType::Int32, true))),
        true,
    );
    let arr = Value::Array(vec![Value::Int4(1), Value::Null]);
    let empty = Value::Array(vec![]);
    let array = build_array(&list, &[Some(&arr), None, Some(&empty)]).unwrap();
    let array = array.as_any().downcast_ref::<ListArray>().unwrap();
    assert_eq!(array.value_length(0), 2);
    assert!(array.is_null(1));
    assert_eq!(array.value_length(2), 0);
}

#[test]
fn values_a_column_cannot_hold_are_errors_naming_the_column() {
    let dec = Field::new("amount", DataType::Decimal128(12, 2), true);
    let nan = Value::Numeric(Numeric::NaN);
    let err = build_array(&dec, &[Some(&nan)]).unwrap_err();
    assert!(
        err.to_string().contains("numeric NaN") && err.to_string().contains("column=amount"),
        "{err}"
    );
}

#[test]
fn a_narrowed_columns_values_widen_into_its_field_and_nothing_else_converts() {
    use arrow_array::{Float32Array, Int32Array, Int64Array};
    let column = |name: &str, t: DataType| Arc::new(Field::new(name, t, true));
    let source = vec![
        column("b", DataType::Int32),
        column("f", DataType::Float32),
        column("d", DataType::Decimal128(10, 4)),
    ];
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from(vec![Some(7), None])),
        Arc::new(Float32Array::from(vec![1.5, -2.25])),
        Arc::new(
            Decimal128Array::from(vec![12_345, -1])
                .with_precision_and_scale(10, 4)
                .unwrap(),
        ),
    ];
    let wide = |name: &str, t: DataType| {
        load_source_column(&Field::new(name, t, true), &source, &arrays, 2).unwrap()
    };
    let b = wide("b", DataType::Int64);
    let b = b.as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!((b.value(0), b.is_null(1)), (7, true));
    assert_eq!(
        wide("f", DataType::Float64)
            .as_primitive::<Float64Type>()
            .value(1),
        -2.25
    );
    let d = wide("d", DataType::Decimal128(12, 4));
    assert_eq!(d.as_primitive::<Decimal128Type>().value(0), 12_345);
    let narrower = Field::new("b", DataType::Int16, true);
    assert!(load_source_column(&narrower, &source, &arrays, 2).is_err());
    let rescaled = Field::new("d", DataType::Decimal128(12, 2), true);
    assert!(load_source_column(&rescaled, &source, &arrays, 2).is_err());
}

/// `_cdc_verbatim` as silver's schema maps it to Arrow.    /// `_cdc_verbatim` as silver's schema maps it to Arrow.
fn verbatim_field() -> FieldRef {
    use crate::cdc::relation::fixtures::{column, relation};
    use crate::cdc::value::PgType;
    let rel = relation(vec![column("id", PgType::Int4, -1, true)]);
    let schema = crate::lake::schema::silver_schema(&rel).unwrap();
    let arrow = iceberg::arrow::schema_to_arrow_schema(&schema).unwrap();
    Arc::new(
        arrow
            .field_with_name(crate::lake::schema::VERBATIM)
            .unwrap()
            .clone(),
    )
}

#[test]
fn values_a_column_cannot_hold_are_kept_verbatim_beside_a_null() {
    let dec = Field::new("amount", DataType::Decimal128(12, 2), true);
    let time = Field::new("at", DataType::Time64(TimeUnit::Microsecond), true);
    let decimals = Field::new(
        "amounts",
        DataType::List(Arc::new(Field::new(
            "element",
            dec.data_type().clone(),
            true,
        ))),
        true,
    );
    let date = Field::new("day", DataType::Date32, true);
    let finite = |s: &str| Value::Numeric(Numeric::Finite(s.into()));
    let nan = Value::Numeric(Numeric::NaN);
    let midnight = Value::Time(MICROS_PER_DAY);
    let list = Value::Array(vec![finite("1.50"), nan.clone(), Value::Null]);
    let fine_list = Value::Array(vec![finite("2.00")]);
    let text = Value::Unknown("[0:1]={1,2}".into());
    let mut verbatim = Verbatim::default();
    let amounts = build_array_keeping(
        &dec,
        &[Some(&finite("1.25")), Some(&nan), None],
        &mut verbatim,
    )
    .unwrap();
    let ats = build_array_keeping(&time, &[None, Some(&midnight), None], &mut verbatim).unwrap();
    let lists = build_array_keeping(
        &decimals,
        &[Some(&list), Some(&fine_list), None],
        &mut verbatim,
    )
    .unwrap();
    let days = build_array_keeping(&date, &[None, None, Some(&text)], &mut verbatim).unwrap();
    assert_eq!(amounts.null_count(), 2);
    assert!(amounts.is_valid(0) && ats.is_null(1) && lists.is_null(0) && days.is_null(2));
    assert!(lists.is_valid(1), "a list that fits is stored as a list");
    assert_eq!(lists.as_list::<i32>().value(1).len(), 1);
    assert_eq!(
        verbatim.entries(0),
        vec![("amounts".to_owned(), "{1.50,NaN,NULL}".to_owned())]
    );
    assert_eq!(
        verbatim.entries(1),
        vec![
            ("amount".to_owned(), "NaN".to_owned()),
            ("at".to_owned(), "24:00:00".to_owned())
        ]
    );
    assert_eq!(
        verbatim.entries(2),
        vec![("day".to_owned(), "[0:1]={1,2}".to_owned())]
    );
    let field = verbatim_field();
    let map = verbatim.array(&field, 4).unwrap();
    assert_eq!(map.data_type(), field.data_type());
    assert!(map.is_null(3), "a row that kept nothing has a null map");
    for row in 0..3 {
        let mut entries = verbatim_entries(map.as_ref(), row);
        entries.sort();
        assert_eq!(entries, verbatim.entries(row));
    }
    let read_back = Verbatim::of_column(map.as_ref());
    for row in 0..4 {
        assert_eq!(read_back.entries(row), verbatim.entries(row), "row {row}");
    }
}

#[test]
fn verbatim_arrays_quote_elements_as_array_out_does() {
    let texts = Value::Array(vec![
        Value::Text("plain".into()),
        Value::Text("".into()),
        Value::Text("NULL".into()),
        Value::Text("a b".into()),
        Value::Text("{\"x\\".into()),
        Value::Null,
    ]);
    assert_eq!(
        verbatim_text(&texts).unwrap(),
        r#"{plain,"","NULL","a b","{\"x\\",NULL}"#
    );
    assert_eq!(verbatim_text(&Value::Int4(1)), None);
}

#[test]
fn stored_cells_read_back_as_the_values_that_wrote_them() {
    let list = |t: DataType| DataType::List(Arc::new(Field::new("element", t, true)));
    let cases: Vec<(DataType, Vec<Value>)> = vec![
        (DataType::Boolean, vec![Value::Bool(true)]),
        (DataType::Int32, vec![Value::Int4(i32::MIN)]),
        (DataType::Int64, vec![Value::Int8(i64::MAX)]),
        (DataType::Float32, vec![Value::Float4(f32::NAN)]),
        (DataType::Float64, vec![Value::Float8(f64::NEG_INFINITY)]),
        (
            DataType::Decimal128(38, 4),
            vec![
                Value::Numeric(Numeric::Finite("-0.0100".into())),
                Value::Numeric(Numeric::Finite(format!("{}.0000", "9".repeat(34)))),
            ],
        ),
        (DataType::Utf8, vec![Value::Text("żółw \u{0}".into())]),
        (DataType::LargeBinary, vec![Value::Bytea(vec![0, 1, 0])]),
        (
            DataType::Date32,
            vec![
                Value::Date(MaybeInfinite::Finite(-719_162)),
                Value::Date(MaybeInfinite::Infinity),
                Value::Date(MaybeInfinite::NegInfinity),
            ],
        ),
        (
            DataType::Time64(TimeUnit::Microsecond),
            vec![Value::Time(86_399_999_999)],
        ),
        (
            DataType::Timestamp(TimeUnit::Microsecond, None),
            vec![
                Value::Timestamp(MaybeInfinite::Finite(-1)),
                Value::Timestamp(MaybeInfinite::NegInfinity),
            ],
        ),
        (
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            vec![Value::TimestampTz(MaybeInfinite::Infinity)],
        ),
        (DataType::FixedSizeBinary(16), vec![Value::Uuid([7; 16])]),
        (
            list(list(DataType::Utf8)),
            vec![
                Value::Array(vec![]),
                Value::Array(vec![Value::Array(vec![
                    Value::Text("a".into()),
                    Value::Null,
                ])]),
            ],
        ),
    ];
    for (data_type, values) in cases {
        let field = Field::new("c", data_type.clone(), true);
        let mut cells: Vec<Option<&Value>> = values.iter().map(Some).collect();
        cells.push(None);
        let array = build_array(&field, &cells).unwrap();
        for (row, value) in values.iter().enumerate() {
            let back = arrow_value(array.as_ref(), row).unwrap();
            match (value, &back) {
                (Value::Float4(a), Value::Float4(b)) if a.is_nan() => assert!(b.is_nan()),
                _ => assert_eq!(&back, value, "{data_type}"),
            }
        }
        assert_eq!(
            arrow_value(array.as_ref(), values.len()).unwrap(),
            Value::Null
        );
    }
}
