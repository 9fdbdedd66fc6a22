//! One source table's sink: its bronze and silver tables, what each
//! holds, and the schema it follows.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::TryStreamExt;
use iceberg::TableIdent;

use super::backfill::{self, Backfill, Progress};
use super::naming::remove_state_folder;
use super::{resync, table_set};
use crate::cdc::event::{Change, TxInfo};
use crate::cdc::relation::RelationInfo;
use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;
use crate::lake::catalog::Lake;
use crate::lake::files::writer::Position;
use crate::lake::schema::evolve::{self, Mode};
use crate::lake::schema::{
    HISTORY_ONLY, bronze_schema, has_silver, history_only, silver_retired, silver_schema,
};
use crate::lake::table::bronze::BronzeTable;
use crate::lake::table::gap::Gap;
use crate::lake::table::silver::SilverTable;
use crate::metrics::metrics;

/// The two Iceberg tables of one source table.
pub(super) struct TableSink {
    /// The source table's columns as each table last followed them.
    pub(super) bronze_relation: Option<Arc<RelationInfo>>,
    pub(super) silver_relation: Option<Arc<RelationInfo>>,
    /// Silver asked to be reloaded for a schema change it cannot take in
    /// place, and takes no more changes until then.
    pub(super) reloading: bool,
    pub(super) bronze: BronzeTable,
    /// None for a table without a primary key: its history only.
    pub(super) silver: Option<SilverTable>,
    /// What each table already holds; `None` until its initial load landed.
    pub(super) bronze_at: Option<Position>,
    pub(super) silver_at: Option<Position>,
    /// The request this start's load resyncs the table for.
    pub(super) resync: Option<String>,
    /// The changes bronze took alone, silver being ahead of it.
    pub(super) gap: Gap,
    /// Whether the open batch staged anything for each table.
    pub(super) bronze_dirty: bool,
    pub(super) silver_dirty: bool,
    /// The open batch's changes by op, for the metrics.
    pub(super) ops: HashMap<&'static str, u64>,
    /// Silver commits since the last snapshot expiry, bronze commits since
    /// its last compaction.
    pub(super) commits_since_expiry: usize,
    /// The table's chunked backfill, while it is not done.
    pub(super) backfill: Option<Backfill>,
    pub(super) bronze_commits: usize,
}

