//! Relations as the change stream knows them, the cache that keeps them by
//! OID, and the catalog look-ups that complete what pgoutput sends.
//!
//! A Relation message carries column names, type OIDs and the replica
//! identity flags, but not the primary key (under REPLICA IDENTITY FULL
//! every column is flagged) and not what a user-defined type is. Both come
//! from the catalog, read when the Relation message arrives. The server
//! sends the message again after the table's definition changed; the cache
//! entry is then replaced, and changes already emitted keep the `Arc` of the
//! definition they were decoded with.

mod noted;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

pub(crate) use self::noted::{
    COLUMNS, NotedColumn, REWRITE, parse_columns, parse_rewrite, relation_at_ddl,
};
use super::value::{Datum, PgType, Value, ValueError, Wire};
use crate::error::{Error, ErrorKind, Result};
use crate::model::Lsn;
use crate::model::TableName;
use crate::pg::pgoutput::{self, TupleValue};
use crate::pg::source::{self, CatalogTable, ColumnFacts, SourceClient};

#[derive(Debug, Clone, PartialEq)]
pub struct ColumnInfo {
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
    pub pg_type: PgType,
    /// Part of the replica identity: sent in a key-only before image.
    pub is_identity_key: bool,
    pub is_primary_key: bool,
    /// A default, or a value the rows before the column read
    /// ([`crate::pg::source::CatalogColumn::has_default`]).
    pub has_default: bool,
    /// `pg_attribute.attnum`, which a rename keeps and an added column
    /// never reuses; `None` where the catalog had moved on when asked
    /// ([`RelationInfo::from_message`], docs/tables.md, Schema changes).
    pub attnum: Option<i16>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RelationInfo {
    pub oid: u32,
    pub name: TableName,
    /// `relreplident`: `d` default, `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    pub columns: Vec<ColumnInfo>,
    /// Whether the catalog, read when the relation was described, gave
    /// the table a primary key: also when none of these columns is
    /// marked as one, because the key's columns were renamed since.
    pub has_primary_key: bool,
}

/// The table a Relation message names; pgoutput sends an empty namespace
/// for pg_catalog.
pub(crate) fn message_table(rel: &pgoutput::Relation) -> TableName {
    TableName {
        schema: match rel.namespace.as_str() {
            "" => "pg_catalog".to_owned(),
            namespace => namespace.to_owned(),
        },
        name: rel.name.clone(),
    }
}

/// How a tuple is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TupleRole {
    /// A new tuple, or a complete old one.
    Complete,
    /// A key-only old tuple: non-key columns arrive as `n` but were not sent.
    KeyOnly,
}

impl RelationInfo {
    /// The relation of a Relation message, with its primary key, each
    /// column's type as the catalog resolved them, and each column's
    /// number where it is known and whether it has a default
    /// ([`Catalog::known`]).
    fn from_message(
        rel: pgoutput::Relation,
        primary_key: &[String],
        types: Vec<PgType>,
        known: Vec<(Option<i16>, bool)>,
    ) -> RelationInfo {
        let name = message_table(&rel);
        let columns = rel
            .columns
            .into_iter()
            .zip(types)
            .zip(known)
            .map(|((c, pg_type), (attnum, has_default))| ColumnInfo {
                pg_type,
                is_primary_key: primary_key.contains(&c.name),
                has_default,
                attnum,
                name: c.name,
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
                is_identity_key: c.is_key,
            })
            .collect();
        RelationInfo {
            oid: rel.oid,
            name,
            replica_identity: rel.replica_identity,
            columns,
            has_primary_key: !primary_key.is_empty(),
        }
    }

