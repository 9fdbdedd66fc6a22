use super::fixtures::{column, relation};
use super::noted::REWRITE_ACCESS_METHOD;
use super::*;

#[test]
fn a_columns_message_reads_with_and_without_types() {
    let old = br#"{"schema": "public", "table": "customers", "columns": [["id", 1, false]]}"#;
    let (table, oid, columns) = parse_columns(old).unwrap();
    assert_eq!(
        (table.to_string(), oid),
        ("public.customers".to_owned(), None)
    );
    let base = relation(vec![column("id", PgType::Int4, -1, true)]);
    assert!(relation_at_ddl(Some(&base), 1, &table, &columns).is_none());

    let typed = br#"{"schema": "public", "table": "customers", "oid": 16400,
                     "columns": [["id", 1, false, 20, -1], ["n", 3, true, 1700, 655366]]}"#;
    let (table, oid, columns) = parse_columns(typed).unwrap();
    assert_eq!(oid, Some(16400));
    let mut base = base;
    base.columns[0].attnum = Some(1);
    let rel = relation_at_ddl(Some(&base), 16400, &table, &columns).unwrap();
    let shape: Vec<_> = rel
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.is_key, c.type_oid, c.type_modifier))
        .collect();
    assert_eq!(shape, [("id", true, 20, -1), ("n", false, 1700, 655366)]);
    assert_eq!((rel.oid, rel.replica_identity), (16400, b'd'));
    let unknown = relation_at_ddl(None, 16400, &table, &columns).unwrap();
    assert!(unknown.columns.iter().all(|c| !c.is_key));
}

#[test]
fn a_rewrite_that_keeps_every_value_names_no_table() {
    let of = |reason: i32| {
        let content = format!(
            r#"{{"tables": [["public", "p", 7], ["public", "p1", 8]], "reason": {reason}}}"#
        );
        parse_rewrite(content.as_bytes()).unwrap()
    };
    assert!(of(REWRITE_ACCESS_METHOD).is_empty());
    let named: Vec<_> = of(4)
        .into_iter()
        .map(|(t, oid)| (t.to_string(), oid))
        .collect();
    assert_eq!(
        named,
        [("public.p".to_owned(), 7), ("public.p1".to_owned(), 8)]
    );
    assert!(parse_rewrite(b"{}").is_err());
}
