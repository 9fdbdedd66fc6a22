//! `wal2iceberg status`: the slot as the server sees it and each lake
//! table's position, as a table for people or JSON for scripts.
//!
//! Slot figures come from `pg_replication_slots` in one query, so they
//! describe one moment: retained WAL is `pg_current_wal_lsn() -
//! restart_lsn` (what the slot keeps on the server's disk), lag is
//! `pg_current_wal_insert_lsn() - confirmed_flush_lsn` (what is not yet in
//! the lake, counting a commit an asynchronous `synchronous_commit` has not
//! written out yet), and seconds behind the age of the oldest source commit the slot
//! has not confirmed (docs/operations.md, "Lag"). Table figures come from
//! each table's current snapshot: the last source transaction it holds,
//! when that committed at the source, when it first became visible in the
//! lake, and the difference, that transaction's latency.

use std::fmt::Write;
use std::time::Duration;

use bytes::Bytes;
use iceberg::NamespaceIdent;
use iceberg::spec::{Operation, Snapshot};
use iceberg::table::Table;
use serde::Serialize;
use tokio_postgres::error::SqlState;

use crate::apply::backfill::Progress;
use crate::apply::table_set::SOURCE_SLOT;
use crate::cdc::capture::temporary_slot_name;
use crate::cdc::temporal::{format_timestamp_utc, pg_micros_to_unix};
use crate::error::{Result, postgres};
use crate::lake::catalog::{Lake, LakeLocation};
use crate::lake::files::writer::{Position, summary_total};
use crate::lake::iceberg_error;
use crate::lake::maintenance::expire::LAST_EXPIRY_PROPERTY;
use crate::metrics::now_micros;
use crate::pg::config::PgConfig;
use crate::pg::pgoutput::{Decoder, Message};
use crate::pg::replication::quote_ident;
use crate::pg::source::{self, SourceClient};

/// How long the server may take to decode a slot's first pending
/// transaction for [`seconds_behind`].
const PEEK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a peek waits for the WAL it would read to be flushed.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// How long each part of the status (the source, the lake) may take
/// beyond that: a store or server that does not answer is reported as
/// unreachable, beside what the other part said.
const PART_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SlotStatus {
    pub(crate) slot_name: String,
    pub(crate) active: bool,
    pub(crate) active_pid: Option<i32>,
    pub(crate) confirmed_flush_lsn: Option<String>,
    pub(crate) restart_lsn: Option<String>,
    pub(crate) retained_wal_bytes: Option<i64>,
    pub(crate) lag_bytes: Option<i64>,
    /// The age of the oldest source commit not yet in the lake, 0 when
    /// none is pending; null when it cannot be told ([`seconds_behind`]).
    pub(crate) seconds_behind: Option<f64>,
    /// Why `seconds_behind` is null, and what would tell it.
    pub(crate) seconds_behind_unknown: Option<String>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub(crate) wal_status: Option<String>,
    /// Bytes that can still be written before the slot is at risk of being
    /// invalidated; null when `max_slot_wal_keep_size` is unlimited.
    pub(crate) safe_wal_size: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct TableStatus {
    pub(crate) table: String,
    /// The last source transaction the table holds.
    pub(crate) commit_lsn: String,
    pub(crate) source_commit_time: String,
    /// When the first snapshot holding it was committed (a compaction or
    /// an expiry after it records the same position).
    pub(crate) visible_time: String,
    /// The difference: that transaction's source-commit-to-visible latency.
    pub(crate) lag_seconds: f64,
    /// Live files of the current snapshot and their bytes (its summary).
    pub(crate) data_files: u64,
    pub(crate) delete_files: u64,
    pub(crate) file_bytes: u64,
    /// Snapshots the metadata holds.
    pub(crate) snapshots: usize,
    /// When the newest compaction kept in the metadata committed.
    pub(crate) last_compaction: Option<String>,
    /// When an expiry last removed snapshots.
    pub(crate) last_expiry: Option<String>,
    /// The slot a bronze table records it is replicated from.
    pub(crate) replicated_from: Option<String>,
    /// A bronze table's chunked backfill, while it is not done.
    pub(crate) backfill: Option<BackfillStatus>,
}

/// Where a table's chunked backfill stands, as its bronze records it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BackfillStatus {
    /// Rows read into the lake.
    pub(crate) rows: u64,
    /// The source's estimate of the table's rows (`pg_class.reltuples`)
    /// when the last chunk was read; null before it was ever analyzed.
    pub(crate) rows_estimated: Option<u64>,
    pub(crate) percent: Option<f64>,
    pub(crate) chunk_rows: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// `None` when the slot does not exist, or the source did not answer.
    pub(crate) slot: Option<SlotStatus>,
    /// Why the source could not be read, when it could not.
    pub(crate) source_unreachable: Option<String>,
    /// Why the lake could not be read, when it could not.
    pub(crate) lake_unreachable: Option<String>,
    pub(crate) slot_name: String,
    /// The lake's catalog file, and whether it exists.
    pub(crate) lake: String,
    pub(crate) lake_found: bool,
    pub(crate) tables: Vec<TableStatus>,
}

