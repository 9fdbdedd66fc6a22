//! The chunked backfill's statements (docs/backfill.md): which tables can
//! be read by key range, where a chunk ends, the watermarks around its
//! read, and the read itself in a short transaction whose snapshot is
//! checked to see every transaction committed before its low watermark.

use std::time::Duration;

use tokio_postgres::{Client, CopyOutStream};

use super::CatalogTable;
use crate::error::{Error, ErrorKind, Result, postgres};
use crate::model::{Lsn, TableName};
use crate::pg::replication::quote_ident;

/// The prefix of the backfill's watermark messages.
pub(crate) const WATERMARK: &str = "wal2iceberg.backfill";

/// A primary-key column the backfill orders chunks by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyColumn {
    pub(crate) name: String,
    /// `format_type` of its type, which casts a bound's text back.
    pub(crate) sql_type: String,
}

/// Key types whose btree order is the order of silver's key encoding
/// (src/lake/table/key.rs): integers as sign-flipped big-endian bytes,
/// `uuid` as its 16 bytes, `date`, `timestamp` and `timestamptz` as their
/// days or microseconds (infinity as the type's largest number,
/// -infinity as its negation) in Arrow's row format, text as its UTF-8
/// bytes, which is btree's order under the `C` collation only.
const ORDERED_TYPES: [&str; 7] = [
    "int2",
    "int4",
    "int8",
    "uuid",
    "date",
    "timestamp",
    "timestamptz",
];
const TEXT_TYPES: [&str; 2] = ["text", "varchar"];

/// The key `table` is read by in chunks, or why it cannot be: a table
/// without a primary key, a key of a type or collation whose order the
/// lake's key encoding does not keep, or a table whose updates may leave
/// a TOASTed value out of the change (`REPLICA IDENTITY DEFAULT` with a
/// column stored out of line), which a change of a row not read yet could
/// not be completed from.
pub(crate) async fn chunk_key(
    client: &Client,
    table: &CatalogTable,
) -> Result<std::result::Result<Vec<KeyColumn>, String>> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, NULL), t.typname::text, \
                    CASE WHEN i.indcollation[k.ord - 1] = 0 THEN '' \
                         WHEN i.indcollation[k.ord - 1] = 100 THEN \
                           (SELECT CASE WHEN coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c' \
                                   THEN d.datcollate::text END \
                            FROM pg_database d WHERE d.datname = current_database()) \
                         ELSE (SELECT CASE WHEN collprovider = 'c' THEN collcollate::text END \
                               FROM pg_collation WHERE oid = i.indcollation[k.ord - 1]) END, \
                    i.indcollation[k.ord - 1] IN (0, a.attcollation), k.attnum \
             FROM pg_index i \
             JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) ON true \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             JOIN pg_type t ON t.oid = a.atttypid \
             WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.ord",
            &[&table.oid],
        )
        .await
        .map_err(|e| {
            postgres(e, "cannot read the primary key").with_context("table", &table.name)
        })?;
    if rows.is_empty() {
        return Ok(Err("the table has no primary key".into()));
    }
    let attnums: Vec<i16> = rows.iter().map(|r| r.get(5)).collect();
    if attnums.windows(2).any(|w| w[0] > w[1]) {
        return Ok(Err(
            "the primary key's columns are not in the table's column order, the order the \
             lake's key encoding compares them in"
                .into(),
        ));
    }
    let mut key = Vec::new();
    for row in &rows {
        let (name, sql_type, typname): (String, String, String) =
            (row.get(0), row.get(1), row.get(2));
        let collation: Option<String> = row.get(3);
        let same_collation: bool = row.get(4);
        let ordered = ORDERED_TYPES.contains(&typname.as_str())
            || (TEXT_TYPES.contains(&typname.as_str())
                && same_collation
                && matches!(collation.as_deref(), Some("C" | "POSIX")));
        if !ordered {
            return Ok(Err(format!(
                "key column {name:?} is of type {sql_type}{}, whose order the lake's key \
                 encoding does not keep (integers, uuid, date, timestamp, timestamptz, and \
                 text under the C collation do)",
                collation
                    .filter(|c| !c.is_empty())
                    .map(|c| format!(" collated {c:?}"))
                    .unwrap_or_default()
            )));
        }
        key.push(KeyColumn { name, sql_type });
    }
    // The identity that counts is each leaf partition's, whose changes
    // the stream carries.
    let row = client
        .query_one(
            "SELECT bool_and(c.relreplident = 'f'), bool_or(EXISTS (SELECT FROM pg_attribute a \
               WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
               AND a.attstorage <> 'p')) \
             FROM pg_class c WHERE c.oid = $1 OR c.oid IN \
               (SELECT relid FROM pg_partition_tree($1::oid::regclass) WHERE isleaf)",
            &[&table.oid],
        )
        .await
        .map_err(|e| {
            postgres(
                e,
                "cannot read the table's replica identity and column storage",
            )
            .with_context("table", &table.name)
        })?;
    let (full, toastable): (Option<bool>, Option<bool>) = (row.get(0), row.get(1));
    if !full.unwrap_or(false) && toastable.unwrap_or(false) {
        return Ok(Err(
            "a column may be stored out of line (TOAST) and the replica identity is not \
             FULL: an update of a row not read yet could leave its value out"
                .into(),
        ));
    }
    Ok(Ok(key))
}

