//! Silver: the current state of a source table, kept in step with it by
//! positional deletes (readable by pyiceberg, DuckDB and iceberg-rust,
//! unlike equality deletes) and new data files.
//!
//! A primary-key index maps every live row's key to its (data file,
//! position). At start it is restored from the state directory when it
//! was persisted there at the table's current snapshot, and otherwise
//! rebuilt from the table: each live data file's key columns, less the
//! positions its delete files name.
//!
//! Changes are staged into an open batch, which collapses them to the last
//! change per key in commit order: a key with a live row gets a positional
//! delete; inserts and updates write the new row; a key inserted and
//! deleted inside one batch writes nothing; a primary-key update deletes
//! the old key and writes the new one; a truncate deletes every live row.
//! A batch too large for memory is written to data files as it grows (a
//! later change to a row already written deletes it by position in the
//! same snapshot), and [`SilverTable::commit`] makes it one snapshot
//! (`row_delta`) recording the source position it covers.
//!
//! `keys` builds, restores and persists the key index; `unchanged` fills
//! unchanged TOAST values from the row silver holds; `load` takes the
//! initial load's rows; `compaction` and `undo` rewrite and take back.

mod compaction;
mod keys;
mod load;
mod unchanged;
mod undo;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::builder::{Int64Builder, TimestampMicrosecondBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::{TableIdent, TableUpdate};

use self::keys::{key_fields, planned_files};
use self::unchanged::{after_cell, missing_image};
use self::undo::Undo;
use crate::cdc::event::{Change, ColumnFinder, Op};
use crate::cdc::relation::RelationInfo;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::catalog::row_delta::{RowDelta, Written, commit_row_delta};
use crate::lake::files::arrow::{Verbatim, build_array_keeping, with_verbatim};
use crate::lake::files::position_deletes::write_position_deletes;
use crate::lake::files::writer::{
    LoadFile, Position, STAGE_BYTES, STAGE_ROWS, arrow_schema, read_parquet, write_data_files,
};
use crate::lake::schema::staged::StagedSchema;
use crate::lake::schema::{COMMIT_LSN, COMMIT_TS, VERBATIM, silver_schema};
use crate::lake::table::key::{Key, KeyCodec};
use crate::lake::table::key_index::{KeyIndex, MEMORY_ENTRIES, NewFile};

/// Position deletes an open batch holds in memory (about 24 bytes each)
/// before it writes them to a delete file of the batch.
pub(crate) const DELETES_HELD: usize = 1 << 20;

/// The last word on a key among the open batch's changes held in memory.
enum Pending {
    Upsert(Arc<Change>),
    Delete,
}

pub struct SilverTable {
    ident: TableIdent,
    /// The Iceberg table's UUID, which a table dropped and made again
    /// under the same name does not share.
    uuid: uuid::Uuid,
    schema: Arc<ArrowSchema>,
    /// Arrow schema indices of the primary-key columns, in key order.
    key_fields: Vec<usize>,
    codec: KeyCodec,
    /// Every live row in a file, committed or written for the open batch.
    index: KeyIndex,
    /// The snapshot the index holds exactly but for what is staged since
    /// (`staged`): the one opened, or the last this process committed on
    /// it with no other writer's commit between. `None` when unknown.
    exact_at: Option<i64>,
    /// The snapshot the index was built on, with only other writers'
    /// appends since: the one opened, or the last this process committed.
    built_on: Option<i64>,
    staged: bool,
    /// The folder of the state directory the index keeps its runs in and
    /// is persisted to; a temporary one when `None`.
    state: Option<PathBuf>,
    /// The open batch: the last change per key not yet in a file, keys in
    /// first-seen order.
    pending: HashMap<Key, Pending, foldhash::fast::RandomState>,
    order: Vec<Key>,
    pending_bytes: usize,
    /// The open batch's data files, the rows it deletes not yet in a
    /// position delete file, and those already written to one.
    written: Vec<DataFile>,
    deletes: Vec<(Arc<str>, i64)>,
    delete_files: Vec<DataFile>,
    /// The most deletes held in memory before they go to a delete file.
    deletes_held: usize,
    /// The last row group read to fill unchanged TOAST values: its file,
    /// its first row's position there, and its rows.
    cached_group: Option<(Arc<str>, usize, Vec<RecordBatch>)>,
    files: FileCounts,
    /// The initial load staged, while it is.
    load: Option<Load>,
    /// The schema changes the open batch commits.
    schema_changes: StagedSchema,
    /// The open batch replaces every row ([`Self::delete_all`]).
    replace_all: bool,
    /// What undoes the open batch in the index ([`Self::abandon`]); `None`
    /// once it did what the log does not undo.
    undo: Option<Undo>,
}

/// An initial load being staged.
struct Load {
    /// The data file being written, and the same file as the index knows
    /// it.
    file: Option<(LoadFile, NewFile)>,
    /// Whether the load began with nothing live and nothing staged: its
    /// keys then need no lookup.
    into_empty: bool,
}

/// Live data and delete files as last known, and the commits since the
/// last compaction: what decides when to compact.
#[derive(Default)]
struct FileCounts {
    data: usize,
    deletes: usize,
    /// Commits that wrote data or delete files since the last compaction
    /// (or the start).
    commits: usize,
}

impl SilverTable {
    /// Creates the table when missing and rebuilds the key index from it.
    pub async fn open(
        lake: &Lake,
        ident: TableIdent,
        relation: &RelationInfo,
    ) -> Result<SilverTable> {
        let table = lake.ensure_table(&ident, silver_schema(relation)?).await?;
        SilverTable::over(ident, table, None).await
    }

