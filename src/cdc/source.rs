//! The source database as the pipeline asks of it outside the stream:
//! where a slot stands, how much WAL it keeps, which tables an oid and a
//! publication name, and the heartbeat message. The pipeline (`apply`)
//! reaches the source through this and `capture` alone; the queries stay
//! in the wire (`pg::source`).

use crate::error::{Error, Result, postgres};
use crate::model::{SlotInfo, TableName};
use crate::pg::config::PgConfig;
use crate::pg::replication::SLOT_IN_USE;
use crate::pg::source::{self, SourceClient};

/// An ordinary connection to the source.
pub(crate) struct Source(SourceClient);

/// How much WAL a slot keeps and how far its consumer is behind, read
/// together from `pg_replication_slots`.
#[derive(Debug, Clone)]
pub(crate) struct SlotHealth {
    /// WAL kept from the slot's `restart_lsn` to the end written.
    pub(crate) retained_bytes: Option<i64>,
    /// WAL inserted past the slot's `confirmed_flush_lsn`.
    pub(crate) lag_bytes: Option<i64>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub(crate) wal_status: Option<String>,
    /// WAL that can still be written before the slot is at risk.
    pub(crate) safe_wal_size: Option<i64>,
    /// The server's WAL end, flushed.
    pub(crate) wal_end: u64,
}

/// Whether `err` is the server's refusal of a slot another process holds.
pub(crate) fn slot_in_use(err: &Error) -> bool {
    err.sqlstate() == Some(SLOT_IN_USE)
}

impl Source {
    pub(crate) async fn connect(config: &PgConfig) -> Result<Source> {
        SourceClient::connect(config).await.map(Source)
    }

    /// `slot` as `pg_replication_slots` shows it, if it exists.
    pub(crate) async fn slot(&self, slot: &str) -> Result<Option<SlotInfo>> {
        source::slot_info(&self.0, slot).await
    }

    /// What `slot` keeps and lags, if it exists.
    pub(crate) async fn slot_health(&self, slot: &str) -> Result<Option<SlotHealth>> {
        let row = self
            .0
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

    /// Writes a logical message into the WAL, so that a slot on a server
    /// where only other databases write has something to confirm.
    pub(crate) async fn heartbeat(&self) -> Result<()> {
        self.0
            .batch_execute("SELECT pg_logical_emit_message(false, 'wal2iceberg', 'heartbeat')")
            .await
            .map_err(|e| postgres(e, "heartbeat failed"))
    }

    /// The table of `oid` now, under whatever name it has.
    pub(crate) async fn table_of_oid(&self, oid: u32) -> Result<Option<TableName>> {
        source::table_of_oid(&self.0, oid).await
    }

    pub(crate) async fn table_exists(&self, table: &TableName) -> Result<bool> {
        source::table_exists(&self.0, table).await
    }

    /// The tables `publication` publishes.
    pub(crate) async fn published_tables(&self, publication: &str) -> Result<Vec<TableName>> {
        source::published_tables(&self.0, publication).await
    }
}