/// A chunk's key bound: the key columns' text output, in key order.
pub(crate) type Bound = Vec<String>;

/// `(k1, k2) > ($1::t1, $2::t2)` for the key and bound `after`, with the
/// bound's values as parameters from `first`, or a literal form for COPY.
fn compare(key: &[KeyColumn], op: &str, values: impl Iterator<Item = String>) -> String {
    let columns: Vec<String> = key.iter().map(|c| quote_ident(&c.name)).collect();
    let values: Vec<String> = values
        .zip(key)
        .map(|(v, c)| format!("{v}::text::{}", c.sql_type))
        .collect();
    format!("({}) {op} ({})", columns.join(", "), values.join(", "))
}

fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

fn from(table: &CatalogTable) -> String {
    let only = if table.partitioned { "" } else { "ONLY " };
    format!("{only}{}", table.name.quoted())
}

/// The key `rows` keys after `after` (from the first key when none): the
/// inclusive end of the next chunk, by the key's index alone; `None` when
/// fewer rows are left, the last chunk running to the table's end.
pub(crate) async fn chunk_end(
    client: &Client,
    table: &CatalogTable,
    key: &[KeyColumn],
    after: Option<&Bound>,
    rows: u64,
) -> Result<Option<Bound>> {
    // Named apart from the key's columns: ORDER BY a name that an output
    // column has sorts by that column, here the text.
    let output: Vec<String> = key
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{}::text AS bound_{i}", quote_ident(&c.name)))
        .collect();
    let order: Vec<String> = key.iter().map(|c| quote_ident(&c.name)).collect();
    let filter = match after {
        Some(_) => format!(
            "WHERE {}",
            compare(key, ">", (1..=key.len()).map(|i| format!("${i}")))
        ),
        None => String::new(),
    };
    let sql = format!(
        "SELECT {} FROM {} {filter} ORDER BY {} OFFSET {} LIMIT 1",
        output.join(", "),
        from(table),
        order.join(", "),
        rows.saturating_sub(1)
    );
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = after
        .map(|b| {
            b.iter()
                .map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect()
        })
        .unwrap_or_default();
    let row = client.query_opt(&sql, &params).await.map_err(|e| {
        postgres(e, "cannot find where the next chunk ends").with_context("table", &table.name)
    })?;
    Ok(row.map(|r| (0..key.len()).map(|i| r.get(i)).collect()))
}

/// Writes a watermark into the WAL: a transactional logical message of
/// its own transaction, decoded at its commit in commit order. Its
/// message LSN.
pub(crate) async fn emit_watermark(client: &Client, content: &str) -> Result<Lsn> {
    let row = client
        .query_one(
            "SELECT pg_logical_emit_message(true, $1, $2)::text",
            &[&WATERMARK, &content],
        )
        .await
        .map_err(|e| postgres(e, "cannot write a backfill watermark"))?;
    let text: String = row.get(0);
    text.parse().map_err(|_| {
        Error::new(
            ErrorKind::Decode,
            format!("pg_logical_emit_message returned {text:?}"),
        )
    })
}

/// The snapshot a chunk was read in: which transactions it does not see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadSnapshot {
    /// Every transaction at or after this one is invisible.
    pub(crate) xmax: u64,
    /// The transactions below `xmax` running when it was taken.
    pub(crate) running: Vec<u64>,
}

impl ReadSnapshot {
    /// Parses `pg_snapshot`'s text form, `xmin:xmax:xip,...`.
    fn parse(text: &str) -> Option<ReadSnapshot> {
        let mut parts = text.split(':');
        let (_xmin, xmax, xip) = (parts.next()?, parts.next()?, parts.next()?);
        let running = xip
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<std::result::Result<Vec<u64>, _>>()
            .ok()?;
        Some(ReadSnapshot {
            xmax: xmax.parse().ok()?,
            running,
        })
    }

    /// Whether the transaction of 32-bit id `xid` (as pgoutput sends it),
    /// which committed recently, is invisible to this snapshot.
    pub(crate) fn misses(&self, xid: u32) -> bool {
        let xmax = self.xmax as u32;
        // At or after xmax, in the circular order of 32-bit ids.
        xid.wrapping_sub(xmax) as i32 >= 0 || self.running.iter().any(|&x| x as u32 == xid)
    }
}

/// How long the read waits at most before it begins again, when its
/// snapshot missed a transaction whose commit is already recorded.
const RETRY_WAIT: Duration = Duration::from_millis(20);

