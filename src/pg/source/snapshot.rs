//! The exported snapshot's transaction and the COPY that reads a table
//! in it.

use std::pin::Pin;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio_postgres::{Client, CopyOutStream};

use super::CatalogTable;
use crate::error::{Error, ErrorKind, Result, postgres};
use crate::model::TableName;
use crate::pg::replication::quote_ident;

/// Opens the snapshot an exported slot snapshot names, in a read-only
/// repeatable-read transaction on this connection. Must run while the
/// replication connection that exported it sends nothing else.
pub(crate) async fn begin_snapshot(client: &Client, snapshot_name: &str) -> Result<()> {
    client
        .batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{}'",
            snapshot_name.replace('\'', "''")
        ))
        .await
        .map_err(|e| {
            postgres(e, "cannot import the slot's exported snapshot")
                .with_context("snapshot", snapshot_name)
        })
}

/// Locks `tables` (ACCESS SHARE, until the transaction ends) so that no
/// TRUNCATE, rewrite or other ALTER TABLE can commit while they are read,
/// and checks that none did since the transaction's snapshot: the
/// snapshot's `pg_class` row names the storage each table has now, and
/// its `pg_attribute` rows the names its columns have now (the catalog
/// caches the checks' functions read are current, the rows they compare
/// are the snapshot's). A COPY names the snapshot's columns, but the
/// server resolves those names against the current catalog: a column
/// renamed or dropped since fails it, or reads another column that took
/// the name. A partitioned table has no storage of its own: its leaf
/// partitions are checked (LOCK locks them too). A table renamed or
/// dropped since is not found by the snapshot's name. Each is a
/// [`ErrorKind::Concurrent`] error: a new snapshot sees the change.
pub(crate) async fn lock_unchanged_since_snapshot(
    client: &Client,
    tables: &[TableName],
) -> Result<()> {
    let Some(first) = tables.first() else {
        return Ok(());
    };
    // A name the snapshot knows and the catalog no longer does would fail
    // the LOCK with no word of which table or why.
    for table in tables {
        let row = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT FROM pg_class c \
                   JOIN pg_namespace n ON n.oid = c.relnamespace \
                   WHERE n.nspname = $2 AND c.relname = $3)",
                &[&table.quoted(), &table.schema, &table.name],
            )
            .await
            .map_err(|e| postgres(e, "cannot look up the table").with_context("table", table))?;
        match (row.get::<_, bool>(0), row.get::<_, bool>(1)) {
            (true, _) => {}
            (false, true) => {
                return Err(Error::new(
                    ErrorKind::Concurrent,
                    "the table was renamed or dropped after the snapshot was taken; run again \
                     for a new snapshot",
                )
                .with_context("table", table));
            }
            (false, false) => {
                return Err(Error::new(
                    ErrorKind::Preflight,
                    "the source has no such table (renamed? name it as it is called now)",
                )
                .with_context("table", table));
            }
        }
    }
    let list = tables
        .iter()
        .map(TableName::quoted)
        .collect::<Vec<_>>()
        .join(", ");
    client
        .batch_execute(&format!("LOCK TABLE {list} IN ACCESS SHARE MODE"))
        .await
        .map_err(|e| {
            postgres(e, "cannot lock the tables to read them").with_context("table", first)
        })?;
    for table in tables {
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_class WHERE oid = $1::text::regclass), \
                   (SELECT coalesce(bool_and(relfilenode = pg_relation_filenode(oid)), true) \
                    FROM pg_class WHERE relkind <> 'p' AND oid IN ( \
                      SELECT $1::text::regclass \
                      UNION SELECT relid FROM pg_partition_tree($1::text::regclass) WHERE isleaf)), \
                   (SELECT coalesce(bool_and((pg_identify_object_as_address( \
                      'pg_class'::regclass, attrelid, attnum)).object_names[3] = attname), true) \
                    FROM pg_attribute \
                    WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped)",
                &[&table.quoted()],
            )
            .await
            .map_err(|e| {
                postgres(e, "cannot read the table's storage and columns")
                    .with_context("table", table)
            })?;
        let changed = if !row.get::<_, bool>(0) {
            "the table's name was given to another table after the snapshot was taken"
        } else if !row.get::<_, bool>(1) {
            "the table was truncated or rewritten after the snapshot was taken, which leaves \
             it empty to that snapshot (TRUNCATE and table-rewriting ALTER TABLE are not \
             MVCC-safe)"
        } else if !row.get::<_, bool>(2) {
            "a column of the table was renamed or dropped after the snapshot was taken, which \
             leaves its values out of reach at that snapshot"
        } else {
            continue;
        };
        return Err(Error::new(
            ErrorKind::Concurrent,
            format!("{changed}; run again for a new snapshot"),
        )
        .with_context("table", table));
    }
    Ok(())
}

