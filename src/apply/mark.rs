//! Marks: the slot never stands past what the lake records. A batch's
//! commit records its end in the tables it wrote; the stream can pass
//! positions no table records (a keepalive on a quiet database, a batch of
//! other tables' transactions), and before the slot is confirmed past
//! them every bronze table records the position as its mark
//! (`table_set::MARK`). A start whose slot stands further than anything
//! its lake records knows the slot confirmed changes the lake never got
//! (another consumer read it, or it was dropped and made again under its
//! name), and refuses it (docs/tables.md, The table set).
//!
//! A mark is a catalog commit on every bronze table, so one is written at
//! most every [`INTERVAL`]: the slot lags at most that much behind the
//! stream when the lake's tables are quiet.

use std::time::Duration;

use tokio::time::Instant;

use super::pipeline::Pipeline;
use super::table_set::{MARK, mark};
use crate::cdc::stream::ChangeStream;
use crate::error::Result;
use crate::lake::each_table;
use crate::pg::lsn::Lsn;

/// The least time between two marks of a run.
pub(super) const INTERVAL: Duration = Duration::from_secs(60);

impl Pipeline<'_> {
    /// Records `at` as the mark of every table's bronze that has none (made
    /// before marks were, or loaded since the last start), where the slot
    /// stands at the start: the check before it found the lake records
    /// that far, or its tables record no mark yet and nothing tells.
    pub(crate) async fn mark_unmarked(&mut self, at: Lsn) -> Result<()> {
        self.mark_tables(at, true).await
    }

    /// Records where the stream stands, when the slot waits there for the
    /// lake to record it and the last mark is [`INTERVAL`] old, or the
    /// stream ends (`ending`: the slot then holds no more WAL than it
    /// must while nothing reads it); then confirms it.
    pub(super) async fn mark_if_due(
        &mut self,
        stream: &mut ChangeStream,
        ending: bool,
    ) -> Result<()> {
        let Some(at) = stream.unrecorded() else {
            return Ok(());
        };
        if !ending && self.marked.is_some_and(|last| last.elapsed() < INTERVAL) {
            return Ok(());
        }
        self.writer_lock_held().await?;
        self.mark_tables(at, false).await?;
        self.marked = Some(Instant::now());
        stream.record(at).await?;
        self.confirmed(stream.confirmed());
        tracing::debug!(lsn = %at, "the slot's position recorded in the lake and confirmed");
        Ok(())
    }

    /// Records `at` as every table's bronze's mark, or only as that of
    /// those that record none.
    async fn mark_tables(&self, at: Lsn, only_unmarked: bool) -> Result<()> {
        let lake = &self.lake;
        let idents = self.sinks.values().map(|sink| sink.bronze.ident().clone());
        each_table(idents.map(|ident| async move {
            if only_unmarked && mark(&lake.catalog_table(&ident).await?).is_some() {
                return Ok(());
            }
            lake.update_properties(&ident, &[(MARK, at.0.to_string())])
                .await
        }))
        .await?;
        Ok(())
    }
}
