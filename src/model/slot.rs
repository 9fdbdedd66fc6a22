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