impl Status {
    /// A slot with no lake where it was looked for: a mistyped `--lake`,
    /// or a lost lake. `status` exits 1 then.
    pub fn lake_missing(&self) -> bool {
        self.slot.is_some() && !self.lake_found
    }

    /// The source or the lake did not answer. `status` exits 1 then.
    pub fn unreachable(&self) -> bool {
        self.source_unreachable.is_some() || self.lake_unreachable.is_some()
    }

    /// The slots the lake's tables record, when `slot_name` is not one of
    /// them: a mistyped `--slot`. `status` exits 1 then.
    pub fn other_slots(&self) -> Option<Vec<&str>> {
        let mut slots: Vec<&str> = self
            .tables
            .iter()
            .filter_map(|t| t.replicated_from.as_deref())
            .collect();
        slots.sort_unstable();
        slots.dedup();
        (!slots.is_empty() && !slots.contains(&self.slot_name.as_str())).then_some(slots)
    }
}

pub async fn status(
    config: &PgConfig,
    slot: &str,
    publication: &str,
    lake: &LakeLocation,
    namespace: Option<&str>,
) -> Result<Status> {
    let namespace = NamespaceIdent::new(namespace.unwrap_or(&config.dbname).to_owned());
    let (source, tables) = tokio::join!(
        within(
            PART_TIMEOUT + PEEK_TIMEOUT,
            slot_status(config, slot, publication)
        ),
        within(PART_TIMEOUT, table_statuses(lake, &namespace)),
    );
    let (slot_status, source_unreachable) = match source {
        Ok(found) => (found, None),
        Err(reason) => (None, Some(reason)),
    };
    let (tables, lake_unreachable) = match tables {
        Ok(tables) => (tables, None),
        Err(reason) => (Vec::new(), Some(reason)),
    };
    Ok(Status {
        slot: slot_status,
        source_unreachable,
        lake_unreachable,
        slot_name: slot.to_owned(),
        lake: lake.catalog.to_string(),
        lake_found: lake.catalog.may_exist(),
        tables,
    })
}

/// `part`'s answer, or why there is none: its error, or that it gave none
/// within `limit`.
async fn within<T>(
    limit: Duration,
    part: impl Future<Output = Result<T>>,
) -> std::result::Result<T, String> {
    match tokio::time::timeout(limit, part).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer, after {} s", limit.as_secs())),
    }
}

