//! Rows a partition already held when it was attached to a partitioned
//! table. They never pass through the WAL as changes of that table, so the
//! event trigger of `migrations/004_wal2iceberg_attached_rows.sql` writes
//! each into the attaching transaction as a transactional logical message:
//! `{"schema": .., "table": .., "row": {column: text or null, ..}}`, each
//! value in the text form pgoutput sends. The assembler turns each into an
//! [`super::event::Op::Read`] change of the partitioned table, at the
//! attach's place in the stream (docs/tables.md, Partitioned tables).

use std::collections::HashMap;

use serde::Deserialize;

use super::event::Datum;
use super::relation::RelationInfo;
use super::value::Value;
use crate::error::{Error, ErrorKind, Result};
use crate::pg::lsn::Lsn;
use crate::pg::source::TableName;

/// The prefix of the trigger's messages.
pub const PREFIX: &str = "wal2iceberg.attached_row";

/// One attached row, as its message carries it.
#[derive(Debug, Deserialize)]
pub struct AttachedRow {
    schema: String,
    table: String,
    row: HashMap<String, Option<String>>,
}

impl AttachedRow {
    pub fn parse(content: &[u8], lsn: Lsn) -> Result<AttachedRow> {
        serde_json::from_slice(content).map_err(|e| {
            Error::new(
                ErrorKind::Protocol,
                format!("a {PREFIX} message is not the JSON its trigger writes"),
            )
            .with_context("lsn", lsn)
            .with_source(e)
        })
    }

    /// The partitioned table the row was attached to.
    pub fn table(&self) -> TableName {
        TableName {
            schema: self.schema.clone(),
            name: self.table.clone(),
        }
    }

    /// The row in `relation`'s column order. A column the message lacks
    /// (added after the attach) is null, as it is for the table's other
    /// rows then; a column the relation lacks (dropped since) is ignored.
    pub fn decode(mut self, relation: &RelationInfo, lsn: Lsn) -> Result<Vec<Datum>> {
        relation
            .columns
            .iter()
            .map(|column| match self.row.remove(&column.name).flatten() {
                None => Ok(Datum::Value(Value::Null)),
                Some(text) => relation.parse_text(column, &text, lsn).map(Datum::Value),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdc::relation::fixtures::{column, relation};
    use crate::cdc::value::PgType;

    #[test]
    fn a_row_decodes_by_column_name_whatever_the_order_and_missing_columns_are_null() {
        let rel = relation(vec![
            column("id", PgType::Int4, -1, true),
            column("note", PgType::Text, -1, false),
            column("added", PgType::Int4, -1, false),
        ]);
        let content = br#"{"schema": "public", "table": "t",
            "row": {"note": "a \"quoted\" {brace}", "gone": "x", "id": "7"}}"#;
        let row = AttachedRow::parse(content, Lsn(1)).unwrap();
        assert_eq!(row.table(), TableName::parse("public.t").unwrap());
        assert_eq!(
            row.decode(&rel, Lsn(1)).unwrap(),
            vec![
                Datum::Value(Value::Int4(7)),
                Datum::Value(Value::Text("a \"quoted\" {brace}".into())),
                Datum::Value(Value::Null),
            ]
        );
    }

    #[test]
    fn a_message_that_is_not_the_triggers_json_is_an_error_naming_its_lsn() {
        let err = AttachedRow::parse(b"{\"schema\": 1}", Lsn(0x10))
            .unwrap_err()
            .to_string();
        assert!(err.contains(PREFIX) && err.contains("0/10"), "{err}");
    }
}
