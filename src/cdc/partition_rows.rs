//! Rows of a partitioned table published via its root that change with no
//! change of that table in the WAL: the rows a partition held when it was
//! attached (written as the standalone table's), the rows a TRUNCATE
//! of one partition removes (not published under
//! `publish_via_partition_root`), and the key of a row about to move to
//! another partition (decoded as a delete and an insert). The triggers of
//! `migrations/004_wal2iceberg_partition_rows.sql` write each into the
//! same transaction as a transactional logical message: `{"schema": ..,
//! "table": .., "row": {column: text or null, ..}}`, each value in the
//! text form pgoutput sends, the whole row when attached, the key when
//! truncated or moving. The assembler turns them into reads and deletes
//! of the partitioned table at their place in the stream, and a moved
//! row's delete and insert into an update (docs/tables.md, Partitioned
//! tables).

use std::collections::HashMap;

use serde::Deserialize;

use super::event::{BeforeImage, Datum, ImageKind, Op};
use super::relation::RelationInfo;
use super::value::Value;
use crate::error::{Error, ErrorKind, Result};
use crate::model::Lsn;
use crate::model::TableName;

/// The prefixes of the triggers' messages.
pub(crate) const ATTACHED: &str = "wal2iceberg.attached_row";
pub(crate) const TRUNCATED: &str = "wal2iceberg.truncated_row";

/// The key of a row an update of a partition key column is about to move:
/// when the server then sends its delete and, next, an insert, they are
/// one update ([`crate::cdc::assembler`]).
pub(crate) const MOVING: &str = "wal2iceberg.moving_row";

/// Written after each trigger's messages, which keeps the changes that
/// follow after them (migrations/004): it carries nothing.
pub(crate) const FENCE: &str = "wal2iceberg.fence";

/// A trigger that failed, which let the user's command go through: the
/// lake misses rows it should have sent.
pub(crate) const FAILED: &str = "wal2iceberg.partition_rows_failed";

/// Logs a [`FAILED`] message as the error it reports; the run goes on.
pub(crate) fn log_failure(content: &[u8], lsn: Lsn) {
    #[derive(Deserialize)]
    struct Failure {
        table: String,
        what: String,
        error: String,
    }
    match serde_json::from_slice::<Failure>(content) {
        Ok(f) => tracing::error!(
            table = %f.table, %lsn, error = %f.error,
            "the source's partition trigger failed to send the {} (the command itself went \
             through): the lake misses them. Reload the partitioned table it belongs \
             to: wal2iceberg resync --table <it>",
            f.what
        ),
        Err(_) => tracing::error!(
            %lsn,
            "a partition trigger of the source failed: the lake misses rows of a partitioned table"
        ),
    }
}

/// The change a message with `prefix` stands for, if it is one of ours.
pub(crate) fn op_of(prefix: &str) -> Option<Op> {
    match prefix {
        ATTACHED => Some(Op::Read),
        TRUNCATED => Some(Op::Delete),
        _ => None,
    }
}

/// One row, as its message carries it.
#[derive(Debug, Deserialize)]
pub(crate) struct PartitionRow {
    schema: String,
    table: String,
    row: HashMap<String, Option<String>>,
}

impl PartitionRow {
    pub(crate) fn parse(prefix: &str, content: &[u8], lsn: Lsn) -> Result<PartitionRow> {
        serde_json::from_slice(content).map_err(|e| {
            Error::new(
                ErrorKind::Protocol,
                format!("a {prefix} message is not the JSON its trigger writes"),
            )
            .with_context("lsn", lsn)
            .with_source(e)
        })
    }

    /// The partitioned table the row is one of.
    pub(crate) fn table(&self) -> TableName {
        TableName {
            schema: self.schema.clone(),
            name: self.table.clone(),
        }
    }

    /// An attached row in `relation`'s column order. A column the message
    /// lacks (added after the attach) is null, as it is for the table's
    /// other rows then; a column the relation lacks (dropped since) is
    /// ignored.
    pub(crate) fn decode(mut self, relation: &RelationInfo, lsn: Lsn) -> Result<Vec<Datum>> {
        relation
            .columns
            .iter()
            .map(|column| match self.row.remove(&column.name).flatten() {
                None => Ok(Datum::Value(Value::Null)),
                Some(text) => relation.parse_text(column, &text, lsn).map(Datum::Value),
            })
            .collect()
    }

    /// Whether `before`, a delete's before image of `relation`, is this
    /// row: each value the message holds is the same there.
    pub(crate) fn same_row(self, relation: &RelationInfo, before: &BeforeImage, lsn: Lsn) -> bool {
        let Ok(marked) = self.decode_key(relation, lsn) else {
            return false;
        };
        marked
            .row
            .iter()
            .zip(&before.row)
            .all(|(m, b)| matches!(m, Datum::NotSent) || m == b)
    }

    /// A truncated row's before image: its key, or the whole row for a
    /// table without one.
    pub(crate) fn decode_key(mut self, relation: &RelationInfo, lsn: Lsn) -> Result<BeforeImage> {
        let whole = relation
            .columns
            .iter()
            .all(|c| self.row.contains_key(&c.name));
        let row = relation
            .columns
            .iter()
            .map(|column| match self.row.remove(&column.name) {
                None => Ok(Datum::NotSent),
                Some(None) => Ok(Datum::Value(Value::Null)),
                Some(Some(text)) => relation.parse_text(column, &text, lsn).map(Datum::Value),
            })
            .collect::<Result<_>>()?;
        Ok(BeforeImage {
            kind: if whole {
                ImageKind::Full
            } else {
                ImageKind::Key
            },
            row,
        })
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
        let row = PartitionRow::parse(ATTACHED, content, Lsn(1)).unwrap();
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
        let err = PartitionRow::parse(TRUNCATED, b"{\"schema\": 1}", Lsn(0x10))
            .unwrap_err()
            .to_string();
        assert!(err.contains(TRUNCATED) && err.contains("0/10"), "{err}");
    }

    #[test]
    fn a_truncated_row_is_a_key_image_unless_the_message_holds_every_column() {
        let rel = relation(vec![
            column("id", PgType::Int4, -1, true),
            column("note", PgType::Text, -1, false),
        ]);
        let key = br#"{"schema": "public", "table": "t", "row": {"id": "7"}}"#;
        let image = PartitionRow::parse(TRUNCATED, key, Lsn(1))
            .unwrap()
            .decode_key(&rel, Lsn(1))
            .unwrap();
        assert_eq!(image.kind, ImageKind::Key);
        assert_eq!(
            image.row,
            vec![Datum::Value(Value::Int4(7)), Datum::NotSent]
        );
        let whole = br#"{"schema": "public", "table": "t", "row": {"id": "7", "note": null}}"#;
        let image = PartitionRow::parse(TRUNCATED, whole, Lsn(1))
            .unwrap()
            .decode_key(&rel, Lsn(1))
            .unwrap();
        assert_eq!(image.kind, ImageKind::Full);
        assert_eq!(image.row[1], Datum::Value(Value::Null));
    }
}
