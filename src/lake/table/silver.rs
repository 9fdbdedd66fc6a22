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

mod compaction;
mod undo;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::builder::{Int64Builder, TimestampMicrosecondBuilder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, FieldRef, Schema as ArrowSchema};
use futures_util::TryStreamExt;
use iceberg::scan::FileScanTask;
use iceberg::spec::{DataContentType, DataFile};
use iceberg::table::Table;
use iceberg::{TableIdent, TableUpdate};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::schema::types::SchemaDescriptor;

use self::undo::Undo;
use crate::cdc::event::{Change, ColumnFinder, Datum, Op, TxInfo};
use crate::cdc::relation::RelationInfo;
use crate::cdc::value::Value;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::catalog::row_delta::{RowDelta, Written, commit_row_delta};
use crate::lake::files::align::{align, field_id};
use crate::lake::files::arrow::{
    Verbatim, arrow_value, build_array_keeping, load_source_column, verbatim_entries, with_verbatim,
};
use crate::lake::files::position_deletes::{DeleteReader, write_position_deletes};
use crate::lake::files::writer::{
    LoadFile, Position, STAGE_BYTES, STAGE_ROWS, arrow_schema, read_file, read_parquet,
    read_row_group, write_data_files,
};
use crate::lake::iceberg_error;
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

    /// What the key index is of when it holds exactly `table`'s current
    /// snapshot: the table, the snapshot and the key's field ids and types
    /// (which its encoding follows).
    fn index_of(&self, table: &Table) -> Option<String> {
        let snapshot = table.metadata().current_snapshot_id()?;
        Some(self.index_words(self.uuid, snapshot))
    }

    fn index_words(&self, uuid: uuid::Uuid, snapshot: i64) -> String {
        let key: Vec<String> = self
            .key_fields
            .iter()
            .map(|&i| {
                let field = self.schema.field(i);
                format!("{:?}:{}", field_id(field), field.data_type())
            })
            .collect();
        format!("{uuid}/{snapshot}/{}", key.join(","))
    }

    /// Persists the key index in its state folder, when it holds exactly
    /// the table's last snapshot this process committed or opened (nothing
    /// staged since); the next start on that snapshot restores it instead
    /// of reading every key. The table is of no more use after it.
    pub(crate) fn persist_index(&mut self) -> Result<bool> {
        let (Some(snapshot), Some(_), false) = (self.exact_at, &self.state, self.staged) else {
            return Ok(false);
        };
        let of = self.index_words(self.uuid, snapshot);
        std::mem::take(&mut self.index)
            .persist(&of)
            .map_err(|e| e.with_context("table", &self.ident))?;
        self.exact_at = None;
        Ok(true)
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

    /// The live data and delete files of the table's planned `tasks`, as
    /// [`Self::file_counts`] tells them.
    fn count_files(&mut self, tasks: &[FileScanTask]) {
        let deletes: std::collections::HashSet<&str> = tasks
            .iter()
            .flat_map(|t| t.deletes.iter().map(|d| d.file_path.as_str()))
            .collect();
        self.files = FileCounts {
            data: tasks.len(),
            deletes: deletes.len(),
            commits: 0,
        };
    }

    async fn rebuild_index(&mut self, table: &Table) -> Result<()> {
        let tasks = planned_files(table).await?;
        let mut deletes_by_file: HashMap<Arc<str>, Vec<i64>> = HashMap::new();
        let mut delete_files_read = std::collections::HashSet::new();
        for task in &tasks {
            for delete in &task.deletes {
                if delete.file_type != DataContentType::PositionDeletes {
                    return Err(lake_error(
                        "the silver table holds equality deletes, which wal2iceberg never writes",
                        &self.ident,
                    ));
                }
                if delete_files_read.insert(delete.file_path.clone()) {
                    for deleted in DeleteReader::open(table, &delete.file_path).await? {
                        let (file, pos) = deleted?;
                        deletes_by_file.entry(file).or_default().push(pos);
                    }
                }
            }
        }
        self.count_files(&tasks);
        for task in tasks {
            let deleted: std::collections::HashSet<i64> = deletes_by_file
                .remove(task.data_file_path.as_str())
                .unwrap_or_default()
                .into_iter()
                .collect();
            let keys = self.read_keys(table, &task.data_file_path).await?;
            let live = keys
                .into_iter()
                .enumerate()
                .filter(|(pos, _)| !deleted.contains(&(*pos as i64)));
            self.index
                .add_file(task.data_file_path.as_str().into(), live)
                .map_err(|e| e.with_context("table", &self.ident))?;
        }
        tracing::info!(table = %self.ident, rows = self.index.live_rows(), "silver key index rebuilt");
        Ok(())
    }

    /// The encoded keys of a data file's rows, in file order.
    async fn read_keys(&self, table: &Table, path: &str) -> Result<Vec<Key>> {
        let bytes = read_file(table, path).await?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| {
            lake_error("cannot read a silver data file", &self.ident)
                .with_context("file", path)
                .with_source(e)
        })?;
        let key_schema = Arc::new(self.schema.project(&self.key_fields).map_err(|e| {
            lake_error("cannot project the key columns", &self.ident).with_source(e)
        })?);
        let mask = key_projection(builder.parquet_schema(), &key_schema);
        let reader = builder.with_projection(mask).build().map_err(|e| {
            lake_error("cannot read a silver data file", &self.ident)
                .with_context("file", path)
                .with_source(e)
        })?;
        let mut keys = Vec::new();
        for batch in reader {
            let batch = batch.map_err(|e| {
                lake_error("cannot read a silver data file", &self.ident)
                    .with_context("file", path)
                    .with_source(e)
            })?;
            let batch = align(&batch, &key_schema, path)?;
            keys.extend(self.codec.encode_columns(batch.columns()).map_err(|e| {
                e.with_context("table", &self.ident)
                    .with_context("file", path)
            })?);
        }
        Ok(keys)
    }

    /// The key of a row image of `change`'s relation.
    pub(crate) fn key_of(&self, change: &Change, row: &[Datum]) -> Result<Key> {
        let mut fields = Vec::with_capacity(self.key_fields.len());
        let mut values = Vec::with_capacity(self.key_fields.len());
        for &i in &self.key_fields {
            let field = self.schema.field(i);
            let value = change.column(field.name()).and_then(|j| row.get(j));
            let Some(Datum::Value(v)) = value else {
                return Err(
                    Error::new(ErrorKind::Decode, "a change lacks its primary key")
                        .with_context("table", &change.relation.name)
                        .with_context("column", field.name())
                        .with_context("lsn", change.lsn),
                );
            };
            fields.push(field);
            values.push(v);
        }
        self.codec.encode_values(&fields, &values).map_err(|e| {
            e.with_context("table", &change.relation.name)
                .with_context("lsn", change.lsn)
                .with_context("xid", change.tx.xid)
        })
    }

    /// Replaces the unchanged TOAST values of an update's after image with
    /// the row's current values: from a complete before image (REPLICA
    /// IDENTITY FULL), else from the open batch or the row's data file. A
    /// value that cannot be found is an error, never a guess. Call before
    /// [`Self::stage`], and before the change goes to bronze too.
    pub async fn fill_unchanged(&mut self, lake: &Lake, change: &mut Change) -> Result<()> {
        change.fill_unchanged_from_before_image();
        let Some(after) = &change.after else {
            return Ok(());
        };
        let missing: Vec<usize> = after
            .iter()
            .enumerate()
            .filter(|(_, d)| matches!(d, Datum::UnchangedToast))
            .map(|(i, _)| i)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        // The row as it was: under its old key when the update moved it.
        let key = match &change.before {
            Some(before) => self.key_of(change, &before.row)?,
            None => self.key_of(change, after)?,
        };
        for column in missing {
            let value = self.current_value(lake, change, &key, column).await?;
            if let Some(after) = change.after.as_mut() {
                after[column] = Datum::Value(value);
            }
        }
        Ok(())
    }

    async fn current_value(
        &mut self,
        lake: &Lake,
        change: &Change,
        key: &[u8],
        column: usize,
    ) -> Result<Value> {
        let name = &change.relation.columns[column].name;
        match self.pending.get(key) {
            Some(Pending::Upsert(previous)) => {
                return match previous
                    .column(name)
                    .and_then(|j| previous.after.as_ref()?.get(j))
                {
                    Some(Datum::Value(v)) => Ok(v.clone()),
                    _ => Err(change.unfilled(name)),
                };
            }
            Some(Pending::Delete) => return Err(change.unfilled(name)),
            None => {}
        }
        let Some((file, pos)) = self.index.get(key)? else {
            return Err(change.unfilled(name));
        };
        let pos = usize::try_from(pos).unwrap_or(usize::MAX);
        let (batches, mut row) = self.group_rows(lake, &file, pos).await?;
        for batch in batches {
            if row < batch.num_rows() {
                let Some(array) = batch.column_by_name(name) else {
                    return Err(change.unfilled(name));
                };
                let kept = batch
                    .column_by_name(VERBATIM)
                    .map(|v| verbatim_entries(v.as_ref(), row))
                    .unwrap_or_default()
                    .into_iter()
                    .find(|(column, _)| column == name);
                return match kept {
                    Some((_, text)) => Ok(Value::Unknown(text)),
                    None => {
                        arrow_value(array.as_ref(), row).map_err(|e| e.with_context("file", &file))
                    }
                };
            }
            row -= batch.num_rows();
        }
        Err(lake_error(
            "the key index points past the end of a data file",
            &self.ident,
        )
        .with_context("file", &file))
    }

    /// The rows of the row group that holds row `pos` of a data file, in
    /// the table's schema, and `pos` within them: read once and kept while
    /// the same group is asked for again, so a fill reads a row group,
    /// never a whole file.
    async fn group_rows(
        &mut self,
        lake: &Lake,
        path: &Arc<str>,
        pos: usize,
    ) -> Result<(&[RecordBatch], usize)> {
        let held = self
            .cached_group
            .as_ref()
            .is_some_and(|(p, first, batches)| {
                let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
                p == path && (*first..first + rows).contains(&pos)
            });
        if !held {
            self.cached_group = None;
            let table = self.table(lake).await?;
            let (first, batches) = read_row_group(&table, path, pos).await?;
            let batches = batches
                .iter()
                .map(|batch| align(batch, &self.schema, path))
                .collect::<Result<Vec<_>>>()?;
            self.cached_group = Some((path.clone(), first, batches));
        }
        Ok(self
            .cached_group
            .as_ref()
            .map_or((&[], 0), |(_, first, b)| (b.as_slice(), pos - first)))
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

    /// Adds rows of the initial load of transaction `tx`: `columns` are
    /// the source columns (silver's types, in the relation's order, named
    /// by `fields`). They are encoded on a task of their own into the
    /// load's data files ([`LoadFile`]); the index learns their keys now.
    pub(crate) async fn stage_load(
        &mut self,
        lake: &Lake,
        tx: TxInfo,
        fields: &[FieldRef],
        columns: &[ArrayRef],
        verbatim: &Verbatim,
    ) -> Result<()> {
        self.staged = true;
        self.undo = None;
        let rows = columns.first().map_or(0, |c| c.len());
        let mut out: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for field in self.schema.fields() {
            out.push(match field.name().as_str() {
                VERBATIM => verbatim.array(field, rows)?,
                COMMIT_LSN => Arc::new(Int64Array::from_value(tx.commit_lsn.0 as i64, rows)),
                COMMIT_TS => {
                    let DataType::Timestamp(_, zone) = field.data_type() else {
                        return Err(lake_error(
                            "the silver table's schema is not the one wal2iceberg writes",
                            &self.ident,
                        ));
                    };
                    Arc::new(
                        TimestampMicrosecondArray::from_value(tx.commit_ts, rows)
                            .with_timezone_opt(zone.clone()),
                    )
                }
                _ => load_source_column(field, fields, columns, rows)
                    .map_err(|e| e.with_context("table", &self.ident))?,
            });
        }
        let key_columns: Vec<ArrayRef> = self.key_fields.iter().map(|&i| out[i].clone()).collect();
        let keys = self
            .codec
            .encode_columns(&key_columns)
            .map_err(|e| e.with_context("table", &self.ident))?;
        let load = self.load.get_or_insert_with(|| Load {
            file: None,
            into_empty: self.index.is_empty() && self.pending.is_empty(),
        });
        if !load.into_empty {
            // A table loaded again over rows it holds (not one wal2iceberg
            // loaded) loses them by key; the keys are then new to the index.
            for key in &keys {
                if let Some(location) = self.index.remove(key)? {
                    self.deletes.push(location);
                }
            }
        }
        let batch = RecordBatch::try_new(self.schema.clone(), out).map_err(|e| {
            lake_error("cannot assemble the silver batch", &self.ident).with_source(e)
        })?;
        let (file, indexed) = match &mut load.file {
            Some(open) => open,
            None => {
                let table = self.schema_changes.table(lake, &self.ident).await?;
                let file = LoadFile::create(&table).await?;
                let indexed = self.index.new_file(file.path().into())?;
                load.file.insert((file, indexed))
            }
        };
        let rows = (file.rows()..).zip(keys);
        file.write(batch).await?;
        if load.into_empty {
            self.index.add_fresh_rows(indexed, rows)
        } else {
            self.index.add_new_rows(indexed, rows)
        }
        .map_err(|e| e.with_context("table", &self.ident))?;
        if file.is_full() {
            self.finish_load_file().await?;
        }
        self.write_deletes_when_full(lake).await
    }

    /// Closes the load's data file, which the index already knows.
    async fn finish_load_file(&mut self) -> Result<()> {
        let Some((file, indexed)) = self.load.as_mut().and_then(|l| l.file.take()) else {
            return Ok(());
        };
        self.index.end_new_file(indexed);
        self.written.push(file.close().await?);
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

/// The value of column `name`, at position `at` of the change's relation,
/// in its after image; null when the relation no longer has the column.
fn after_cell<'a>(change: &'a Change, at: Option<usize>, name: &str) -> Result<Option<&'a Value>> {
    let Some(j) = at else {
        return Ok(None);
    };
    match change.after.as_ref().and_then(|row| row.get(j)) {
        None | Some(Datum::NotSent | Datum::Value(Value::Null)) => Ok(None),
        Some(Datum::Value(v)) => Ok(Some(v)),
        Some(Datum::UnchangedToast) => Err(change.unfilled(name)),
    }
}

