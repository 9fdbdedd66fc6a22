use super::*;
use crate::cdc::relation::fixtures::{column, relation, typmod};
use crate::cdc::value::PgType;
use crate::lake::schema::{bronze_schema, silver_schema};

fn base() -> RelationInfo {
    relation(vec![
        column("id", PgType::Int4, -1, true),
        column("tags", PgType::Array(Box::new(PgType::Text)), -1, false),
        column("amount", PgType::Numeric, typmod(12, 2), false),
    ])
}

fn names(columns: &[&ColumnInfo]) -> Vec<String> {
    columns.iter().map(|c| c.name.clone()).collect()
}

#[test]
fn added_columns_are_missing_and_dropped_ones_are_not_an_error() {
    let silver = silver_schema(&base()).unwrap();
    let bronze = bronze_schema(&base()).unwrap();
    assert!(missing_columns(&silver, &base()).unwrap().is_empty());

    let mut added = base();
    added.columns.push(column("note", PgType::Text, -1, false));
    added.columns.remove(2);
    assert_eq!(names(&missing_columns(&silver, &added).unwrap()), ["note"]);
    assert_eq!(names(&missing_columns(&bronze, &added).unwrap()), ["note"]);
    check_key(&silver, &added).unwrap();
}

#[test]
fn a_changed_type_key_or_a_likely_rename_is_refused_with_what_changed() {
    let silver = silver_schema(&base()).unwrap();
    let mut retyped = base();
    retyped.columns[2].type_modifier = typmod(14, 2);
    let err = missing_columns(&silver, &retyped).unwrap_err().to_string();
    assert!(
        err.contains("\"amount\" changed type") && err.contains("decimal(12, 2)"),
        "{err}"
    );
    let mut element = base();
    element.columns[1].pg_type = PgType::Array(Box::new(PgType::Int4));
    assert!(missing_columns(&silver, &element).is_err());

    let mut scalar = base();
    scalar.columns[1].pg_type = PgType::Text;
    assert!(missing_columns(&silver, &scalar).is_err());

    let mut rekeyed = base();
    rekeyed.columns[2].is_primary_key = true;
    let err = check_key(&silver, &rekeyed).unwrap_err().to_string();
    assert!(err.contains("primary key changed"), "{err}");

    let mut renamed = base();
    renamed.columns[2].name = "total".into();
    let err = check_rename(&base(), &renamed).unwrap_err().to_string();
    assert!(err.contains("rename") && err.contains("total"), "{err}");
    let mut dropped = base();
    dropped.columns.pop();
    check_rename(&base(), &dropped).unwrap();

    let mut reserved = base();
    reserved
        .columns
        .push(column("_cdc_extra", PgType::Text, -1, false));
    assert!(missing_columns(&silver, &reserved).is_err());
}

#[test]
fn a_list_of_other_depth_of_the_same_elements_is_no_type_change() {
    let silver = silver_schema(&base()).unwrap();
    let mut deeper = base();
    deeper.columns[1].pg_type = PgType::Array(Box::new(PgType::Array(Box::new(PgType::Text))));
    assert!(missing_columns(&silver, &deeper).unwrap().is_empty());
    deeper.columns[1].pg_type = PgType::Array(Box::new(PgType::Array(Box::new(PgType::Int4))));
    assert!(missing_columns(&silver, &deeper).is_err());
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