/// The slot as the server sees it, `None` when it does not exist.
async fn slot_status(
    config: &PgConfig,
    slot: &str,
    publication: &str,
) -> Result<Option<SlotStatus>> {
    let client = SourceClient::connect(config).await?;
    let row = client
        .query_opt(
            "SELECT active, active_pid, confirmed_flush_lsn::text, restart_lsn::text, \
             pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8, \
             pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn)::int8, \
             wal_status, safe_wal_size \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_replication_slots"))?;
    let mut slot_status = row.map(|r| SlotStatus {
        slot_name: slot.to_owned(),
        active: r.get(0),
        active_pid: r.get(1),
        confirmed_flush_lsn: r.get(2),
        restart_lsn: r.get(3),
        retained_wal_bytes: r.get(4),
        lag_bytes: r.get(5),
        seconds_behind: None,
        seconds_behind_unknown: None,
        wal_status: r.get(6),
        safe_wal_size: r.get(7),
    });
    if let Some(s) = &mut slot_status {
        match seconds_behind(&client, s, publication).await {
            Ok(seconds) => s.seconds_behind = Some(seconds),
            Err(reason) => s.seconds_behind_unknown = Some(reason),
        }
    }
    Ok(slot_status)
}

/// How long ago the oldest source transaction the slot has not confirmed
/// committed: 0 when none is pending, or why that cannot be told. The
/// slot's first pending transaction is peeked at (its Begin message
/// carries the commit time): the slot itself when no run holds it, else a
/// temporary copy of it, dropped with this session. Either needs only what
/// the pipeline's role has (REPLICATION), and takes a 5 s statement
/// timeout, since the server decodes that whole transaction first.
async fn seconds_behind(
    client: &SourceClient,
    slot: &SlotStatus,
    publication: &str,
) -> std::result::Result<f64, String> {
    if slot.lag_bytes.unwrap_or(0) <= 0 {
        return Ok(0.0);
    }
    match oldest_pending_commit(client, &slot.slot_name, slot.active, publication).await {
        Ok(commit) => Ok(commit.map_or(0.0, |ts| ((now_micros() - ts) as f64 / 1e6).max(0.0))),
        Err(e) => Err(unknown_reason(client, e).await),
    }
}

/// When the slot's first pending transaction committed at the source (Unix
/// microseconds), `None` when none is pending; `active`: a run holds the
/// slot, so a temporary copy of it is read instead.
pub(crate) async fn oldest_pending_commit(
    client: &SourceClient,
    slot: &str,
    active: bool,
    publication: &str,
) -> std::result::Result<Option<i64>, tokio_postgres::Error> {
    source::flushed_wal_end(client, FLUSH_WAIT).await?;
    client
        .batch_execute(&format!(
            "BEGIN; SET LOCAL statement_timeout = '{}s'",
            PEEK_TIMEOUT.as_secs()
        ))
        .await?;
    let peeked = async {
        let read = if active {
            let copy = temporary_slot_name("w2i_status");
            client
                .execute(
                    "SELECT pg_copy_logical_replication_slot($1, $2, true)",
                    &[&slot, &copy],
                )
                .await?;
            copy
        } else {
            slot.to_owned()
        };
        let row = client
            .query_opt(
                "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, 1, \
                 'proto_version', '1', 'publication_names', $2) LIMIT 1",
                &[&read, &quote_ident(publication)],
            )
            .await?;
        if active {
            client
                .execute("SELECT pg_drop_replication_slot($1)", &[&read])
                .await?;
        }
        Ok(row)
    }
    .await;
    let ended = client
        .batch_execute(if peeked.is_ok() { "COMMIT" } else { "ROLLBACK" })
        .await;
    let commit =
        peeked?.and_then(
            |r| match Decoder::new().decode(Bytes::from(r.get::<_, Vec<u8>>(0))) {
                Ok(Message::Begin(begin)) => Some(pg_micros_to_unix(begin.commit_ts)),
                _ => None,
            },
        );
    ended?;
    Ok(commit)
}