impl TableSink {
    /// Opens (creating them when missing) the tables of `relation`'s
    /// source table, `idents` (bronze, silver); `resync` is the request
    /// this start's load resyncs it for.
    pub(super) async fn open(
        lake: &Lake,
        (bronze, silver_ident): (TableIdent, TableIdent),
        relation: &RelationInfo,
        slot: &str,
        resync: Option<String>,
        compact_after_files: usize,
        state: std::path::PathBuf,
    ) -> Result<TableSink> {
        // A table without a primary key keeps its history only, which its
        // bronze says once made.
        let existing = lake.table_if_exists(&bronze).await?;
        let mut keyless = match &existing {
            Some(table) => history_only(table),
            None => !has_silver(relation),
        };
        let mut retired = existing.as_ref().is_some_and(silver_retired);
        // A resync's load that finds the table without a primary key (it
        // was dropped since the request, ahead of the stream): the table is
        // history-only from here, as the stream would make it.
        if !keyless && resync.is_some() && !relation.has_primary_key {
            resync::retire_silver(lake, &bronze).await?;
            (keyless, retired) = (true, true);
        }
        let resync = resync.filter(|_| !keyless);
        // The silver of a table that lost its primary key
        // ([`TableSink::follow`]) goes; a table of that name that bronze
        // did not retire is left as it is.
        if retired {
            if lake.table_if_exists(&silver_ident).await?.is_some() {
                lake.drop_with_files(&silver_ident).await?;
                tracing::warn!(table = %relation.name, silver = %silver_ident, "dropped the silver table of a table without a primary key; its history is in bronze");
            }
            remove_state_folder(&state)?;
            resync::silver_dropped(lake, &bronze).await?;
        }
        let source = table_set::source_properties(&relation.name, relation.oid, slot);
        let mut properties: Vec<(&str, &str)> =
            source.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if keyless {
            properties.push(HISTORY_ONLY);
        }
        let bronze_table = lake
            .ensure_table_with(&bronze, bronze_schema(relation)?, &properties)
            .await?;
        table_set::record_source(lake, &bronze_table, &relation.name, relation.oid, slot).await?;
        // The tables follow the source's schema, and record its column
        // numbers, from the first change or load row that reaches them
        // ([`TableSink::follow`]): `relation` may be the catalog's of now,
        // ahead of the stream.
        // An existing silver keeps the key it has: `relation` may be of a
        // change before the table had one (a replay behind a resync that
        // gave it its silver, docs/tables.md, Schema changes).
        let silver_table = match keyless {
            true => None,
            false => match lake.table_if_exists(&silver_ident).await? {
                Some(table) => Some(table),
                None => Some(
                    lake.ensure_table(&silver_ident, silver_schema(relation)?)
                        .await?,
                ),
            },
        };
        let silver_at = silver_table
            .as_ref()
            .map(Position::of)
            .transpose()?
            .flatten();
        let progress = silver_table.as_ref().and_then(Progress::of);
        let mut silver = match silver_table {
            Some(table) => Some(SilverTable::open_with_state(silver_ident, table, state).await?),
            None => None,
        };
        // A resync's load replaces every row silver holds.
        if let Some(silver) = silver.as_mut().filter(|_| resync.is_some()) {
            silver.delete_all();
        }
        // A backfill not done goes on from what silver records of it; a
        // resync's load reads the table whole, and ends it.
        let backfill = match (silver.as_mut(), progress) {
            (Some(silver), Some(progress)) if !progress.done => match resync {
                None => Some(Backfill::new(progress, silver, Arc::new(relation.clone()))?),
                Some(_) => {
                    backfill::end_with_reload(lake, silver, progress).await?;
                    None
                }
            },
            _ => None,
        };
        let bronze_at = Position::of(&bronze_table)?;
        if let Some(at) = bronze_at {
            metrics()
                .last_source_commit_micros
                .fetch_max(at.commit_ts, Ordering::Relaxed);
        }
        Ok(TableSink {
            bronze_relation: None,
            silver_relation: None,
            reloading: false,
            bronze: BronzeTable::new(bronze),
            bronze_at,
            silver_at: silver_at.filter(|_| resync.is_none()),
            silver,
            resync,
            gap: Gap::default(),
            bronze_dirty: false,
            silver_dirty: false,
            ops: HashMap::new(),
            commits_since_expiry: 0,
            backfill,
            // Half a cycle ahead of silver's count, so that the two
            // compactions fall on different flushes and the stream waits
            // for one at a time.
            bronze_commits: compact_after_files / 2,
        })
    }