    /// Decodes a pgoutput tuple into a row of this relation.
    pub(crate) fn decode_tuple(
        &self,
        values: Vec<TupleValue>,
        role: TupleRole,
        lsn: Lsn,
    ) -> Result<Vec<Datum>> {
        if values.len() != self.columns.len() {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "tuple has {} columns, the relation has {}",
                    values.len(),
                    self.columns.len()
                ),
            )
            .with_context("table", &self.name)
            .with_context("lsn", lsn));
        }
        values
            .into_iter()
            .zip(&self.columns)
            .map(|(value, column)| match value {
                TupleValue::Null if role == TupleRole::KeyOnly && !column.is_identity_key => {
                    Ok(Datum::NotSent)
                }
                TupleValue::Null => Ok(Datum::Value(Value::Null)),
                TupleValue::UnchangedToast => Ok(Datum::UnchangedToast),
                TupleValue::Text(bytes) => {
                    let text = std::str::from_utf8(&bytes).map_err(|e| {
                        self.decode_error(column, lsn, "the value is not valid UTF-8")
                            .with_source(e)
                    })?;
                    self.parse_text(column, text, lsn).map(Datum::Value)
                }
                TupleValue::Binary(_) => Err(self.decode_error(
                    column,
                    lsn,
                    "the server sent a binary value, which we did not request",
                )),
            })
            .collect()
    }

    /// A column's value from its text output. Text that does not decode
    /// as the column's type (a timestamp past the year 294246, or a shape
    /// our parser does not know) is kept as itself, [`Value::Unknown`],
    /// which the lake stores verbatim (docs/values.md), with a warning the
    /// first time a column has one; only a key column, which must decode,
    /// is an error.
    pub(crate) fn parse_text(&self, column: &ColumnInfo, text: &str, lsn: Lsn) -> Result<Value> {
        match column.pg_type.parse(text) {
            Ok(value) => Ok(value),
            Err(e) if column.is_primary_key => Err(self.value_error(column, lsn, e)),
            Err(e) => {
                warn_kept_as_text(&self.name, &column.name, lsn, &e);
                Ok(Value::Unknown(text.to_owned()))
            }
        }
    }

    /// A field of `column` as the initial load's COPY sends it, `wire`;
    /// text decodes as [`Self::parse_text`] decodes it.
    pub(crate) fn decode_field(
        &self,
        column: &ColumnInfo,
        wire: Wire,
        bytes: &[u8],
        lsn: Lsn,
    ) -> Result<Value> {
        match (wire, std::str::from_utf8(bytes)) {
            (Wire::Text, Ok(text)) => self.parse_text(column, text, lsn),
            _ => wire
                .decode(&column.pg_type, bytes)
                .map_err(|e| self.value_error(column, lsn, e)),
        }
    }

    /// A value of `column` that did not decode, with its context.
    pub(crate) fn value_error(&self, column: &ColumnInfo, lsn: Lsn, e: ValueError) -> Error {
        self.decode_error(column, lsn, "cannot decode a value")
            .with_source(e)
    }

    fn decode_error(&self, column: &ColumnInfo, lsn: Lsn, message: &str) -> Error {
        Error::new(ErrorKind::Decode, message.to_owned())
            .with_context("table", &self.name)
            .with_context("column", &column.name)
            .with_context("lsn", lsn)
    }
}

/// Logs, once per column and process, that a value of it was kept as text.
fn warn_kept_as_text(table: &TableName, column: &str, lsn: Lsn, error: &ValueError) {
    static WARNED: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());
    let first = WARNED
        .lock()
        .map(|mut warned| warned.insert((table.to_string(), column.to_owned())))
        .unwrap_or(true);
    if first {
        tracing::warn!(
            %table, column, %lsn, error = %error,
            "a value does not decode as its column's type: kept as its text in _cdc_verbatim \
             (docs/values.md); later values of this column that do not decode are kept alike \
             without this warning"
        );
    }
}

/// Resolves types and keys through the source's catalog, caching types.
pub(crate) struct Catalog {
    client: Arc<SourceClient>,
    types: HashMap<u32, PgType>,
    /// Each table's columns and their numbers as the last DDL the stream
    /// passed left them ([`COLUMNS`]).
    noted: HashMap<TableName, Vec<NotedColumn>>,
}

/// Domains over domains over arrays...: a bound against a cyclic catalog.
const MAX_TYPE_DEPTH: usize = 16;

/// PostgreSQL's arrays have at most six dimensions (`MAXDIM`).
const MAX_ARRAY_DIMENSIONS: i32 = 6;

impl Catalog {
    pub(crate) fn new(client: Arc<SourceClient>) -> Catalog {
        Catalog {
            client,
            types: HashMap::new(),
            noted: HashMap::new(),
        }
    }

    pub(crate) fn client(&self) -> &Arc<SourceClient> {
        &self.client
    }

    /// The decoding of a type: built-ins directly; domains as their base
    /// type, enums as labels, arrays by element; anything else as text.
    pub(crate) async fn resolve_type(&mut self, oid: u32) -> Result<PgType> {
        self.resolve_type_at(oid, 0).await
    }

    /// A column's type: an array declared with more dimensions
    /// (`int[][]`) is an array of arrays, each level a nested list in the
    /// lake; its values of other dimensions are kept verbatim.
    async fn column_type(&mut self, oid: u32, dimensions: i32) -> Result<PgType> {
        let mut pg_type = self.resolve_type(oid).await?;
        if matches!(pg_type, PgType::Array(_)) {
            for _ in 1..dimensions.clamp(1, MAX_ARRAY_DIMENSIONS) {
                pg_type = PgType::Array(Box::new(pg_type));
            }
        }
        Ok(pg_type)
    }