/// Why the slot could not be peeked at, with what would let it be.
async fn unknown_reason(client: &SourceClient, e: tokio_postgres::Error) -> String {
    let role = client
        .query_one("SELECT current_user::text", &[])
        .await
        .map_or_else(|_| "<role>".to_owned(), |r| r.get(0));
    match e.code().map(SqlState::code).map(str::to_owned).as_deref() {
        Some("42501") => format!(
            "the role may not read replication slots; as a superuser: ALTER ROLE {} REPLICATION",
            quote_ident(&role)
        ),
        Some("57014") => format!(
            "the server took over {} s to decode the first pending transaction (a large one); \
             ask again later",
            PEEK_TIMEOUT.as_secs()
        ),
        Some("53400") => "every replication slot is in use, and reading a slot a run holds \
             takes a temporary copy: raise max_replication_slots by one"
            .to_owned(),
        _ => postgres(e, "cannot peek at the slot").to_string(),
    }
}

async fn table_statuses(
    lake: &LakeLocation,
    namespace: &NamespaceIdent,
) -> Result<Vec<TableStatus>> {
    if !lake.catalog.may_exist() {
        return Ok(Vec::new());
    }
    let lake = Lake::open(lake).await?;
    let catalog = lake.catalog();
    let exists = catalog
        .namespace_exists(namespace)
        .await
        .map_err(|e| iceberg_error(e, "cannot read the catalog"))?;
    if !exists {
        return Ok(Vec::new());
    }
    let mut idents = catalog
        .list_tables(namespace)
        .await
        .map_err(|e| iceberg_error(e, "cannot list the lake's tables"))?;
    idents.sort_by(|a, b| a.name().cmp(b.name()));
    let mut tables = Vec::with_capacity(idents.len());
    for ident in idents {
        let table = lake.catalog_table(&ident).await?;
        let (Some(position), Some(snapshot)) =
            (Position::of(&table)?, table.metadata().current_snapshot())
        else {
            continue;
        };
        let visible_micros = first_visible_ms(&table, snapshot, position)? * 1000;
        let total = |key: &str| summary_total(&table, key);
        let last_compaction = table
            .metadata()
            .snapshots()
            .filter(|s| s.summary().operation == Operation::Replace)
            .map(|s| s.timestamp_ms())
            .max()
            .map(|ms| format_timestamp_utc(ms * 1000));
        tables.push(TableStatus {
            data_files: total("total-data-files"),
            delete_files: total("total-delete-files"),
            file_bytes: total("total-files-size"),
            snapshots: table.metadata().snapshots().len(),
            last_compaction,
            last_expiry: table
                .metadata()
                .properties()
                .get(LAST_EXPIRY_PROPERTY)
                .and_then(|ms| ms.parse::<i64>().ok())
                .map(|ms| format_timestamp_utc(ms * 1000)),
            replicated_from: table.metadata().properties().get(SOURCE_SLOT).cloned(),
            backfill: Progress::of(&table)
                .filter(|p| !p.done)
                .map(|p| BackfillStatus {
                    rows: p.rows,
                    rows_estimated: p.estimate,
                    percent: p.percent(),
                    chunk_rows: p.chunk_rows,
                }),
            table: ident.to_string(),
            commit_lsn: position.commit_lsn.to_string(),
            source_commit_time: format_timestamp_utc(position.commit_ts),
            visible_time: format_timestamp_utc(visible_micros),
            lag_seconds: (visible_micros - position.commit_ts) as f64 / 1e6,
        });
    }
    Ok(tables)
}

/// When the table first held `position`: the commit time of the oldest
/// snapshot in `snapshot`'s line of parents that records it.
fn first_visible_ms(table: &Table, snapshot: &Snapshot, position: Position) -> Result<i64> {
    let mut first = snapshot;
    while let Some(parent) = first
        .parent_snapshot_id()
        .and_then(|id| table.metadata().snapshot_by_id(id))
    {
        if Position::of_snapshot(table, parent)? != Some(position) {
            break;
        }
        first = parent;
    }
    Ok(first.timestamp_ms())
}

