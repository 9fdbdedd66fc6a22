//! Arrays: a list's depth against the table's, and nested lists.

use super::*;

#[test]
fn a_list_of_other_depth_of_the_same_elements_is_no_type_change() {
    let mut deeper = base();
    deeper.columns[1].pg_type = PgType::Array(Box::new(PgType::Array(Box::new(PgType::Text))));
    assert!(next(Mode::Silver, &deeper).unwrap().is_none());
    deeper.columns[1].pg_type = PgType::Array(Box::new(PgType::Array(Box::new(PgType::Int4))));
    assert!(next(Mode::Silver, &deeper).unwrap().unwrap().reload);
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
    for mode in [Mode::Bronze, Mode::Silver] {
        let schema = match mode {
            Mode::Bronze => bronze_schema(&grids),
            _ => silver_schema(&grids),
        }
        .unwrap();
        let attnums = plan_schema(
            &schema,
            schema.highest_field_id(),
            Records::default(),
            &grids,
            mode,
        )
        .unwrap()
        .unwrap()
        .attnums;
        let planned = plan_schema(
            &schema,
            schema.highest_field_id(),
            recording(&attnums),
            &grids,
            mode,
        )
        .unwrap();
        assert!(planned.is_none(), "{mode:?}: {attnums} {planned:?}");
    }
}