    /// Silver over `table`, the key index kept in `state`: restored from
    /// there when it was persisted at the table's current snapshot
    /// ([`Self::persist_index`]), else rebuilt there.
    pub(crate) async fn open_with_state(
        ident: TableIdent,
        table: Table,
        state: PathBuf,
    ) -> Result<SilverTable> {
        SilverTable::over(ident, table, Some(state)).await
    }

    /// An existing silver table, for maintenance outside a run.
    pub(crate) async fn open_existing(lake: &Lake, ident: TableIdent) -> Result<SilverTable> {
        let table = lake.catalog_table(&ident).await?;
        SilverTable::over(ident, table, None).await
    }

    async fn over(ident: TableIdent, table: Table, state: Option<PathBuf>) -> Result<SilverTable> {
        let schema = arrow_schema(&table)?;
        let key_fields = key_fields(&table, &schema)?;
        let fields: Vec<&Field> = key_fields.iter().map(|&i| schema.field(i)).collect();
        let codec = KeyCodec::new(&fields).map_err(|e| e.with_context("table", &ident))?;
        let mut silver = SilverTable {
            ident,
            uuid: table.metadata().uuid(),
            schema,
            key_fields,
            codec,
            index: KeyIndex::default(),
            exact_at: table.metadata().current_snapshot_id(),
            built_on: table.metadata().current_snapshot_id(),
            staged: false,
            state: None,
            pending: HashMap::default(),
            order: Vec::new(),
            pending_bytes: 0,
            written: Vec::new(),
            deletes: Vec::new(),
            delete_files: Vec::new(),
            deletes_held: DELETES_HELD,
            cached_group: None,
            files: FileCounts::default(),
            load: None,
            schema_changes: StagedSchema::default(),
            replace_all: false,
            undo: Some(Undo::default()),
        };
        let Some(state) = state else {
            silver.rebuild_index(&table).await?;
            return Ok(silver);
        };
        let restored = match silver.index_of(&table) {
            Some(of) => KeyIndex::restore(&state, &of, MEMORY_ENTRIES),
            None => None,
        };
        match restored {
            Some(index) => {
                silver.index = index;
                silver.count_files(&planned_files(&table).await?);
                tracing::info!(table = %silver.ident, rows = silver.index.live_rows(), "silver key index restored");
            }
            None => {
                KeyIndex::clean(&state)?;
                silver.index = KeyIndex::in_folder(state.clone(), MEMORY_ENTRIES);
                silver.rebuild_index(&table).await?;
            }
        }
        silver.state = Some(state);
        Ok(silver)
    }