/// Arrow schema indices of the primary-key columns (silver's identifier
/// fields), in column order: the order the source's key has.
fn key_fields(table: &Table, schema: &ArrowSchema) -> Result<Vec<usize>> {
    let iceberg = table.metadata().current_schema();
    let mut fields = iceberg
        .identifier_field_ids()
        .map(|id| {
            iceberg
                .field_by_id(id)
                .and_then(|f| schema.index_of(&f.name).ok())
        })
        .collect::<Option<Vec<usize>>>()
        .filter(|fields| !fields.is_empty())
        .ok_or_else(|| {
            lake_error(
                "the silver table has no primary key (identifier fields); wal2iceberg did not make it",
                table.identifier(),
            )
        })?;
    fields.sort_unstable();
    Ok(fields)
}

/// The file's leaf columns that hold `keys` (top-level primitives), found
/// as [`align`] finds them: by field id, or by name in a file without ids.
fn key_projection(file: &SchemaDescriptor, keys: &ArrowSchema) -> ProjectionMask {
    let leaves = file.columns().iter().enumerate().filter(|(_, column)| {
        let info = column.self_type().get_basic_info();
        keys.fields().iter().any(|key| match field_id(key) {
            Some(id) if info.has_id() => info.id() == id,
            _ => column.path().parts().first() == Some(key.name()),
        })
    });
    ProjectionMask::leaves(file, leaves.map(|(i, _)| i))
}