/// Begins a chunk's read: a `REPEATABLE READ` transaction that locks the
/// table (`ACCESS SHARE`: a TRUNCATE or rewrite waits for the read, as
/// they are not MVCC-safe) before its snapshot is taken, and whose
/// snapshot counts no transaction as running that the commit log already
/// records committed (those can precede the low watermark in the WAL and
/// still be invisible for a moment; docs/backfill.md). Such a snapshot is
/// thrown away and taken again. The snapshot it keeps.
pub(crate) async fn begin_read(client: &Client, table: &CatalogTable) -> Result<ReadSnapshot> {
    let context = |e| postgres(e, "cannot begin a chunk's read").with_context("table", &table.name);
    for attempt in 1u32.. {
        client
            .batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; LOCK TABLE {} IN ACCESS SHARE MODE",
                from(table)
            ))
            .await
            .map_err(context)?;
        let row = client
            .query_one(
                "SELECT pg_current_snapshot()::text, \
                   (SELECT count(*) FROM pg_snapshot_xip(pg_current_snapshot()) AS x \
                    WHERE pg_xact_status(x) = 'committed')",
                &[],
            )
            .await
            .map_err(context)?;
        let (text, committed): (String, i64) = (row.get(0), row.get(1));
        if committed == 0 {
            return ReadSnapshot::parse(&text).ok_or_else(|| {
                Error::new(
                    ErrorKind::Decode,
                    format!("pg_current_snapshot returned {text:?}"),
                )
            });
        }
        client.batch_execute("ROLLBACK").await.map_err(context)?;
        if attempt % 500 == 0 {
            tracing::warn!(
                table = %table.name, attempts = attempt,
                "a chunk's snapshot keeps counting committed transactions as running (are \
                 commits waiting for a synchronous standby?): the backfill waits for them"
            );
        }
        tokio::time::sleep(RETRY_WAIT.min(Duration::from_millis(u64::from(attempt)))).await;
    }
    unreachable!("the attempts never run out")
}

/// The rows of `(after, upto]` in key order in COPY's binary format, in
/// the transaction [`begin_read`] began; the columns `casts` flags as their
/// type's text output, as [`super::copy_out`] reads a whole table.
pub(crate) async fn copy_chunk(
    client: &Client,
    table: &CatalogTable,
    casts: &[bool],
    key: &[KeyColumn],
    (after, upto): (Option<&Bound>, Option<&Bound>),
) -> Result<CopyOutStream> {
    let mut filters = Vec::new();
    if let Some(after) = after {
        filters.push(compare(key, ">", after.iter().map(|v| literal(v))));
    }
    if let Some(upto) = upto {
        filters.push(compare(key, "<=", upto.iter().map(|v| literal(v))));
    }
    let filter = match filters.is_empty() {
        true => String::new(),
        false => format!(" WHERE {}", filters.join(" AND ")),
    };
    let columns = super::snapshot::select_list(table, casts);
    let order: Vec<String> = key.iter().map(|c| quote_ident(&c.name)).collect();
    client
        .copy_out(&format!(
            "COPY (SELECT {columns} FROM {}{filter} ORDER BY {}) TO STDOUT (FORMAT binary)",
            from(table),
            order.join(", ")
        ))
        .await
        .map_err(|e| postgres(e, "cannot start a chunk's COPY").with_context("table", &table.name))
}

/// The planner's estimate of the table's rows (`pg_class.reltuples`, its
/// partitions' for a partitioned table); `None` before it was ever
/// analyzed or vacuumed.
pub(crate) async fn row_estimate(client: &Client, table: &CatalogTable) -> Result<Option<u64>> {
    let row = client
        .query_one(
            "SELECT sum(reltuples) FILTER (WHERE reltuples >= 0)::int8, \
                    bool_or(reltuples >= 0) \
             FROM pg_class WHERE oid = $1 OR oid IN \
               (SELECT relid FROM pg_partition_tree($1::oid::regclass) WHERE isleaf)",
            &[&table.oid],
        )
        .await
        .map_err(|e| {
            postgres(e, "cannot read the table's row estimate").with_context("table", &table.name)
        })?;
    let (sum, known): (Option<i64>, Option<bool>) = (row.get(0), row.get(1));
    Ok(sum
        .filter(|_| known == Some(true))
        .and_then(|n| u64::try_from(n).ok()))
}

/// Ends a chunk's read.
pub(crate) async fn end_read(client: &Client, table: &TableName) -> Result<()> {
    client
        .batch_execute("COMMIT")
        .await
        .map_err(|e| postgres(e, "cannot end a chunk's read").with_context("table", table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_misses_what_ran_and_what_came_after_it() {
        let s = ReadSnapshot::parse("100:110:103,107").unwrap();
        assert_eq!(s.running, vec![103, 107]);
        assert!(s.misses(103) && s.misses(107) && s.misses(110) && s.misses(5000));
        assert!(!s.misses(104) && !s.misses(99) && !s.misses(109));
        // An epoch on: the 32-bit ids wrap.
        let wrapped = ReadSnapshot::parse(&format!("{0}:{0}:", (1u64 << 32) + 2)).unwrap();
        assert!(wrapped.misses(2) && wrapped.misses(3) && !wrapped.misses(1));
        assert!(!wrapped.misses(u32::MAX));
        assert!(ReadSnapshot::parse("1:2").is_none());
    }
}
