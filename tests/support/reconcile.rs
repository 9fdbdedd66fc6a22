//! Reconciliation: a source table and an Iceberg table compared as a row
//! count plus an order-independent checksum over every source column, with
//! the differing keys named when they disagree.
//!
//! Both sides are brought to one canonical form per value: PostgreSQL
//! computes it in SQL from the source table, pyiceberg
//! (`read_lake.py canonical`) from the lake. Temporal values become integers
//! since 1970 (the infinities as text), binary `\x`-hex, numerics their
//! exact text, floats the shortest text of their own width. Each row's
//! canonical JSON (keys sorted) is hashed, and the hashes are summed, so row
//! order does not matter and any changed value does.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

use serde_json::Value;

use super::TestDb;
use super::readers::RemoteLake;

/// Row count and order-independent checksum of one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    pub rows: u64,
    pub checksum: u64,
}

struct Column {
    name: String,
    /// The base type's name (`_int4` for an int4 array).
    type_name: String,
    /// The column's type as SQL names it, modifier included.
    sql_type: String,
    /// The dimensions an array column was declared with (`attndims`).
    dimensions: i32,
}

async fn columns(db: &TestDb, table: &str) -> Vec<Column> {
    db.client
        .query(
            "SELECT a.attname::text, coalesce(b.typname, t.typname)::text, \
             format_type(a.atttypid, a.atttypmod), a.attndims::int4 \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             LEFT JOIN pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype \
             WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&table],
        )
        .await
        .expect("read the table's columns")
        .iter()
        .map(|r| Column {
            name: r.get(0),
            type_name: r.get(1),
            sql_type: r.get(2),
            dimensions: r.get(3),
        })
        .collect()
}

