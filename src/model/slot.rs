use super::Lsn;

/// A replication slot as `pg_replication_slots` shows it: the wire reads
/// it, the capture and the pipeline judge by it.
#[derive(Debug, Clone)]
pub struct SlotInfo {
    pub(crate) plugin: Option<String>,
    pub(crate) database: Option<String>,
    pub(crate) active_pid: Option<i32>,
    /// Whether the process holding it is a walsender: a consumer streams
    /// from it. Any other holder is a backend whose SQL function reads it
    /// for a moment (`pg_logical_slot_peek_changes`, as `verify` does).
    pub(crate) streamed: bool,
    pub(crate) confirmed_flush_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub(crate) wal_status: Option<String>,
}

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