    pub(crate) fn ident(&self) -> &TableIdent {
        &self.ident
    }

    /// The table as the open batch sees it: its schema changes staged.
    pub(crate) async fn table(&self, lake: &Lake) -> Result<Table> {
        self.schema_changes.table(lake, &self.ident).await
    }

    /// Whether the open batch commits schema or property updates.
    pub(crate) fn schema_staged(&self) -> bool {
        !self.schema_changes.is_empty()
    }

    /// Stages schema updates planned on [`Self::table`], for the open
    /// batch's commit; [`Self::refresh_schema`] then takes them up.
    pub(crate) fn stage_schema(&mut self, table: &Table, updates: Vec<TableUpdate>) {
        self.schema_changes.stage(table, updates);
    }

    /// Takes up the table's current schema after it evolved. The key's
    /// encoding follows its types: the index holds keys of the old one,
    /// which only a single integer or text key keeps (a key of several
    /// columns changes type only for a reload, which begins with an empty
    /// index: [`crate::lake::schema::evolve::Mode::SilverReload`]).
    pub(crate) async fn refresh_schema(&mut self, lake: &Lake) -> Result<()> {
        let table = self.table(lake).await?;
        self.schema = arrow_schema(&table)?;
        self.key_fields = key_fields(&table, &self.schema)?;
        let fields: Vec<&Field> = self
            .key_fields
            .iter()
            .map(|&i| self.schema.field(i))
            .collect();
        self.codec = KeyCodec::new(&fields).map_err(|e| e.with_context("table", &self.ident))?;
        self.cached_group = None;
        Ok(())
    }

    /// Live data files and delete files, as last known.
    pub fn file_counts(&self) -> (usize, usize) {
        (self.files.data, self.files.deletes)
    }

    /// Number of live rows, as the index knows them.
    pub fn row_count(&self) -> usize {
        self.index.live_rows()
    }

    /// Stages the removal of every row, committed and staged, as a
    /// truncate does: the next commit removes every file the table holds
    /// (rather than deleting each row by position) and adds only what
    /// came after. The batch's files written before are left out of it,
    /// for the orphan sweep (docs/tables.md, Snapshot expiry).
    pub(crate) fn delete_all(&mut self) {
        self.staged = true;
        self.exact_at = None;
        self.index = match &self.state {
            Some(state) => KeyIndex::in_folder(state.clone(), MEMORY_ENTRIES),
            None => KeyIndex::default(),
        };
        self.replace_all = true;
        self.undo = None;
        self.written.clear();
        self.deletes.clear();
        self.delete_files.clear();
        self.pending.clear();
        self.order.clear();
        self.pending_bytes = 0;
    }

    /// Adds a change of about `bytes` (`Change::approx_bytes`), its
    /// unchanged TOAST values already filled, to the open batch. A large
    /// batch is written to data files as it grows; nothing is visible until
    /// [`Self::commit`].
    pub async fn stage(&mut self, lake: &Lake, change: Arc<Change>, bytes: usize) -> Result<()> {
        self.staged = true;
        self.finish_load_file().await?;
        match change.op {
            Op::Truncate => self.delete_all(),
            Op::Delete => {
                let before = change
                    .before
                    .as_ref()
                    .ok_or_else(|| missing_image(&change))?;
                let key = self.key_of(&change, &before.row)?;
                self.set(key, Pending::Delete)?;
            }
            Op::Read | Op::Insert | Op::Update => {
                let after = change
                    .after
                    .as_ref()
                    .ok_or_else(|| missing_image(&change))?;
                let key = self.key_of(&change, after)?;
                if let Some(before) = &change.before {
                    let old_key = self.key_of(&change, &before.row)?;
                    if old_key != key {
                        self.set(old_key, Pending::Delete)?;
                    }
                }
                self.pending_bytes += bytes;
                self.set(key, Pending::Upsert(change))?;
            }
        }
        if self.pending.len() >= STAGE_ROWS || self.pending_bytes >= STAGE_BYTES {
            self.write_pending(lake).await?;
        }
        self.write_deletes_when_full(lake).await
    }