    async fn resolve_type_at(&mut self, oid: u32, depth: usize) -> Result<PgType> {
        if let Some(t) = PgType::builtin(oid) {
            return Ok(t);
        }
        if let Some(t) = self.types.get(&oid) {
            return Ok(t.clone());
        }
        let resolved = match source::describe_type(&self.client, oid).await? {
            _ if depth >= MAX_TYPE_DEPTH => PgType::Unknown,
            None => PgType::Unknown,
            Some(t) if t.typtype == b'd' => {
                Box::pin(self.resolve_type_at(t.base_type, depth + 1)).await?
            }
            Some(t) if t.typtype == b'e' => PgType::Enum,
            Some(t) if t.category == b'A' && t.element_type != 0 && t.element_delimiter != b',' => {
                PgType::OpaqueArray
            }
            Some(t) if t.category == b'A' && t.element_type != 0 => PgType::Array(Box::new(
                Box::pin(self.resolve_type_at(t.element_type, depth + 1)).await?,
            )),
            Some(_) => PgType::Unknown,
        };
        self.types.insert(oid, resolved.clone());
        Ok(resolved)
    }

    /// The relation a pgoutput Relation message describes.
    pub(crate) async fn relation_from_message(
        &mut self,
        rel: pgoutput::Relation,
    ) -> Result<RelationInfo> {
        // Under the default replica identity the message's key columns
        // are the primary key's at the message's place in the stream; the
        // catalog, read now, may already hold a later key (a replay after
        // a restart meets the changes of every key the table had). A
        // message may flag no column (PostgreSQL sends some, after a table
        // rewrite, without them): then, and when both name the same
        // columns, the catalog's key stands, in its declared order.
        let catalog_key = source::primary_key(&self.client, rel.oid).await?;
        let flagged = flagged_key(&rel);
        let same_columns =
            flagged.len() == catalog_key.len() && flagged.iter().all(|c| catalog_key.contains(c));
        let primary_key = if rel.replica_identity != b'd' || flagged.is_empty() || same_columns {
            catalog_key
        } else {
            flagged
        };
        let facts = source::column_facts(&self.client, rel.oid).await?;
        let of = |name: &str| facts.iter().find(|f| f.name == name);
        let mut types = Vec::with_capacity(rel.columns.len());
        for c in &rel.columns {
            let declared = of(&c.name).map_or(1, |f| f.dimensions);
            types.push(self.column_type(c.type_oid, declared).await?);
        }
        let known = self.known(&rel, &facts);
        Ok(RelationInfo::from_message(rel, &primary_key, types, known))
    }

    /// The number of each of a Relation message's columns, where it is
    /// known, and whether it has a default. The message carries neither,
    /// and the catalog, read when the message is decoded, may be at later
    /// DDL of the table. Taken from what the stream noted at the table's
    /// last DDL ([`COLUMNS`]) while its columns are still the message's;
    /// else the numbers from the catalog while its columns are the
    /// message's (names and types, in order), and the defaults from it by
    /// name (docs/tables.md, Schema changes).
    fn known(&self, rel: &pgoutput::Relation, facts: &[ColumnFacts]) -> Vec<(Option<i16>, bool)> {
        if let Some(noted) = self.noted.get(&message_table(rel)).filter(|noted| {
            noted.len() == rel.columns.len()
                && noted
                    .iter()
                    .zip(&rel.columns)
                    .all(|(n, c)| n.name == c.name)
        }) {
            return noted
                .iter()
                .map(|n| (Some(n.attnum), n.has_default))
                .collect();
        }
        let current = facts.len() == rel.columns.len()
            && facts
                .iter()
                .zip(&rel.columns)
                .all(|(f, c)| f.name == c.name && f.type_oid == c.type_oid);
        rel.columns
            .iter()
            .map(|c| {
                let fact = facts.iter().find(|f| f.name == c.name);
                (
                    fact.map(|f| f.attnum).filter(|_| current),
                    fact.is_some_and(|f| f.has_default),
                )
            })
            .collect()
    }

    /// The relation as the catalog describes it now (for the initial load).
    pub(crate) async fn relation_from_table(
        &mut self,
        table: &CatalogTable,
    ) -> Result<RelationInfo> {
        let mut columns = Vec::with_capacity(table.columns.len());
        for c in &table.columns {
            columns.push(ColumnInfo {
                name: c.name.clone(),
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
                pg_type: self.column_type(c.type_oid, c.dimensions).await?,
                is_identity_key: c.is_identity_key,
                is_primary_key: c.is_primary_key,
                has_default: c.has_default,
                attnum: Some(c.attnum),
            });
        }
        Ok(RelationInfo {
            oid: table.oid,
            name: table.name.clone(),
            replica_identity: table.replica_identity,
            has_primary_key: columns.iter().any(|c| c.is_primary_key),
            columns,
        })
    }
}

