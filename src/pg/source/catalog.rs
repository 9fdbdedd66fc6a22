//! Catalog look-ups: a table's columns, key, OID and types.

use tokio_postgres::Client;

use crate::error::{Error, ErrorKind, Result, postgres};
use crate::model::TableName;

/// One column as the catalog describes it, in the order pgoutput sends
/// columns: by attribute number, without dropped or generated columns.
#[derive(Debug, Clone)]
pub(crate) struct CatalogColumn {
    pub(crate) name: String,
    pub(crate) type_oid: u32,
    pub(crate) type_modifier: i32,
    pub(crate) is_primary_key: bool,
    pub(crate) is_identity_key: bool,
    /// The dimensions an array column was declared with (`int[][]`: 2;
    /// `attndims`, which PostgreSQL records but does not enforce).
    pub(crate) dimensions: i32,
    /// A default (`atthasdef`), or a value the rows before the column
    /// existed read (`atthasmissing`): added later, the column holds
    /// values in rows no change touched.
    pub(crate) has_default: bool,
    /// `attnum`, which a rename keeps and an added column never reuses.
    pub(crate) attnum: i16,
}

#[derive(Debug, Clone)]
pub(crate) struct CatalogTable {
    pub(crate) oid: u32,
    pub(crate) name: TableName,
    /// A partitioned table: its rows are its partitions'.
    pub(crate) partitioned: bool,
    pub(crate) replica_identity: u8,
    pub(crate) columns: Vec<CatalogColumn>,
}

pub(crate) async fn describe_table(client: &Client, table: &TableName) -> Result<CatalogTable> {
    let rows = client
        .query(
            "SELECT c.oid, c.relreplident::text, a.attname::text, a.atttypid, a.atttypmod, \
                    COALESCE(a.attnum = ANY (pk.indkey::int2[]), false), \
                    COALESCE(a.attnum = ANY (ri.indkey::int2[]), false), c.relkind = 'p', \
                    a.attndims::int4, a.atthasdef OR a.atthasmissing, a.attnum \
             FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                                 AND a.attgenerated = '' \
             LEFT JOIN pg_index pk ON pk.indrelid = c.oid AND pk.indisprimary \
             LEFT JOIN pg_index ri ON ri.indrelid = c.oid AND ri.indisreplident \
             WHERE n.nspname = $1 AND c.relname = $2 \
             ORDER BY a.attnum",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(|e| postgres(e, "cannot read the table's columns").with_context("table", table))?;
    let first = rows.first().ok_or_else(|| {
        Error::new(
            ErrorKind::Preflight,
            format!("table {table} does not exist or has no columns"),
        )
    })?;
    let replident: String = first.get(1);
    let identity = replident.as_bytes().first().copied().unwrap_or(b'd');
    Ok(CatalogTable {
        oid: first.get(0),
        name: table.clone(),
        partitioned: first.get(7),
        replica_identity: identity,
        columns: rows
            .iter()
            .map(|r| {
                let is_pk: bool = r.get(5);
                let in_identity_index: bool = r.get(6);
                CatalogColumn {
                    name: r.get(2),
                    type_oid: r.get(3),
                    type_modifier: r.get(4),
                    is_primary_key: is_pk,
                    is_identity_key: match identity {
                        b'f' => true,
                        b'i' => in_identity_index,
                        _ => is_pk,
                    },
                    dimensions: r.get(8),
                    has_default: r.get(9),
                    attnum: r.get(10),
                }
            })
            .collect(),
    })
}

/// The OID of a table, as it is named now.
pub(crate) async fn table_oid(client: &Client, table: &TableName) -> Result<u32> {
    client
        .query_one("SELECT $1::text::regclass::oid", &[&table.quoted()])
        .await
        .map(|row| row.get(0))
        .map_err(|e| postgres(e, "cannot find the table").with_context("table", table))
}

/// The name of the table of OID `oid` now; `None` when there is none.
pub(crate) async fn table_of_oid(client: &Client, oid: u32) -> Result<Option<TableName>> {
    let row = client
        .query_opt(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
            &[&oid],
        )
        .await
        .map_err(|e| postgres(e, "cannot find the table").with_context("relation_oid", oid))?;
    Ok(row.map(|r| TableName {
        schema: r.get(0),
        name: r.get(1),
    }))
}

/// Whether a table of that name exists.
pub(crate) async fn table_exists(client: &Client, table: &TableName) -> Result<bool> {
    client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table.quoted()])
        .await
        .map(|row| row.get(0))
        .map_err(|e| postgres(e, "cannot find the table").with_context("table", table))
}

/// The primary-key column names of a relation, by OID, in key order.
pub(crate) async fn primary_key(client: &Client, relation_oid: u32) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT a.attname::text FROM pg_index i \
             JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) ON true \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.ord",
            &[&relation_oid],
        )
        .await
        .map_err(|e| {
            postgres(e, "cannot read the primary key").with_context("relation_oid", relation_oid)
        })?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// What the catalog knows of a column beyond what a Relation message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ColumnFacts {
    pub(crate) name: String,
    /// [`CatalogColumn::dimensions`].
    pub(crate) dimensions: i32,
    /// [`CatalogColumn::has_default`].
    pub(crate) has_default: bool,
    /// [`CatalogColumn::attnum`].
    pub(crate) attnum: i16,
    pub(crate) type_oid: u32,
}

/// The columns of a relation, by OID, with [`ColumnFacts`], in the order
/// pgoutput sends them.
pub(crate) async fn column_facts(client: &Client, relation_oid: u32) -> Result<Vec<ColumnFacts>> {
    let rows = client
        .query(
            "SELECT attname::text, attndims::int4, atthasdef OR atthasmissing, attnum, atttypid \
             FROM pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' \
             ORDER BY attnum",
            &[&relation_oid],
        )
        .await
        .map_err(|e| {
            postgres(e, "cannot read the table's columns")
                .with_context("relation_oid", relation_oid)
        })?;
    Ok(rows
        .iter()
        .map(|r| ColumnFacts {
            name: r.get(0),
            dimensions: r.get(1),
            has_default: r.get(2),
            attnum: r.get(3),
            type_oid: r.get(4),
        })
        .collect())
}

/// What `pg_type` says about a type, enough to decode its text output.
#[derive(Debug, Clone)]
pub(crate) struct CatalogType {
    /// `b` base, `d` domain, `e` enum, `c` composite, `r` range, ...
    pub(crate) typtype: u8,
    /// For a domain: the type it is based on.
    pub(crate) base_type: u32,
    /// For an array: the element type (0 otherwise).
    pub(crate) element_type: u32,
    /// `A` for arrays.
    pub(crate) category: u8,
    /// For an array: what separates its elements in its text form, the
    /// element type's `typdelim` (`;` for `box`, `,` for nearly all).
    pub(crate) element_delimiter: u8,
}

pub(crate) async fn describe_type(client: &Client, oid: u32) -> Result<Option<CatalogType>> {
    let row = client
        .query_opt(
            "SELECT t.typtype::text, t.typbasetype, t.typelem, t.typcategory::text, \
                    coalesce((SELECT e.typdelim::text FROM pg_type e WHERE e.oid = t.typelem), ',') \
             FROM pg_type t WHERE t.oid = $1",
            &[&oid],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_type").with_context("type_oid", oid))?;
    let byte = |s: String| s.as_bytes().first().copied().unwrap_or(b'?');
    Ok(row.map(|r| CatalogType {
        typtype: byte(r.get(0)),
        base_type: r.get(1),
        element_type: r.get(2),
        category: byte(r.get(3)),
        element_delimiter: byte(r.get(4)),
    }))
}