    /// Takes up a schema change of the source table (docs/tables.md,
    /// Schema changes) in the tables that take a change or load row of
    /// `relation`, each in its mode: a table follows the relations of
    /// what it takes, never one of an earlier or later point. True when
    /// that asked for the stream to start over: a resync, or silver
    /// dropped for a primary key gone.
    pub(super) async fn follow(
        &mut self,
        lake: &Lake,
        relation: &Arc<RelationInfo>,
        bronze: Option<Mode>,
        silver: Option<Mode>,
    ) -> Result<bool> {
        let same = |followed: &Option<Arc<RelationInfo>>| {
            followed.as_ref().is_some_and(|r| {
                Arc::ptr_eq(r, relation)
                    || (r.columns == relation.columns
                        && r.has_primary_key == relation.has_primary_key)
            })
        };
        let bronze = bronze.filter(|_| !same(&self.bronze_relation));
        let silver = silver.filter(|_| self.silver.is_some() && !same(&self.silver_relation));
        if bronze.is_none() && silver.is_none() {
            return Ok(false);
        }
        // A primary key where there was none: the table gets its silver,
        // loaded by a resync, as a table the lake lacks.
        let gains_silver = bronze == Some(Mode::Bronze)
            && self.silver.is_none()
            && !self.reloading
            && has_silver(relation);
        if gains_silver {
            let id = resync::request_silver(lake, self.bronze.ident()).await?;
            tracing::info!(
                table = %relation.name, request = %id,
                "the table has a primary key now: its silver table is made and loaded (resync) at the next transaction boundary; bronze keeps its history"
            );
            self.reloading = true;
        }
        // No primary key any more: silver can keep no row by key. The
        // table is its history only again, and the start that follows the
        // transaction boundary drops silver.
        let loses_silver =
            bronze == Some(Mode::Bronze) && self.silver.is_some() && !relation.has_primary_key;
        if loses_silver {
            resync::retire_silver(lake, self.bronze.ident()).await?;
            tracing::warn!(
                table = %relation.name,
                "the table has no primary key any more: its silver table takes no more changes and is dropped at the next transaction boundary; bronze keeps the whole history, and a primary key added again makes silver anew (docs/tables.md, Schema changes)"
            );
            self.reloading = true;
        }
        let silver = silver.filter(|_| !loses_silver);
        // The changes staged name their columns as the schema does now.
        if bronze.is_some() && self.bronze_relation.is_some() {
            self.bronze.write_staged(lake).await?;
        }
        if let Some(table) = self.silver.as_mut().filter(|_| silver.is_some()) {
            table.write_staged(lake).await?;
        }
        let bronze_table = self.bronze.table(lake).await?;
        let silver_table = match (&self.silver, silver) {
            (Some(table), Some(_)) => Some(table.table(lake).await?),
            _ => None,
        };
        let mut tables = Vec::new();
        tables.extend(bronze.map(|mode| (&bronze_table, mode)));
        tables.extend(silver_table.as_ref().zip(silver));
        let mut followed = evolve::follow(&tables, relation)?;
        // Staged, the updates land with the batch's rows or not at all.
        let mut updates = std::mem::take(&mut followed.updates).into_iter();
        if bronze.is_some() {
            let staged = updates.next().unwrap_or_default();
            self.bronze.stage_schema(&bronze_table, staged);
        }
        if let (Some(table), Some(planned_on)) = (self.silver.as_mut(), &silver_table) {
            table.stage_schema(planned_on, updates.next().unwrap_or_default());
        }
        if followed.changed {
            failpoint::hit("schema-staged");
        }
        // Ahead of its stream, bronze took new columns only: the stream's
        // relation of the same columns still has the rest to bring.
        if bronze.is_some_and(|mode| mode != Mode::BronzeAhead) {
            self.bronze_relation = Some(relation.clone());
        }
        if silver.is_some() {
            self.silver_relation = Some(relation.clone());
        }
        if let Some(table) = self.silver.as_mut().filter(|_| followed.changed) {
            table.refresh_schema(lake).await?;
        }
        if followed.reload_silver {
            let id = resync::request_on(lake, self.bronze.ident()).await?;
            tracing::info!(
                table = %relation.name, request = %id,
                "silver cannot take the schema change in place: it takes no more changes and is reloaded (resync) at the next transaction boundary"
            );
            self.reloading = true;
            return Ok(true);
        }
        // A table being resynced reads the new columns' values anyway.
        Ok(gains_silver
            || loses_silver
            || self.resync.is_none()
                && silver.is_some()
                && resync_for_defaults(lake, self.bronze.ident(), relation, &followed).await?)
    }

    /// Whether every table of the sink holds its initial load.
    pub(super) fn loaded(&self) -> bool {
        self.bronze_at.is_some() && (self.silver.is_none() || self.silver_at.is_some())
    }

