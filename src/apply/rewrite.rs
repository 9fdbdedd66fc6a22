//! DDL that rewrote a table's rows with no change sent for them
//! (`crate::cdc::event::Event::Rewritten`): bronze follows the columns it
//! left, at its place in the stream, and silver is resynced ([`resync`]).

use std::sync::Arc;

use super::pipeline::Pipeline;
use super::resync::{self, request_on};
use crate::cdc::relation::RelationInfo;
use crate::error::Result;
use crate::lake::evolve::Mode;
use crate::lake::schema::history_only;
use crate::lake::writer::Position;
use crate::pg::lsn::Lsn;
use crate::pg::source::TableName;

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

    /// Bronze takes up `relation`, the columns a DDL statement of the
    /// transaction committing at `commit_lsn` left, at that place in its
    /// history: a rewrite's retype, which no change may follow, reaches
    /// bronze before the reload's reads do. A table the lake does not hold
    /// is left to its load.
    pub(super) async fn follow_in_bronze(
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
        if sink.bronze_at.is_none_or(|at| at.holds(commit_lsn)) {
            return Ok(());
        }
        self.resync_asked |= sink
            .follow(&self.lake, relation, Some(Mode::Bronze), None)
            .await?;
        sink.bronze_dirty |= sink.bronze.schema_staged();
        Ok(())
    }
}