/// The snapshot `committed` made, when it builds on `before` (no other
/// writer's commit between): what an index exact at `before` is exact at
/// once it took the commit's changes.
fn follows(before: Option<i64>, committed: &Table) -> Option<i64> {
    let snapshot = committed.metadata().current_snapshot()?;
    (snapshot.parent_snapshot_id() == before).then_some(snapshot.snapshot_id())
}

fn missing_image(change: &Change) -> Error {
    Error::new(
        ErrorKind::Protocol,
        "a change lacks the row image its kind needs",
    )
    .with_context("table", &change.relation.name)
    .with_context("lsn", change.lsn)
}

fn lake_error(message: &str, ident: &TableIdent) -> Error {
    Error::new(ErrorKind::Lake, message.to_owned()).with_context("table", ident)
}

/// The table's live data files with the delete files that apply to each,
/// as a scan of its current snapshot plans them.
async fn planned_files(table: &Table) -> Result<Vec<FileScanTask>> {
    let context = |e: iceberg::Error| {
        iceberg_error(e, "cannot read the silver table").with_context("table", table.identifier())
    };
    if table.metadata().current_snapshot().is_none() {
        return Ok(Vec::new());
    }
    table
        .scan()
        .build()
        .map_err(context)?
        .plan_files()
        .await
        .map_err(context)?
        .try_collect()
        .await
        .map_err(context)
}
