//! The source database as the pipeline asks of it outside the stream:
//! where a slot stands, how much WAL it keeps, which tables an oid and a
//! publication name, and the heartbeat message. The pipeline (`apply`)
//! reaches the source through this and `capture` alone; the queries stay
//! in the wire (`pg::source`).

use crate::error::{Error, Result};
use crate::model::{SlotHealth, SlotInfo, TableName};
use crate::pg::config::PgConfig;
use crate::pg::replication::SLOT_IN_USE;
use crate::pg::source::{self, SourceClient};

/// An ordinary connection to the source.
pub(crate) struct Source(SourceClient);

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
    pub async fn slot_health(&self, slot: &str) -> Result<Option<SlotHealth>> {
        source::slot_health(&self.0, slot).await
    }

    /// Writes a logical message into the WAL, so that a slot on a server
    /// where only other databases write has something to confirm.
    pub async fn heartbeat(&self) -> Result<()> {
        source::emit_heartbeat(&self.0).await
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
