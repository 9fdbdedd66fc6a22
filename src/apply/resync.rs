//! Resync requests: a table's silver reloaded from a new snapshot while
//! the stream goes on (`wal2iceberg resync`, `crate::ops::resync`, or the
//! run itself when a schema change asks for it); bronze keeps its history
//! and gets the reload's rows as reads at the snapshot's position.
//!
//! A request is recorded on T's bronze table (table properties, so it
//! works beside a running run and without one). A run that streams looks
//! for requests every [`POLL`]; seeing one, it commits what it holds at a
//! transaction boundary and starts over, and the start loads T from a
//! temporary slot's snapshot, as it loads a table the lake lacks. That load
//! commits silver first, with every row it held before deleted in the same
//! snapshot, so readers see the old rows or the new ones, never neither;
//! then bronze, the reload's rows at the snapshot's position with bronze's
//! own position left where it was, so the changes between that and the
//! snapshot still reach bronze (their unchanged TOAST values filled from
//! bronze's history, `lake::gap`). Bronze's commit records the request
//! (snapshot summary [`RESYNCED`]) and then the table [`DONE`]: a crash
//! before bronze's commit does the whole resync again, one after it only
//! records it done.

use std::sync::Arc;
use std::time::Duration;

use iceberg::TableIdent;
use iceberg::table::Table;

use super::pipeline::Pipeline;
use crate::cdc::relation::RelationInfo;
use crate::error::Result;
use crate::lake::catalog::Lake;
use crate::lake::evolve::Mode;
use crate::lake::schema::history_only;
use crate::lake::writer::Position;
use crate::pg::lsn::Lsn;
use crate::pg::source::TableName;

/// Bronze's properties: the latest request, and the latest one done.
pub const REQUESTED: &str = "wal2iceberg.resync-requested";
pub const DONE: &str = "wal2iceberg.resync-done";
/// The snapshot summary property of bronze's commit of a reload's rows.
pub const RESYNCED: &str = "wal2iceberg.resynced";

/// How often a streaming run looks for requests.
pub const POLL: Duration = Duration::from_secs(5);

/// How often a property update is tried when a run's commit came first.
const ATTEMPTS: usize = 10;

/// The request pending on `bronze`: one not done yet.
pub fn pending(bronze: &Table) -> Option<String> {
    let properties = bronze.metadata().properties();
    let requested = properties.get(REQUESTED)?;
    (properties.get(DONE) != Some(requested)).then(|| requested.clone())
}

/// Whether bronze's commit of request `id`'s rows landed: a crash came
/// before it was recorded done.
pub fn committed(bronze: &Table, id: &str) -> bool {
    let metadata = bronze.metadata();
    let mut snapshot = metadata.current_snapshot();
    while let Some(s) = snapshot {
        if s.summary()
            .additional_properties
            .get(RESYNCED)
            .map(String::as_str)
            == Some(id)
        {
            return true;
        }
        snapshot = s
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id));
    }
    false
}

/// Records a new request on the bronze table `ident`; its id.
pub async fn request_on(lake: &Lake, ident: &TableIdent) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    set_property(lake, ident, REQUESTED, &id).await?;
    Ok(id)
}

/// Records request `id` done on the bronze table `ident`.
pub async fn mark_done(lake: &Lake, ident: &TableIdent, id: &str) -> Result<()> {
    set_property(lake, ident, DONE, id).await
}

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
                if pending(&bronze_table).is_some() {
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

/// Sets one property, reloading the table and trying again when another
/// commit (a run's) came first.
async fn set_property(lake: &Lake, ident: &TableIdent, key: &str, value: &str) -> Result<()> {
    let mut attempt = 1;
    loop {
        let table = lake.catalog_table(ident).await?;
        match lake
            .set_properties(&table, &[(key, value.to_owned())])
            .await
        {
            Ok(()) => return Ok(()),
            Err(_) if attempt < ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
            }
            Err(e) => return Err(e),
        }
    }
}