impl Status {
    /// The human form: the slot, then one line per table.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
        match &self.slot {
            None if self.source_unreachable.is_some() => {
                let _ = writeln!(
                    out,
                    "source: unreachable ({})",
                    self.source_unreachable.as_deref().unwrap_or_default()
                );
            }
            None => {
                let _ = writeln!(out, "slot {}: does not exist", self.slot_name);
            }
            Some(s) => {
                let _ = writeln!(
                    out,
                    "slot {}: {}",
                    s.slot_name,
                    match s.active_pid {
                        Some(pid) if s.active => format!("active (pid {pid})"),
                        _ => "inactive".to_owned(),
                    }
                );
                for (label, value) in [
                    (
                        "confirmed_flush_lsn",
                        or_dash(s.confirmed_flush_lsn.clone()),
                    ),
                    ("restart_lsn", or_dash(s.restart_lsn.clone())),
                    (
                        "retained WAL",
                        or_dash(s.retained_wal_bytes.map(|b| format!("{b} bytes"))),
                    ),
                    ("lag", or_dash(s.lag_bytes.map(|b| format!("{b} bytes")))),
                    (
                        "seconds behind",
                        match (s.seconds_behind, &s.seconds_behind_unknown) {
                            (Some(b), _) => format!("{b:.3}"),
                            (None, reason) => {
                                format!("unknown ({})", reason.as_deref().unwrap_or("not read"))
                            }
                        },
                    ),
                    ("wal_status", or_dash(s.wal_status.clone())),
                    (
                        "safe_wal_size",
                        s.safe_wal_size
                            .map_or("unlimited".to_owned(), |b| format!("{b} bytes")),
                    ),
                ] {
                    let _ = writeln!(out, "  {label:<20} {value}");
                }
            }
        }
        if !self.lake_found {
            let _ = writeln!(
                out,
                "no lake: the catalog {} does not exist{}",
                self.lake,
                if self.slot.is_some() {
                    " (give the --lake or --catalog the run writes to)"
                } else {
                    ""
                }
            );
            return out;
        }
        if let Some(reason) = &self.lake_unreachable {
            let _ = writeln!(out, "lake: unreachable ({reason})");
            return out;
        }
        if self.tables.is_empty() {
            let _ = writeln!(out, "no lake tables with a committed position");
            return out;
        }
        if let Some(slots) = self.other_slots() {
            let _ = writeln!(
                out,
                "the lake's tables are replicated from slot {}, not {}: give --slot the run uses",
                slots.join(", "),
                self.slot_name
            );
        }
        let _ = writeln!(
            out,
            "{:<32} {:<14} {:<28} {:<28} {:>10}",
            "table", "commit_lsn", "source commit", "visible", "latency (s)"
        );
        for t in &self.tables {
            let _ = writeln!(
                out,
                "{:<32} {:<14} {:<28} {:<28} {:>10.3}",
                t.table, t.commit_lsn, t.source_commit_time, t.visible_time, t.lag_seconds
            );
        }
        let _ = writeln!(
            out,
            "{:<32} {:>10} {:>12} {:>14} {:>9}  {:<28} last expiry",
            "table", "data files", "delete files", "bytes", "snapshots", "last compaction"
        );
        for t in &self.tables {
            let _ = writeln!(
                out,
                "{:<32} {:>10} {:>12} {:>14} {:>9}  {:<28} {}",
                t.table,
                t.data_files,
                t.delete_files,
                t.file_bytes,
                t.snapshots,
                t.last_compaction.as_deref().unwrap_or("-"),
                t.last_expiry.as_deref().unwrap_or("-")
            );
        }
        for t in &self.tables {
            if let Some(b) = &t.backfill {
                let _ = writeln!(
                    out,
                    "{}: backfill in chunks of {} rows, {} rows read{}; silver is incomplete until it ends",
                    t.table,
                    b.chunk_rows,
                    b.rows,
                    match (b.rows_estimated, b.percent) {
                        (Some(e), Some(p)) => format!(" of about {e} ({p:.1}%)"),
                        _ => String::new(),
                    }
                );
            }
        }
        out
    }
}
