//! The ordinary (non-replication) connection: preflight checks,
//! publication management, catalog look-ups and the snapshot COPY.
//!
//! Every check here reads the catalog only. The one change made to the
//! source is creating a publication or adding a table to it, and only for
//! tables whose UPDATE and DELETE keep working once published (a primary
//! key, or a replica identity of FULL or USING INDEX).
//!
//! `preflight` checks, `install` puts the helper triggers in place,
//! `publication` manages the publication, `catalog` looks tables and
//! types up, `snapshot` reads a table in an exported snapshot.

use std::fmt;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

use super::config::PgConfig;
use crate::error::{Error, ErrorKind, Result, postgres};
use crate::model::{Lsn, SlotHealth, SlotInfo};

mod catalog;
pub(crate) mod chunk;
mod install;
mod preflight;
mod publication;
mod snapshot;

pub(crate) use catalog::{
    CatalogTable, ColumnFacts, column_facts, describe_table, describe_type, primary_key,
    table_exists, table_of_oid, table_oid,
};
pub(crate) use install::{
    COLUMN_NUMBERS, PARTITION_ROWS_MIGRATION, PARTITION_ROWS_SQL, REWRITES, ensure_ddl_triggers,
    ensure_partition_rows, installing,
};
pub use preflight::{SLOT_HELD_BY_RUN, check_table, preflight};
pub(crate) use publication::{CREATED_BY_MARK, ensure_publication, published_tables, unpublished};
pub(crate) use snapshot::{
    Blocks, begin_snapshot, copy_out, keyless_heap_blocks, lock_unchanged_since_snapshot,
    next_copy_chunk,
};

/// An ordinary connection; its background task ends when this is dropped.
pub struct SourceClient {
    client: Client,
    task: JoinHandle<()>,
}

impl Drop for SourceClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::ops::Deref for SourceClient {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl SourceClient {
    pub async fn connect(config: &PgConfig) -> Result<SourceClient> {
        let pg = config.to_tokio_postgres();
        let context = |e: tokio_postgres::Error| {
            let code = e.as_db_error().map(|d| d.code().code().to_owned());
            let err = postgres(e, "cannot connect to the source database")
                .with_context("host", &config.host)
                .with_context("port", config.port)
                .with_context("dbname", &config.dbname);
            let tls = err.to_string().contains("TLS");
            match code.as_deref() {
                None if tls => Error::new(
                    ErrorKind::Tls,
                    "TLS could not be set up as sslmode requires",
                )
                .with_context("sslmode", format!("{:?}", config.sslmode))
                .with_source(err),
                Some("28P01" | "28000") => Error::new(
                    ErrorKind::Authentication,
                    "the server rejected the login: check the user, the password and pg_hba.conf",
                )
                .with_context("user", &config.user)
                .with_source(err),
                _ => err,
            }
        };
        let (client, task) = match super::tls::client_config(config)? {
            Some(tls) => {
                let connector = tokio_postgres_rustls::MakeRustlsConnect::new((*tls).clone());
                let (client, connection) = pg.connect(connector).await.map_err(context)?;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
            _ => {
                let (client, connection) = pg.connect(NoTls).await.map_err(context)?;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
        };
        Ok(SourceClient { client, task })
    }
}

/// One failed preflight check: what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckFailure {
    /// A stable short name, e.g. `wal_level`.
    pub check: &'static str,
    pub problem: String,
    pub fix: String,
}

impl fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] {}\n    fix: {}",
            self.check, self.problem, self.fix
        )
    }
}

pub(crate) async fn slot_info(client: &Client, slot: &str) -> Result<Option<SlotInfo>> {
    let row = client
        .query_opt(
            "SELECT plugin::text, database::text, active_pid, confirmed_flush_lsn::text, \
                    wal_status, COALESCE((SELECT backend_type = 'walsender' \
                                          FROM pg_stat_activity WHERE pid = active_pid), false) \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_replication_slots"))?;
    Ok(row.map(|r| SlotInfo {
        plugin: r.get(0),
        database: r.get(1),
        active_pid: r.get(2),
        confirmed_flush_lsn: r.get::<_, Option<String>>(3).and_then(|s| s.parse().ok()),
        wal_status: r.get(4),
        streamed: r.get(5),
    }))
}

/// What `slot` keeps and lags, read together from `pg_replication_slots`.
pub(crate) async fn slot_health(client: &Client, slot: &str) -> Result<Option<SlotHealth>> {
    let row = client
        .query_opt(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8, \
             pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn)::int8, \
             wal_status, safe_wal_size, \
             pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_replication_slots"))?;
    Ok(row.map(|row| SlotHealth {
        retained_bytes: row.get(0),
        lag_bytes: row.get(1),
        wal_status: row.get(2),
        safe_wal_size: row.get(3),
        wal_end: row.get::<_, i64>(4) as u64,
    }))
}

/// Where the source's flushed WAL ends once it holds every commit
/// acknowledged before the call, waiting up to `longest` for it. Decoding
/// reads only flushed WAL, and under `synchronous_commit = off` a commit
/// is acknowledged before its record is flushed: the WAL writer flushes
/// it within three `wal_writer_delay`s (up to 30 s), so the flush
/// position alone, which `IDENTIFY_SYSTEM` reports, can stand short of
/// it. So this waits until the flush position reaches the insert
/// position read first, or until three `wal_writer_delay`s (at most
/// `longest`) have passed: records of a transaction still open may stay
/// unflushed for as long as it stays open, and the flush position then
/// holds every commit from before. A standby reports how far it has
/// replayed.
pub(crate) async fn flushed_wal_end(
    client: &Client,
    longest: Duration,
) -> std::result::Result<Lsn, tokio_postgres::Error> {
    let position = |function: &str| {
        format!(
            "SELECT pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() \
             THEN pg_last_wal_replay_lsn() ELSE {function} END, '0/0')::int8"
        )
    };
    let first = client
        .query_one(
            &format!(
                "SELECT ({})::int8 * 3, ({})",
                "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_writer_delay'",
                position("pg_current_wal_insert_lsn()")
            ),
            &[],
        )
        .await?;
    let delay = Duration::from_millis(first.get::<_, i64>(0).max(0) as u64);
    let inserted: i64 = first.get(1);
    let give_up = tokio::time::Instant::now() + delay.min(longest);
    let flushed = position("pg_current_wal_flush_lsn()");
    loop {
        let end: i64 = client.query_one(&flushed, &[]).await?.get(0);
        if end >= inserted || tokio::time::Instant::now() >= give_up {
            return Ok(Lsn(end as u64));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The heartbeat: a logical message in the WAL.
pub(crate) async fn emit_heartbeat(client: &Client) -> Result<()> {
    client
        .batch_execute("SELECT pg_logical_emit_message(false, 'wal2iceberg', 'heartbeat')")
        .await
        .map_err(|e| postgres(e, "heartbeat failed"))
}

/// The server's `wal_level`, when it is not `logical`.
pub(crate) async fn wal_level(client: &Client) -> Result<Option<CheckFailure>> {
    let level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(|e| postgres(e, "cannot read wal_level"))?
        .get(0);
    Ok((level != "logical").then(|| CheckFailure {
        check: "wal_level",
        problem: format!("wal_level is {level:?}; logical replication needs \"logical\""),
        fix: "as a superuser: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL \
              (a reload does not change it)"
            .to_owned(),
    }))
}
