//! DDL the stream marks though no change of its table may follow: a
//! rewrite of a table's rows (`crate::cdc::event::Event::Rewritten`)
//! resyncs silver ([`resync`]), and the columns an ALTER TABLE left
//! (`crate::cdc::event::Event::Described`) are followed by both tables at
//! that place in the stream.

use std::sync::Arc;

use super::pipeline::Pipeline;
use super::resync::{self, request_on};
use crate::cdc::relation::RelationInfo;
use crate::error::Result;
use crate::lake::files::writer::Position;
use crate::lake::schema::evolve::Mode;
use crate::lake::schema::history_only;
use crate::model::Lsn;
use crate::model::TableName;

impl Pipeline<'_> {
    /// DDL of the transaction committing at `commit_lsn` rewrote `table`'s
    /// rows with no change sent for them (`crate::cdc::event::Event::Rewritten`):
    /// a retype's `USING`, a volatile default, may have changed every
    /// value. Silver, unless a load already read the table after that
    /// transaction, takes no more changes and is resynced at the next
    /// transaction boundary; bronze's history holds no change for the
    /// rewrite, and gets the reload's reads.
    pub(super) async fn rewritten(&mut self, table: &TableName, commit_lsn: Lsn) -> Result<()> {
        let (bronze, silver) = self.idents(table);
        let (keyless, silver_at) = match self.sinks.get(table) {
            Some(sink) if sink.reloading => return Ok(()),
            Some(sink) => (sink.silver.is_none(), sink.silver_at),
            None => {
                let Some(bronze_table) = self.lake.table_if_exists(&bronze).await? else {
                    return Ok(());
                };
                if resync::pending(&bronze_table).is_some() {
                    return Ok(());
                }
                let silver_at = match self.lake.table_if_exists(&silver).await? {
                    Some(t) => Position::of(&t)?,
                    None => None,
                };
                (history_only(&bronze_table), silver_at)
            }
        };
        if keyless {
            tracing::warn!(
                %table, lsn = %commit_lsn,
                "DDL rewrote the rows of a table without a primary key, with no change sent for \
                 them: its bronze history holds no change for the rewrite (docs/tables.md, \
                 Schema changes)"
            );
            return Ok(());
        }
        if silver_at.is_none_or(|at| at.holds(commit_lsn)) {
            return Ok(());
        }
        let id = request_on(&self.lake, &bronze).await?;
        tracing::info!(
            %table, request = %id, lsn = %commit_lsn,
            "DDL rewrote the table's rows in place, with no change sent for them: silver takes \
             no more changes and is reloaded (resync) at the next transaction boundary"
        );
        if let Some(sink) = self.sinks.get_mut(table) {
            sink.reloading = true;
        }
        self.resync_asked = true;
        Ok(())
    }

    /// Both tables take up `relation`, the columns an ALTER TABLE of the
    /// transaction committing at `commit_lsn` left, at that place in the
    /// stream (`crate::cdc::event::Event::Described`), each unless it holds
    /// that transaction already; silver unless it waits for a reload. A
    /// table the lake does not hold is left to its load.
    pub(super) async fn follow_ddl(
        &mut self,
        relation: &Arc<RelationInfo>,
        commit_lsn: Lsn,
    ) -> Result<()> {
        if !self.sinks.contains_key(&relation.name) {
            let (bronze, _) = self.idents(&relation.name);
            if self.lake.table_if_exists(&bronze).await?.is_none() {
                return Ok(());
            }
            self.ensure_sink(relation).await?;
        }
        let sink = self
            .sinks
            .get_mut(&relation.name)
            .expect("ensure_sink just ran");
        let wants = |at: Option<Position>| at.is_some_and(|at| !at.holds(commit_lsn));
        let bronze = wants(sink.bronze_at).then_some(Mode::Bronze);
        let silver = (sink.silver.is_some() && !sink.reloading && wants(sink.silver_at))
            .then_some(Mode::Silver);
        if bronze.is_none() && silver.is_none() {
            return Ok(());
        }
        self.resync_asked |= sink.follow(&self.lake, relation, bronze, silver).await?;
        sink.bronze_dirty |= sink.bronze.schema_staged();
        sink.silver_dirty |= sink.silver.as_ref().is_some_and(|s| s.schema_staged());
        Ok(())
    }
}
