//! Bronze against the audit log, change by change: the same transactions
//! in bronze's order (commit order), the same changes within each, and
//! every value the audit holds, of the after image and of the before
//! image, in the field that held its column when it was written: a
//! column's field under its current name, or under its last name when
//! dropped, or, for values written before a retype, the retired field
//! `<name>__<field id>` (docs/tables.md, Schema changes).

use std::collections::HashMap;

use serde_json::Value;

use super::{BRONZE, Column, Scenario};
use crate::support::*;

/// One audited change.
struct Audited {
    seq: i64,
    op: String,
    old: Option<Value>,
    new: Option<Value>,
    xid: i64,
}

/// The fields of a struct (bronze's top level, or its before image), by id.
struct Fields(Vec<(i64, String)>);

impl Fields {
    fn of(ids: &Value) -> Fields {
        let mut fields: Vec<(i64, String)> = ids
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, id)| (id.as_i64().unwrap(), name.clone()))
            .collect();
        fields.sort();
        Fields(fields)
    }

    /// The name of the field that held `column` at audit seq `seq`: its
    /// fields, oldest (lowest id) first, are one per retype and the one it
    /// holds now.
    fn holding(&self, column: &Column, seq: i64) -> &str {
        let held: Vec<&str> = self
            .0
            .iter()
            .map(|(_, name)| name.as_str())
            .filter(|name| {
                column.names.iter().any(|n| {
                    *name == n
                        || name.strip_prefix(n.as_str()).is_some_and(|rest| {
                            rest.strip_prefix("__")
                                .is_some_and(|id| id.bytes().all(|b| b.is_ascii_digit()))
                        })
                })
            })
            .collect();
        assert_eq!(
            held.len(),
            column.retypes.len() + 1,
            "a field for each type of {column:?}: {held:?}"
        );
        held[column.retypes.iter().filter(|&&b| b < seq).count()]
    }
}

/// Whether two values are the same, numbers by their value.
fn same(lake: &Value, audited: &Value) -> bool {
    let number = |v: &Value| match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse::<f64>().ok(),
        _ => None,
    };
    match (lake, audited) {
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::String(a), Value::String(b)) => a == b,
        _ => lake == audited || (number(lake).is_some() && number(lake) == number(audited)),
    }
}

impl Scenario {
    /// Whether the replica identity was FULL at audit seq `seq`.
    fn full_identity_at(&self, seq: i64) -> bool {
        self.identities
            .iter()
            .rev()
            .find(|(before, _)| *before < seq)
            .is_some_and(|(_, full)| *full)
    }

    /// The scenario's column that had the name `name`.
    fn column_named(&self, name: &str) -> &Column {
        self.columns
            .iter()
            .find(|c| c.names.iter().any(|n| n == name))
            .unwrap_or_else(|| panic!("no column was ever named {name}"))
    }

    async fn audited(&self) -> Vec<Audited> {
        let json = |text: Option<String>| text.map(|t| serde_json::from_str(&t).unwrap());
        self.db
            .client
            .query("SELECT seq, op, old::text, new::text, xid FROM audit", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| Audited {
                seq: r.get(0),
                op: r.get(1),
                old: json(r.get(2)),
                new: json(r.get(3)),
                xid: r.get(4),
            })
            .collect()
    }
}

/// Every value of `image`, an audited row, is `row`'s in the field that
/// held its column at `seq`; with `key_only`, the key `id` alone.
fn assert_image(
    s: &Scenario,
    fields: &Fields,
    (row, image): (&Value, &Value),
    seq: i64,
    key_only: bool,
    what: &str,
) {
    for (name, value) in image.as_object().unwrap() {
        let field = match name.as_str() {
            "id" | "k" => name.as_str(),
            _ if key_only => continue,
            _ => fields.holding(s.column_named(name), seq),
        };
        if key_only && field == "k" {
            continue;
        }
        assert!(
            same(&row[field], value),
            "{what}: column {name} (field {field}): lake {} audit {value}",
            row[field]
        );
    }
}

pub(super) async fn assert_holds_the_audit(s: &Scenario, seed: u64) {
    let rows = pyiceberg(s.lake.path(), BRONZE, "rows").await;
    let schema = pyiceberg(s.lake.path(), BRONZE, "schema").await;
    let (top, before) = (
        Fields::of(&schema["ids"]),
        Fields::of(&schema["before_ids"]),
    );
    let changes: Vec<&Value> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["_cdc_op"] != "r")
        .collect();
    let mut commits: HashMap<i64, usize> = HashMap::new();
    for row in &changes {
        let next = commits.len();
        commits
            .entry(row["_cdc_xid"].as_i64().unwrap())
            .or_insert(next);
    }
    let mut audit = s.audited().await;
    audit.sort_by_key(|a| (commits.get(&a.xid).copied().unwrap_or(usize::MAX), a.seq));
    assert_eq!(
        changes.len(),
        audit.len(),
        "one bronze change per audited one (seed {seed})"
    );
    for (n, (row, a)) in changes.iter().zip(&audit).enumerate() {
        let what = format!("change {n} (seq {}, {}, seed {seed})", a.seq, a.op);
        assert_eq!(row["_cdc_op"], a.op.as_str(), "{what}");
        assert_eq!(row["_cdc_xid"], a.xid, "{what}");
        let full = s.full_identity_at(a.seq);
        let image = &row["_cdc_before"];
        match (a.op.as_str(), &a.new, &a.old) {
            ("c", Some(new), _) => assert_image(s, &top, (row, new), a.seq, false, &what),
            ("u", Some(new), Some(old)) => {
                assert_image(s, &top, (row, new), a.seq, false, &what);
                match image {
                    // Under the default identity, an update that keeps
                    // the key sends no before image.
                    Value::Null => assert!(!full, "{what}: a full before image"),
                    _ => {
                        assert_eq!(image["_cdc_image"], ["key", "full"][usize::from(full)]);
                        assert_image(s, &before, (image, old), a.seq, !full, &what);
                    }
                }
            }
            ("d", None, Some(old)) => {
                assert_image(s, &top, (row, old), a.seq, !full, &what);
                assert_eq!(
                    image["_cdc_image"],
                    ["key", "full"][usize::from(full)],
                    "{what}"
                );
                assert_image(s, &before, (image, old), a.seq, !full, &what);
            }
            _ => panic!("{what}: an audit row of no known shape"),
        }
    }
}