async fn primary_key(db: &TestDb, table: &str) -> Vec<String> {
    db.client
        .query(
            "SELECT a.attname::text FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = $1::text::regclass AND i.indisprimary ORDER BY a.attnum",
            &[&table],
        )
        .await
        .expect("read the primary key")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The SQL that gives a column's canonical JSON value.
fn canonical_sql(column: &Column) -> String {
    let c = format!("\"{}\"", column.name.replace('"', "\"\""));
    match column.type_name.strip_prefix('_') {
        // Declared with more dimensions, a value of as many is nested
        // lists in the lake; one of others is verbatim.
        Some(element) if column.dimensions > 1 => format!(
            "CASE WHEN array_ndims({c}) = {d} THEN {} ELSE {} END",
            nested_expr(&c, element, column.dimensions, 1),
            canonical_expr(&c, &column.type_name),
            d = column.dimensions
        ),
        _ => canonical_expr(&c, &column.type_name),
    }
}

/// The canonical JSON of the array `c` of `dimensions` dimensions as
/// nested lists, from its dimension `level` on.
fn nested_expr(c: &str, element: &str, dimensions: i32, level: i32) -> String {
    if level > dimensions {
        let at: String = (1..=dimensions).map(|l| format!("[s{l}]")).collect();
        return canonical_expr(&format!("{c}{at}"), element);
    }
    format!(
        "(SELECT coalesce(jsonb_agg({} ORDER BY s{level}), '[]'::jsonb) \
         FROM generate_subscripts({c}, {level}) s{level})",
        nested_expr(c, element, dimensions, level + 1)
    )
}

/// The canonical JSON of `c`, of the type named `type_name`: an array's
/// elements one by one, each in its element type's form (multi-dimensional
/// arrays flattened, as unnest reads them; [`nested_expr`] keeps them
/// nested).
fn canonical_expr(c: &str, type_name: &str) -> String {
    if let Some(element) = type_name.strip_prefix('_') {
        return format!(
            "CASE WHEN {c} IS NULL THEN NULL ELSE coalesce((SELECT jsonb_agg({} ORDER BY o) \
             FROM unnest({c}) WITH ORDINALITY AS u(e, o)), '[]'::jsonb) END",
            canonical_expr("e", element)
        );
    }
    let infinite = |finite: &str| {
        format!(
            "CASE WHEN {c} = 'infinity' THEN to_jsonb('infinity'::text) \
             WHEN {c} = '-infinity' THEN to_jsonb('-infinity'::text) \
             ELSE to_jsonb({finite}) END"
        )
    };
    match type_name {
        "timestamp" | "timestamptz" => infinite(&format!(
            "(extract(epoch FROM {c}) * 1000000)::numeric(30,0)"
        )),
        "date" => infinite(&format!("{c} - date '1970-01-01'")),
        "time" => format!("to_jsonb((extract(epoch FROM {c}) * 1000000)::bigint)"),
        // The lake writes the offset as +hh:mm always.
        "timetz" => format!("to_jsonb(regexp_replace({c}::text, '([+-][0-9][0-9])$', '\\1:00'))"),
        // Exact text where to_jsonb would give a JSON number or document
        // (to_jsonb of a float goes through numeric, and a JSON number
        // through a parser that rounds).
        "numeric" | "json" | "jsonb" | "float4" | "float8" => format!("to_jsonb({c}::text)"),
        // Everything else as its output function prints it (to_jsonb uses
        // it for types JSON has no form for; a ::text cast would differ for
        // bpchar padding and inet masks).
        _ => format!("to_jsonb({c})"),
    }
}

/// The canonical text of a row: floats (exact text on both sides) as the
/// shortest text of their own width, in arrays too; keys sorted.
fn canonical_row(row: &serde_json::Map<String, Value>, types: &BTreeMap<&str, &str>) -> String {
    fn float(value: &Value, width: &str) -> Value {
        match value {
            Value::String(text) => match width {
                "float4" => text.parse::<f32>().map(|f| format!("{f:?}")),
                _ => text.parse::<f64>().map(|f| format!("{f:?}")),
            }
            .map_or_else(|_| value.clone(), Value::String),
            Value::Array(items) => Value::Array(items.iter().map(|v| float(v, width)).collect()),
            other => other.clone(),
        }
    }
    let mut out = BTreeMap::new();
    for (name, value) in row {
        let value = match types.get(name.as_str()).map(|t| t.trim_start_matches('_')) {
            Some(width @ ("float4" | "float8")) => float(value, width),
            _ => value.clone(),
        };
        out.insert(name.clone(), value);
    }
    serde_json::to_string(&out).expect("serialize")
}

fn digest_of(rows: &BTreeMap<String, String>) -> Digest {
    let checksum = rows.values().fold(0u64, |sum, row| {
        let mut h = DefaultHasher::new();
        row.hash(&mut h);
        sum.wrapping_add(h.finish())
    });
    Digest {
        rows: rows.len() as u64,
        checksum,
    }
}

/// Canonical rows by their key's canonical text.
fn to_lake(
    rows: &[Value],
    key: &[String],
    types: &BTreeMap<&str, &str>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for row in rows {
        // Columns dropped at the source stay in the lake for history.
        let row: serde_json::Map<String, Value> = row
            .as_object()
            .expect("a row object")
            .iter()
            .filter(|(name, _)| types.contains_key(name.as_str()))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        let k: Vec<&Value> = key.iter().map(|c| &row[c]).collect();
        let previous = out.insert(
            serde_json::to_string(&k).unwrap(),
            canonical_row(&row, types),
        );
        assert!(previous.is_none(), "key {k:?} appears twice");
    }
    out
}

/// Replaces each value the lake kept verbatim (`{"$verbatim": text}`) by
/// the canonical form PostgreSQL gives that text as the column's type, so
/// that the rule of docs/values.md is checked against the server itself.
async fn resolve_verbatim(db: &TestDb, columns: &[Column], rows: &mut Value) {
    for row in rows.as_array_mut().expect("rows").iter_mut() {
        for column in columns {
            let Some(text) = row
                .get(&column.name)
                .and_then(|v| v.get("$verbatim"))
                .and_then(Value::as_str)
                .map(str::to_owned)
            else {
                continue;
            };
            let sql = format!(
                "SELECT ({})::text FROM (SELECT $1::text::{} AS \"{}\") s",
                canonical_sql(column),
                column.sql_type,
                column.name.replace('"', "\"\"")
            );
            let canonical: String = db
                .client
                .query_one(&sql, &[&text])
                .await
                .unwrap_or_else(|e| {
                    panic!("{}: {text:?} is not a value of its type: {e}", column.name)
                })
                .get(0);
            row[&column.name] = serde_json::from_str(&canonical).expect("canonical JSON");
        }
    }
}

/// Compares a source table with its silver table read through pyiceberg;
/// panics naming the first differing keys unless count and checksum agree.
/// Returns the (equal) digest.
pub async fn assert_reconciled(db: &TestDb, source: &str, lake: &Path, iceberg: &str) -> Digest {
    assert_reconciled_through(db, source, &RemoteLake::embedded(lake), iceberg).await
}

/// [`assert_reconciled`], the lake read with `reader`'s settings.
pub async fn assert_reconciled_through(
    db: &TestDb,
    source: &str,
    reader: &RemoteLake<'_>,
    iceberg: &str,
) -> Digest {
    let columns = columns(db, source).await;
    let key = primary_key(db, source).await;
    let types: BTreeMap<&str, &str> = columns
        .iter()
        .map(|c| (c.name.as_str(), c.type_name.as_str()))
        .collect();
    let select = columns
        .iter()
        .map(|c| format!("'{}', {}", c.name.replace('\'', "''"), canonical_sql(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let source_rows: Vec<Value> = db
        .client
        .query(
            &format!("SELECT jsonb_build_object({select})::text FROM {source}"),
            &[],
        )
        .await
        .expect("read the source table")
        .iter()
        .map(|r| serde_json::from_str(r.get::<_, &str>(0)).unwrap())
        .collect();
    let mut lake_rows = reader.pyiceberg(iceberg, "canonical").await;
    resolve_verbatim(db, &columns, &mut lake_rows).await;
    let source_rows = to_lake(&source_rows, &key, &types);
    let lake_rows = to_lake(lake_rows.as_array().expect("rows"), &key, &types);
    let (source_digest, lake_digest) = (digest_of(&source_rows), digest_of(&lake_rows));
    if source_digest != lake_digest {
        let differing: Vec<String> = source_rows
            .keys()
            .chain(lake_rows.keys())
            .filter(|k| source_rows.get(*k) != lake_rows.get(*k))
            .take(5)
            .map(|k| {
                format!(
                    "key {k}:\n  source: {:?}\n  lake:   {:?}",
                    source_rows.get(k),
                    lake_rows.get(k)
                )
            })
            .collect();
        panic!(
            "{source} and {iceberg} differ: source {source_digest:?}, lake {lake_digest:?}\n{}",
            differing.join("\n")
        );
    }
    source_digest
}