    /// The sink's Iceberg tables: bronze, then silver when there is one.
    pub(super) fn idents(&self) -> Vec<&TableIdent> {
        std::iter::once(self.bronze.ident())
            .chain(self.silver.as_ref().map(SilverTable::ident))
            .collect()
    }

    /// Commits a resync's load at `position` ([`resync`]): silver first,
    /// every row it held deleted in the same snapshot; then bronze, the
    /// reload's reads with bronze's own position kept, so the changes
    /// before `position` still reach it, recording request `id`; then the
    /// request done. True when silver was compacted after.
    pub(super) async fn commit_resync(
        &mut self,
        lake: &Lake,
        position: Position,
        id: &str,
        compact_after_files: usize,
    ) -> Result<bool> {
        let (Some(silver), Some(kept)) = (&mut self.silver, self.bronze_at) else {
            return Err(Error::new(
                ErrorKind::Lake,
                "a resync needs a loaded bronze and a silver table",
            )
            .with_context("table", self.bronze.ident()));
        };
        silver.commit(lake, position).await?;
        self.silver_at = Some(position);
        self.silver_dirty = false;
        failpoint::hit("between-resync-silver-and-bronze");
        self.bronze
            .commit_recording(lake, kept, (resync::RESYNCED, id))
            .await?;
        self.bronze_dirty = false;
        resync::mark_done(lake, self.bronze.ident(), id).await?;
        tracing::info!(table = %silver.ident(), request = %id, lsn = %position.commit_lsn, "resynced");
        Ok(silver.compact(lake, compact_after_files).await?.is_some())
    }

    /// Loads silver from bronze's initial load at `at`, all bronze holds:
    /// what a crash between the two load commits leaves to do. Loaded from
    /// a newer snapshot instead, silver would hold the changes in between
    /// while bronze streams them, and their unchanged TOAST values would
    /// have no row to be filled from as it was then.
    pub(super) async fn load_silver_from_bronze(
        &mut self,
        lake: &Lake,
        at: Position,
    ) -> Result<()> {
        let Some(silver) = &mut self.silver else {
            return Ok(());
        };
        tracing::info!(table = %silver.ident(), lsn = %at.commit_lsn, "loading silver from bronze's initial load");
        let tx = TxInfo {
            xid: 0,
            commit_lsn: at.commit_lsn,
            commit_ts: at.commit_ts,
        };
        let mut rows = std::pin::pin!(self.bronze.load_rows(lake, at).await?);
        while let Some((batch, verbatim)) = rows.try_next().await? {
            silver
                .stage_load(
                    lake,
                    tx,
                    batch.schema().fields(),
                    batch.columns(),
                    &verbatim,
                )
                .await?;
        }
        silver.commit(lake, at).await?;
        self.silver_at = Some(at);
        Ok(())
    }
}

/// Requests a resync of a table whose silver just gained a column with a
/// default: the rows no change touched hold that default at the source,
/// and read null in silver until it is loaded again (docs/tables.md,
/// Schema changes).
async fn resync_for_defaults(
    lake: &Lake,
    bronze: &TableIdent,
    relation: &RelationInfo,
    followed: &evolve::Followed,
) -> Result<bool> {
    let defaulted: Vec<&str> = relation
        .columns
        .iter()
        .filter(|c| c.has_default && followed.added_to_silver.contains(&c.name))
        .map(|c| c.name.as_str())
        .collect();
    if !defaulted.is_empty() {
        let id = resync::request_on(lake, bronze).await?;
        tracing::info!(
            table = %relation.name, columns = ?defaulted, request = %id,
            "new columns with a default: silver is reloaded (resync) so that the rows before them hold it"
        );
    }
    Ok(!defaulted.is_empty())
}

/// Whether a table holding `held` still needs a streamed `change`: one not
/// yet loaded takes none (its load, `Pipeline::take_load`, holds them),
/// a loaded one the transactions it does not hold.
pub(super) fn wants(held: Option<Position>, change: &Change) -> bool {
    held.is_some_and(|at| !at.holds(change.tx.commit_lsn))
}
