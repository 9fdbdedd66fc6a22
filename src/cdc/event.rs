//! Change events: what the rest of the program consumes.
//!
//! A transaction arrives as `Begin`, its changes in commit order, then
//! `Commit`, one event at a time, so a transaction of any size streams
//! through in flat memory. Rows of the initial load are changes with op
//! [`Op::Read`] inside one snapshot "transaction" at the slot's consistent
//! point. `(commit_lsn, seq)` identifies a change uniquely; the change's own
//! LSN does not (rows of one multi-row insert can share it).

use std::sync::Arc;

use serde_json::{Map, json};

use super::relation::{ColumnInfo, RelationInfo};
use super::temporal;
pub use super::value::Datum;
use crate::error::{Error, ErrorKind};
use crate::model::Lsn;
use crate::model::TableName;

/// The kind of change, with the codes of the bronze `_cdc_op` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `r`: a row of the initial load.
    Read,
    /// `c`: an insert.
    Insert,
    /// `u`: an update.
    Update,
    /// `d`: a delete.
    Delete,
    /// `t`: a truncate of the relation.
    Truncate,
}

impl Op {
    pub fn code(self) -> &'static str {
        match self {
            Op::Read => "r",
            Op::Insert => "c",
            Op::Update => "u",
            Op::Delete => "d",
            Op::Truncate => "t",
        }
    }
}

/// Finds one column by name in the relations of a sequence of changes,
/// scanning a relation's columns only when it is not the previous change's
/// (a batch's changes nearly always share one).
pub(crate) struct ColumnFinder<'a> {
    name: &'a str,
    last: Option<(*const RelationInfo, Option<usize>)>,
}

impl<'a> ColumnFinder<'a> {
    pub(crate) fn new(name: &'a str) -> ColumnFinder<'a> {
        ColumnFinder { name, last: None }
    }

    /// The column's position in `change`'s relation, if it has the column.
    pub(crate) fn position(&mut self, change: &Change) -> Option<usize> {
        let relation = Arc::as_ptr(&change.relation);
        match self.last {
            Some((last, at)) if last == relation => at,
            _ => {
                let at = change.column(self.name);
                self.last = Some((relation, at));
                at
            }
        }
    }
}

/// A before image: complete (REPLICA IDENTITY FULL) or the key only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    Key,
    Full,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BeforeImage {
    pub kind: ImageKind,
    pub row: Vec<Datum>,
}

/// The transaction a change belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxInfo {
    /// 0 for the snapshot of the initial load.
    pub xid: u32,
    /// The LSN of the commit record (the consistent point for the load).
    pub commit_lsn: Lsn,
    /// Microseconds since the Unix epoch, UTC.
    pub commit_ts: i64,
}

/// One row change.
#[derive(Debug, Clone)]
pub struct Change {
    pub op: Op,
    pub relation: Arc<RelationInfo>,
    pub tx: TxInfo,
    /// Ordinal within the transaction, from 0.
    pub seq: u64,
    /// The WAL position of the change itself (the commit LSN for loads).
    pub lsn: Lsn,
    /// Updates and deletes, when the server sent an old tuple.
    pub before: Option<BeforeImage>,
    /// Reads, inserts and updates.
    pub after: Option<Vec<Datum>>,
    /// Truncates: the CASCADE and RESTART IDENTITY flags as sent.
    pub truncate_options: u8,
}

impl Change {
    /// A rough count of the bytes the change's values hold, to bound what
    /// is buffered before it is written to a file.
    pub fn approx_bytes(&self) -> usize {
        let row_bytes = |row: &[Datum]| -> usize {
            row.iter()
                .map(|d| match d {
                    Datum::Value(v) => v.approx_bytes(),
                    _ => 0,
                })
                .sum()
        };
        std::mem::size_of::<Change>()
            + self.after.as_deref().map_or(0, row_bytes)
            + self.before.as_ref().map_or(0, |b| row_bytes(&b.row))
    }

    /// The position of column `name` in the change's relation.
    pub(crate) fn column(&self, name: &str) -> Option<usize> {
        self.relation.columns.iter().position(|c| c.name == name)
    }

    /// The position of `column`, of a later definition of the relation,
    /// in the change's: by attribute number where both know it, so that a
    /// column renamed since is found.
    pub(crate) fn column_like(&self, column: &ColumnInfo) -> Option<usize> {
        let columns = &self.relation.columns;
        match column.attnum {
            Some(n) if columns.iter().all(|c| c.attnum.is_some()) => {
                columns.iter().position(|c| c.attnum == Some(n))
            }
            _ => self.column(&column.name),
        }
    }

    /// Replaces the after image's unchanged TOAST values with the before
    /// image's, when that is complete (REPLICA IDENTITY FULL, which the
    /// server sends detoasted); any other stays unchanged.
    pub(crate) fn fill_unchanged_from_before_image(&mut self) {
        let (Some(after), Some(before)) = (self.after.as_mut(), self.before.as_ref()) else {
            return;
        };
        if before.kind != ImageKind::Full {
            return;
        }
        for (datum, old) in after.iter_mut().zip(&before.row) {
            if matches!(datum, Datum::UnchangedToast) && matches!(old, Datum::Value(_)) {
                *datum = old.clone();
            }
        }
    }

    /// Whether the after image holds an unchanged TOAST value not filled.
    pub(crate) fn has_unchanged_toast(&self) -> bool {
        self.after
            .iter()
            .flatten()
            .any(|d| matches!(d, Datum::UnchangedToast))
    }