    /// Sets the most position deletes the open batch holds in memory
    /// (default [`DELETES_HELD`]); past it they go to a delete file of the
    /// batch, so a bulk DELETE takes memory of its batch, not of its size.
    pub fn hold_deletes(&mut self, rows: usize) {
        self.deletes_held = rows.max(1);
    }

    async fn write_deletes_when_full(&mut self, lake: &Lake) -> Result<()> {
        if self.deletes.len() < self.deletes_held {
            return Ok(());
        }
        let table = self.table(lake).await?;
        let deletes = std::mem::take(&mut self.deletes);
        self.delete_files
            .push(write_position_deletes(&table, deletes).await?);
        Ok(())
    }

    /// Makes `op` the last word on `key`; a row the key had in a file gets
    /// a position delete.
    fn set(&mut self, key: Key, op: Pending) -> Result<()> {
        if let Some(location) = self
            .index
            .remove(&key)
            .map_err(|e| e.with_context("table", &self.ident))?
        {
            Undo::removed(&mut self.undo, &key, &location);
            self.deletes.push(location);
        }
        if self.pending.insert(key.clone(), op).is_none() {
            self.order.push(key);
        }
        Ok(())
    }

    /// Writes what the open batch holds in memory to its data files, in
    /// the table's schema as it is: the changes staged name their columns
    /// as that schema does, which a rename is about to change.
    pub(crate) async fn write_staged(&mut self, lake: &Lake) -> Result<()> {
        self.finish_load_file().await?;
        self.write_pending(lake).await
    }

    /// Writes the rows held in memory to data files of the open batch.
    async fn write_pending(&mut self, lake: &Lake) -> Result<()> {
        let mut keys = Vec::new();
        let mut changes = Vec::new();
        for key in self.order.drain(..) {
            if let Some(Pending::Upsert(change)) = self.pending.remove(&key) {
                keys.push(key);
                changes.push(change);
            }
        }
        self.pending.clear();
        self.pending_bytes = 0;
        if changes.is_empty() {
            return Ok(());
        }
        let table = self.table(lake).await?;
        let batch = self
            .batch(&changes)
            .map_err(|e| e.with_context("table", &self.ident))?;
        let files = write_data_files(&table, batch).await?;
        let mut keys = keys.into_iter();
        for file in &files {
            let rows = file.record_count() as usize;
            let keyed: Vec<_> = (&mut keys).take(rows).enumerate().collect();
            if keyed.len() != rows {
                return Err(lake_error("more rows written than given", &self.ident));
            }
            let path: Arc<str> = file.file_path().into();
            Undo::added(&mut self.undo, &path, keyed.iter().map(|(_, k)| k));
            self.index
                .add_file(path, keyed)
                .map_err(|e| e.with_context("table", &self.ident))?;
        }
        if keys.next().is_some() {
            return Err(lake_error("fewer rows written than given", &self.ident));
        }
        self.written.extend(files);
        Ok(())
    }

    /// Commits the open batch as one snapshot recording `position`; an
    /// empty one when the batch changed nothing (which is how the load of
    /// an empty table is marked done).
    pub async fn commit(&mut self, lake: &Lake, position: Position) -> Result<Written> {
        let delta = self.prepare_commit(lake, position).await?;
        let committed = commit_row_delta(lake, &self.ident, &delta).await?;
        self.committed(&committed, delta.replace_all);
        Ok(delta.written())
    }