/// The table's rows in COPY's binary format: `COPY (SELECT columns FROM
/// ONLY table) TO STDOUT (FORMAT binary)`, the columns `casts` flags as
/// their type's text output. That is `format('%s', c)`, which calls the
/// output function, and not `c::text`: some casts to text differ from the
/// output (`inet` gains its netmask, `bpchar` loses its padding). `ONLY`
/// for an ordinary table, as `COPY table TO` reads no child table of an
/// inheritance either; a partitioned table is read whole, every partition
/// at every level, as its changes are published (publish_via_partition_root).
pub(crate) async fn copy_out(
    client: &Client,
    table: &CatalogTable,
    casts: &[bool],
    blocks: Option<Blocks>,
) -> Result<CopyOutStream> {
    let columns = select_list(table, casts);
    let only = if table.partitioned { "" } else { "ONLY " };
    let range = blocks.map_or_else(String::new, |b| b.condition());
    client
        .copy_out(&format!(
            "COPY (SELECT {columns} FROM {only}{}{range}) TO STDOUT (FORMAT binary)",
            table.name.quoted()
        ))
        .await
        .map_err(|e| postgres(e, "cannot start COPY").with_context("table", &table.name))
}

/// Heap blocks `from..to` of an ordinary table (`to` none: to its end),
/// read by a TID range scan (PostgreSQL 14+). A row the snapshot sees
/// lies in a block that existed when the snapshot was taken, and only a
/// rewrite moves it (which `lock_unchanged_since_snapshot` refuses), so
/// ranges planned from the table's size at any time after it, the last
/// open-ended, read every row once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocks {
    pub(crate) from: u32,
    pub(crate) to: Option<u32>,
}

impl Blocks {
    fn condition(self) -> String {
        let from = (self.from > 0).then(|| format!("ctid >= '({},0)'::tid", self.from));
        let to = self.to.map(|to| format!("ctid < '({to},0)'::tid"));
        let terms: Vec<String> = from.into_iter().chain(to).collect();
        if terms.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", terms.join(" AND "))
        }
    }

    /// `pages` split into `parts` ranges of about equal size, the last
    /// open-ended.
    pub(crate) fn split(pages: u64, parts: u32) -> Vec<Blocks> {
        let parts = u64::from(parts.max(1));
        let bound = |i: u64| u32::try_from(pages * i / parts).unwrap_or(u32::MAX);
        (0..parts)
            .map(|i| Blocks {
                from: bound(i),
                to: (i + 1 < parts).then(|| bound(i + 1)),
            })
            .collect()
    }
}

/// The heap blocks of `table` now, when it is an ordinary table (not a
/// partitioned one, whose rows are its partitions') without a primary
/// key or replica identity index: the table the chunked backfill cannot
/// read, which the load reads in block ranges instead. Looked up by name
/// in the transaction's snapshot, as `describe_table` does: a table
/// dropped or renamed since is not split, and the lock before its COPY
/// tells why it cannot be read.
pub(crate) async fn keyless_heap_blocks(client: &Client, table: &TableName) -> Result<Option<u64>> {
    let row = client
        .query_opt(
            "SELECT pg_relation_size(c.oid) / current_setting('block_size')::int8 \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'r' \
               AND NOT EXISTS (SELECT 1 FROM pg_index i \
                               WHERE i.indrelid = c.oid AND (i.indisprimary OR i.indisreplident))",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(|e| postgres(e, "cannot read the table's size").with_context("table", table))?;
    Ok(row
        .and_then(|r| r.get::<_, Option<i64>>(0))
        .and_then(|pages| u64::try_from(pages).ok()))
}

/// The columns a load reads, those `casts` flags as their text output.
pub(super) fn select_list(table: &CatalogTable, casts: &[bool]) -> String {
    table
        .columns
        .iter()
        .zip(casts)
        .map(|(c, &cast)| {
            let name = quote_ident(&c.name);
            if cast {
                format!("CASE WHEN {name} IS NULL THEN NULL ELSE format('%s', {name}) END")
            } else {
                name
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads the next chunk of a COPY stream.
pub(crate) async fn next_copy_chunk(
    stream: &mut Pin<Box<CopyOutStream>>,
    table: &TableName,
) -> Result<Option<Bytes>> {
    match stream.next().await {
        None => Ok(None),
        Some(chunk) => chunk
            .map(Some)
            .map_err(|e| postgres(e, "COPY failed").with_context("table", table)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_ranges_cover_the_table_once_and_the_last_is_open() {
        let ranges = Blocks::split(10, 3);
        assert_eq!(
            ranges,
            [
                Blocks {
                    from: 0,
                    to: Some(3)
                },
                Blocks {
                    from: 3,
                    to: Some(6)
                },
                Blocks { from: 6, to: None },
            ]
        );
        assert_eq!(ranges[0].condition(), " WHERE ctid < '(3,0)'::tid");
        assert_eq!(
            ranges[1].condition(),
            " WHERE ctid >= '(3,0)'::tid AND ctid < '(6,0)'::tid"
        );
        assert_eq!(ranges[2].condition(), " WHERE ctid >= '(6,0)'::tid");
        assert_eq!(Blocks::split(5, 1), [Blocks { from: 0, to: None }]);
        assert_eq!(Blocks::split(5, 1)[0].condition(), "");
    }
}