    /// The error for an unchanged TOAST value whose current value is not
    /// known: never write a placeholder or a guess in its place.
    pub(crate) fn unfilled(&self, column: &str) -> Error {
        Error::new(
            ErrorKind::Decode,
            "an unchanged TOAST value has no known current value to fill it with",
        )
        .with_context("table", &self.relation.name)
        .with_context("column", column)
        .with_context("lsn", self.lsn)
    }
}

#[derive(Debug, Clone)]
pub enum Event {
    Begin(TxInfo),
    Change(Change),
    /// A logical decoding message (`pg_logical_emit_message`); `tx` is set
    /// for transactional ones.
    Message {
        tx: Option<TxInfo>,
        lsn: Lsn,
        prefix: String,
        content: Vec<u8>,
    },
    /// DDL of transaction `tx` rewrote a captured table's rows in place
    /// (ALTER COLUMN ... TYPE, ADD COLUMN with a volatile default): no
    /// change comes for them, and their values may differ after
    /// ([`super::relation::REWRITE`]). Once per table and transaction.
    Rewritten {
        tx: TxInfo,
        lsn: Lsn,
        table: TableName,
    },
    /// A captured table's columns as an ALTER TABLE of transaction `tx`
    /// left them ([`super::relation::COLUMNS`]), though no change of the
    /// table may follow.
    Described {
        tx: TxInfo,
        lsn: Lsn,
        relation: Arc<RelationInfo>,
    },
    Commit {
        tx: TxInfo,
        /// The position to confirm once this transaction is durable.
        end_lsn: Lsn,
    },
}

impl Event {
    /// The captured table the event is of: none for transaction
    /// boundaries and messages.
    pub(crate) fn table(&self) -> Option<&TableName> {
        match self {
            Event::Change(change) => Some(&change.relation.name),
            Event::Rewritten { table, .. } => Some(table),
            Event::Described { relation, .. } => Some(&relation.name),
            Event::Begin(_) | Event::Message { .. } | Event::Commit { .. } => None,
        }
    }

    /// One JSON object per event, as `wal2iceberg tail` prints it.
    pub fn to_json(&self) -> serde_json::Value {
        let tx_json = |tx: &TxInfo| {
            json!({
                "xid": tx.xid,
                "commit_lsn": tx.commit_lsn.to_string(),
                "commit_ts": temporal::format_timestamp_utc(tx.commit_ts),
            })
        };
        match self {
            Event::Begin(tx) => json!({"event": "begin", "tx": tx_json(tx)}),
            Event::Commit { tx, end_lsn } => {
                json!({"event": "commit", "tx": tx_json(tx), "end_lsn": end_lsn.to_string()})
            }
            Event::Message {
                tx,
                lsn,
                prefix,
                content,
            } => json!({
                "event": "message",
                "xid": tx.map(|t| t.xid),
                "lsn": lsn.to_string(),
                "prefix": prefix,
                "content": String::from_utf8_lossy(content),
            }),
            Event::Rewritten { tx, lsn, table } => json!({
                "event": "rewrite",
                "xid": tx.xid,
                "lsn": lsn.to_string(),
                "table": table.to_string(),
            }),
            Event::Described { tx, lsn, relation } => json!({
                "event": "columns",
                "xid": tx.xid,
                "lsn": lsn.to_string(),
                "table": relation.name.to_string(),
                "columns": relation.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            }),
            Event::Change(c) => {
                let mut out = Map::new();
                out.insert("event".into(), json!("change"));
                out.insert("op".into(), json!(c.op.code()));
                out.insert("table".into(), json!(c.relation.name.to_string()));
                out.insert("commit_lsn".into(), json!(c.tx.commit_lsn.to_string()));
                out.insert("seq".into(), json!(c.seq));
                out.insert("lsn".into(), json!(c.lsn.to_string()));
                out.insert("xid".into(), json!(c.tx.xid));
                if let Some(before) = &c.before {
                    out.insert(
                        "before_kind".into(),
                        json!(match before.kind {
                            ImageKind::Key => "key",
                            ImageKind::Full => "full",
                        }),
                    );
                    out.insert("before".into(), row_json(&c.relation, &before.row));
                }
                if let Some(after) = &c.after {
                    out.insert("after".into(), row_json(&c.relation, after));
                }
                if c.op == Op::Truncate {
                    out.insert("truncate_options".into(), json!(c.truncate_options));
                }
                serde_json::Value::Object(out)
            }
        }
    }
}

/// A row as a JSON object; columns not sent are left out and listed, by
/// name, under `_unchanged_toast` or `_not_sent`, never filled in.
fn row_json(relation: &RelationInfo, row: &[Datum]) -> serde_json::Value {
    let mut out = Map::new();
    let mut unchanged = Vec::new();
    let mut not_sent = Vec::new();
    for (column, datum) in relation.columns.iter().zip(row) {
        match datum {
            Datum::Value(v) => {
                out.insert(column.name.clone(), v.to_json());
            }
            Datum::UnchangedToast => unchanged.push(column.name.clone()),
            Datum::NotSent => not_sent.push(column.name.clone()),
        }
    }
    if !unchanged.is_empty() {
        out.insert("_unchanged_toast".into(), json!(unchanged));
    }
    if !not_sent.is_empty() {
        out.insert("_not_sent".into(), json!(not_sent));
    }
    serde_json::Value::Object(out)
}
