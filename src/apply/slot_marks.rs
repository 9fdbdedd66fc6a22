//! Marks: the slot never stands past what the lake records. A batch's
//! commit records its end in the tables it wrote; the stream can pass
//! positions no table records (a keepalive on a quiet database, a batch of
//! other tables' transactions), and before the slot is confirmed past
//! them a bronze table records the position as its mark
//! (`table_set::MARK`). A start whose slot stands further than anything
//! its lake records knows the slot confirmed changes the lake never got
//! (another consumer read it, or it was dropped and made again under its
//! name), and refuses it (docs/tables.md, The table set).
//!
//! What the lake records is the furthest position any of its bronze
//! tables of the slot records, so one table takes the marks: a catalog
//! commit at most every [`SPACING`], however many tables the lake holds
//! (`drop-table` hands a dropped table's reach to the others).

use std::time::Duration;

use tokio::time::Instant;

use super::pipeline::Pipeline;
use super::table_set::{MARK, mark};
use crate::cdc::stream::ChangeStream;
use crate::error::Result;
use crate::lake::each_table;
use crate::model::Lsn;

/// The least time between two marks of a run: the slot lags the stream
/// by about that much at most when the lake's tables are quiet. A
/// keepalive asking for a reply is marked at once: a walsender shutting
/// down asks, and ends only once the slot stands where it sent.
pub(super) const SPACING: Duration = Duration::from_secs(5);

impl Pipeline<'_> {
    /// Records `at` as the mark of every table's bronze that has none (made
    /// before marks were, or loaded since the last start), where the slot
    /// stands at the start: the check before it found the lake records
    /// that far, or its tables record no mark yet and nothing tells.
    pub(crate) async fn mark_unmarked(&mut self, at: Lsn) -> Result<()> {
        let lake = &self.lake;
        let idents = self.sinks.values().map(|sink| sink.bronze.ident().clone());
        each_table(idents.map(|ident| async move {
            if mark(&lake.catalog_table(&ident).await?).is_some() {
                return Ok(());
            }
            lake.update_properties(&ident, &[(MARK, at.0.to_string())])
                .await
        }))
        .await?;
        Ok(())
    }

    /// When the next mark is due while the slot waits for one: the stream
    /// is read no longer than that before [`Self::mark_if_due`] runs. A
    /// PostgreSQL shutting down waits for it too: its walsenders end once
    /// their client confirmed all they sent.
    pub(super) fn mark_due(&self, stream: &ChangeStream) -> Option<Instant> {
        // With no table open there is none to take a mark.
        if self.sinks.is_empty() {
            return None;
        }
        stream.unrecorded()?;
        match self.marked {
            Some(last) if !stream.reply_asked() => Some(last + SPACING),
            _ => Some(Instant::now()),
        }
    }

    /// Records where the stream stands, when the slot waits there for the
    /// lake to record it and the last mark is [`SPACING`] old, the server
    /// asked for a reply (a fast shutdown waits for it), or the stream ends
    /// (`ending`: the slot then holds no more WAL than it must while
    /// nothing reads it); then confirms it.
    pub(super) async fn mark_if_due(
        &mut self,
        stream: &mut ChangeStream,
        ending: bool,
    ) -> Result<()> {
        let Some(at) = stream.unrecorded() else {
            return Ok(());
        };
        if !ending
            && !stream.reply_asked()
            && self.marked.is_some_and(|last| last.elapsed() < SPACING)
        {
            return Ok(());
        }
        // The same table each time: the first bronze by name.
        let Some(ident) = self.sinks.values().map(|sink| sink.bronze.ident()).min() else {
            return Ok(());
        };
        let ident = ident.clone();
        self.writer_lock_held().await?;
        self.lake
            .update_properties(&ident, &[(MARK, at.0.to_string())])
            .await?;
        self.marked = Some(Instant::now());
        stream.record(at).await?;
        self.confirmed(stream.confirmed());
        tracing::debug!(lsn = %at, table = %ident, "the slot's position recorded in the lake and confirmed");
        Ok(())
    }
}