/// Completes what a Relation message says into a relation: in a run, the
/// source's [`Catalog`].
pub(crate) trait Describe {
    fn describe(
        &mut self,
        rel: pgoutput::Relation,
    ) -> impl Future<Output = Result<RelationInfo>> + Send;

    /// A table the stream has not described yet, as it is now; `None`
    /// when it cannot say.
    fn describe_table(
        &mut self,
        table: &TableName,
    ) -> impl Future<Output = Result<Option<RelationInfo>>> + Send;

    /// Notes a table's columns and their numbers as a DDL statement left
    /// them, at its place in the stream ([`COLUMNS`]).
    fn note_columns(&mut self, table: TableName, columns: Vec<NotedColumn>);
}

impl Describe for Catalog {
    fn describe(
        &mut self,
        rel: pgoutput::Relation,
    ) -> impl Future<Output = Result<RelationInfo>> + Send {
        self.relation_from_message(rel)
    }

    async fn describe_table(&mut self, table: &TableName) -> Result<Option<RelationInfo>> {
        let described = source::describe_table(&self.client, table).await?;
        self.relation_from_table(&described).await.map(Some)
    }

    fn note_columns(&mut self, table: TableName, columns: Vec<NotedColumn>) {
        self.noted.insert(table, columns);
    }
}

/// The columns a Relation message flags as its replica identity's, in
/// the message's (the table's) order.
fn flagged_key(rel: &pgoutput::Relation) -> Vec<String> {
    rel.columns
        .iter()
        .filter(|c| c.is_key)
        .map(|c| c.name.clone())
        .collect()
}

/// Describes a relation from its Relation message alone, without a server:
/// built-in types, anything else as text, and the replica identity's
/// columns as the primary key. For the assembler's property test and fuzz
/// target.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) struct MessageOnly;

#[cfg(any(test, feature = "fuzzing"))]
impl Describe for MessageOnly {
    async fn describe(&mut self, rel: pgoutput::Relation) -> Result<RelationInfo> {
        let primary_key = flagged_key(&rel);
        let types = rel
            .columns
            .iter()
            .map(|c| PgType::builtin(c.type_oid).unwrap_or(PgType::Unknown))
            .collect();
        let known = vec![(None, false); rel.columns.len()];
        Ok(RelationInfo::from_message(rel, &primary_key, types, known))
    }

    async fn describe_table(&mut self, _table: &TableName) -> Result<Option<RelationInfo>> {
        Ok(None)
    }

    fn note_columns(&mut self, _table: TableName, _columns: Vec<NotedColumn>) {}
}

/// Relations by OID, as last described by the server.
#[derive(Default)]
pub(crate) struct RelationCache {
    by_oid: HashMap<u32, Arc<RelationInfo>>,
}

impl RelationCache {
    pub(crate) fn insert(&mut self, relation: RelationInfo) -> Arc<RelationInfo> {
        let relation = Arc::new(relation);
        self.by_oid.insert(relation.oid, relation.clone());
        relation
    }

    /// The relation the stream last described under `name`.
    pub(crate) fn named(&self, name: &TableName) -> Option<Arc<RelationInfo>> {
        self.by_oid.values().find(|r| &r.name == name).cloned()
    }

    /// The relation for a change; the server always describes a relation
    /// before its first change, so a miss is a protocol error.
    pub(crate) fn get(&self, oid: u32, lsn: Lsn) -> Result<Arc<RelationInfo>> {
        self.by_oid.get(&oid).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                "a change names a relation the server never described",
            )
            .with_context("relation_oid", oid)
            .with_context("lsn", lsn)
        })
    }
}

/// Relations for unit tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::{ColumnInfo, RelationInfo};
    use crate::cdc::value::PgType;
    use crate::model::TableName;

    pub(crate) fn column(
        name: &str,
        pg_type: PgType,
        type_modifier: i32,
        is_primary_key: bool,
    ) -> ColumnInfo {
        ColumnInfo {
            name: name.to_owned(),
            type_oid: 0,
            type_modifier,
            pg_type,
            is_identity_key: is_primary_key,
            is_primary_key,
            has_default: false,
            attnum: None,
        }
    }

    /// The type modifier of numeric(precision, scale).
    pub(crate) fn typmod(precision: i32, scale: i32) -> i32 {
        ((precision << 16) | (scale & 0x7ff)) + 4
    }

    /// `public.customers` with these columns.
    pub(crate) fn relation(columns: Vec<ColumnInfo>) -> RelationInfo {
        RelationInfo {
            oid: 1,
            name: TableName::parse("public.customers").unwrap(),
            replica_identity: b'd',
            has_primary_key: columns.iter().any(|c| c.is_primary_key),
            columns,
        }
    }
}

#[cfg(test)]
mod tests;
