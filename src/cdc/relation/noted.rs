//! What the DDL triggers note in the stream (migrations 005 and 006):
//! a table's columns after each ALTER TABLE, and the tables a DDL
//! statement is about to rewrite.

use super::RelationInfo;
use crate::error::{Error, ErrorKind, Result};
use crate::model::TableName;
use crate::pg::pgoutput::{self};

/// The prefix of the message migration 005's event trigger writes after
/// each ALTER TABLE: `{"schema", "table", "columns": [[name, attnum,
/// has_default], ...]}`, the columns in the order pgoutput sends them.
pub(crate) const COLUMNS: &str = "wal2iceberg.columns";

/// A column as a [`COLUMNS`] message gives it: `[name, attnum,
/// has_default, type_oid, type_modifier]`, `has_default` as
/// [`ColumnFacts::has_default`]; the type since migration 006.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct NotedColumn {
    pub(super) name: String,
    pub(super) attnum: i16,
    pub(super) has_default: bool,
    #[serde(default)]
    pub(super) type_oid: Option<u32>,
    #[serde(default)]
    pub(super) type_modifier: Option<i32>,
}

/// A table's name, OID (since migration 006) and columns as a [`COLUMNS`]
/// message gives them.
pub(crate) fn parse_columns(content: &[u8]) -> Result<(TableName, Option<u32>, Vec<NotedColumn>)> {
    #[derive(serde::Deserialize)]
    struct Noted {
        schema: String,
        table: String,
        #[serde(default)]
        oid: Option<u32>,
        columns: Vec<NotedColumn>,
    }
    let noted: Noted = serde_json::from_slice(content).map_err(|e| {
        Error::new(ErrorKind::Protocol, "a column-numbers message is not ours").with_source(e)
    })?;
    let table = TableName {
        schema: noted.schema,
        name: noted.table,
    };
    Ok((table, noted.oid, noted.columns))
}

/// The prefix of the message migration 006's event trigger writes before
/// DDL rewrites a table's rows: `{"tables": [[schema, name], ...],
/// "reason": n}`, the table and its partition ancestors.
pub(crate) const REWRITE: &str = "wal2iceberg.rewrite";

/// The reason bit of a rewrite that keeps every value: a new access
/// method (`AT_REWRITE_ACCESS_METHOD`).
pub(super) const REWRITE_ACCESS_METHOD: i32 = 8;

/// The tables a [`REWRITE`] message names, with their OIDs, whose values
/// the rewrite may have changed: any but a new access method alone.
pub(crate) fn parse_rewrite(content: &[u8]) -> Result<Vec<(TableName, u32)>> {
    #[derive(serde::Deserialize)]
    struct Rewrite {
        tables: Vec<(String, String, u32)>,
        reason: i32,
    }
    let rewrite: Rewrite = serde_json::from_slice(content).map_err(|e| {
        Error::new(ErrorKind::Protocol, "a rewrite message is not ours").with_source(e)
    })?;
    if rewrite.reason & !REWRITE_ACCESS_METHOD == 0 {
        return Ok(Vec::new());
    }
    Ok(rewrite
        .tables
        .into_iter()
        .map(|(schema, name, oid)| (TableName { schema, name }, oid))
        .collect())
}

/// The Relation of table `oid`, named `table`, as a [`COLUMNS`] message
/// gives its columns at a DDL statement; which of them are of the replica
/// identity, and the identity's kind, from `base`, the table as the stream
/// last described it, if it did. `None` when the message has no types
/// (migration 005 without 006).
pub(crate) fn relation_at_ddl(
    base: Option<&RelationInfo>,
    oid: u32,
    table: &TableName,
    columns: &[NotedColumn],
) -> Option<pgoutput::Relation> {
    let based = base.map_or(&[][..], |b| &b.columns[..]);
    let columns = columns
        .iter()
        .map(|c| {
            let is_key = based
                .iter()
                .find(|b| b.attnum == Some(c.attnum))
                .or_else(|| based.iter().find(|b| b.name == c.name))
                .is_some_and(|b| b.is_identity_key);
            Some(pgoutput::RelationColumn {
                is_key,
                name: c.name.clone(),
                type_oid: c.type_oid?,
                type_modifier: c.type_modifier?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(pgoutput::Relation {
        oid,
        namespace: table.schema.clone(),
        name: table.name.clone(),
        replica_identity: base.map_or(b'd', |b| b.replica_identity),
        columns,
    })
}