    /// What [`Self::commit`] commits, written and handed over, for a
    /// commit of several tables at once; [`Self::committed`] once it
    /// landed.
    pub(crate) async fn prepare_commit(
        &mut self,
        lake: &Lake,
        position: Position,
    ) -> Result<RowDelta> {
        self.finish_load_file().await?;
        self.load = None;
        self.write_pending(lake).await?;
        let replace_all = std::mem::take(&mut self.replace_all);
        if replace_all {
            self.files = FileCounts::default();
        }
        if !self.deletes.is_empty() {
            let table = self.table(lake).await?;
            let deletes = std::mem::take(&mut self.deletes);
            self.delete_files
                .push(write_position_deletes(&table, deletes).await?);
        }
        self.files.data += self.written.len();
        self.files.deletes += self.delete_files.len();
        self.files.commits +=
            usize::from(replace_all || !self.written.is_empty() || !self.delete_files.is_empty());
        Ok(RowDelta {
            data_files: std::mem::take(&mut self.written),
            delete_files: std::mem::take(&mut self.delete_files),
            properties: position.summary(),
            schema: std::mem::take(&mut self.schema_changes),
            replace_all,
            // A snapshot that replaces every row names no position.
            built_on: self.built_on.filter(|_| !replace_all),
            ..RowDelta::default()
        })
    }

    /// Silver's staged snapshot landed: `committed` is the table with it
    /// (and `replace_all`, whether it replaced every row).
    pub(crate) fn committed(&mut self, committed: &Table, replace_all: bool) {
        self.built_on = committed.metadata().current_snapshot_id();
        // A snapshot that replaces every row holds exactly the index's,
        // whatever it builds on.
        self.exact_at = match replace_all {
            true => committed.metadata().current_snapshot_id(),
            false => follows(self.exact_at, committed),
        };
        self.staged = false;
        self.undo = Some(Undo::default());
    }

    fn batch(&self, changes: &[Arc<Change>]) -> Result<RecordBatch> {
        let mut columns: Vec<Option<ArrayRef>> = Vec::with_capacity(self.schema.fields().len());
        let mut verbatim = Verbatim::default();
        for field in self.schema.fields() {
            let array: ArrayRef = match field.name().as_str() {
                VERBATIM => {
                    columns.push(None);
                    continue;
                }
                COMMIT_LSN => {
                    let mut b = Int64Builder::with_capacity(changes.len());
                    changes
                        .iter()
                        .for_each(|c| b.append_value(c.tx.commit_lsn.0 as i64));
                    Arc::new(b.finish())
                }
                COMMIT_TS => {
                    let DataType::Timestamp(_, zone) = field.data_type() else {
                        return Err(lake_error(
                            "the silver table's schema is not the one wal2iceberg writes",
                            &self.ident,
                        ));
                    };
                    let mut b = TimestampMicrosecondBuilder::with_capacity(changes.len())
                        .with_timezone_opt(zone.clone());
                    changes.iter().for_each(|c| b.append_value(c.tx.commit_ts));
                    Arc::new(b.finish())
                }
                name => {
                    let mut finder = ColumnFinder::new(name);
                    let cells = changes
                        .iter()
                        .map(|c| after_cell(c, finder.position(c), name))
                        .collect::<Result<Vec<_>>>()?;
                    build_array_keeping(field, &cells, &mut verbatim)?
                }
            };
            columns.push(Some(array));
        }
        let columns = with_verbatim(self.schema.fields(), columns, &verbatim, changes.len())?;
        RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| lake_error("cannot assemble the silver batch", &self.ident).with_source(e))
    }
}

/// The snapshot `committed` made, when it builds on `before` (no other
/// writer's commit between): what an index exact at `before` is exact at
/// once it took the commit's changes.
fn follows(before: Option<i64>, committed: &Table) -> Option<i64> {
    let snapshot = committed.metadata().current_snapshot()?;
    (snapshot.parent_snapshot_id() == before).then_some(snapshot.snapshot_id())
}

fn lake_error(message: &str, ident: &TableIdent) -> Error {
    Error::new(ErrorKind::Lake, message.to_owned()).with_context("table", ident)
}
