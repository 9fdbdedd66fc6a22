//! `wal2iceberg verify`: whether the lake holds what the source holds, while
//! the source goes on being written.
//!
//! Two comparisons per table, each of row counts, an order-independent
//! checksum (the wrapping sum of a hash of every row's columns) and the
//! keys that differ:
//!
//! 1. **The source against bronze at one source position.** A temporary
//!    slot exports a snapshot: the source exactly as of its consistent point
//!    P, read without stopping writers. Bronze, the complete ledger, replayed
//!    to P (each key's last change of a transaction committed before P, a
//!    truncate clearing what came before it) is the lake's state at exactly
//!    P. So that bronze holds every change before P, verify first waits
//!    until the pipeline's slot has confirmed P; when no run holds the slot,
//!    it peeks at the slot instead and stops if a change of a captured table
//!    committed before P is still unapplied.
//! 2. **Silver against bronze at silver's own position**: silver's current
//!    snapshot records the last source transaction it holds, and bronze is
//!    read after silver, so it holds that transaction too.
//!
//! Together: bronze holds the source's history up to P, and silver is the
//! state that history gives at silver's position. Both sides go through
//! the same value conversion to Arrow the pipeline uses (the source rows
//! that of the initial load, [`load_columns`]), so a value that conversion
//! maps wrongly is wrong on both sides and not found here; the type tests
//! cover that conversion against readers of their own (docs/testing.md).

use std::collections::HashMap;
use std::fmt::Write;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{Field, Schema as ArrowSchema};
use futures_util::TryStreamExt;
use iceberg::table::Table;

use self::replay::replay;
use self::wait::{wait_for_lake, wait_for_resyncs};
use crate::apply::RunOptions;
use crate::apply::load_columns;
use crate::apply::naming::idents;
use crate::apply::naming::names;
use crate::apply::table_set;
use crate::cdc::capture::read_now;
use crate::cdc::relation::{Catalog, RelationInfo};
use crate::cdc::snapshot::{LoadRows, SnapshotLoad};
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::{Lake, namespace};
use crate::lake::files::align::align;
use crate::lake::files::arrow::verbatim_entries;
use crate::lake::files::scan::scan;
use crate::lake::files::writer::Position;
use crate::lake::schema::evolve;
use crate::lake::schema::{VERBATIM, column_names, has_silver, history_only, source_arrow_fields};
use crate::lake::table::key::{Key, KeyCodec};
use crate::model::Lsn;
use crate::model::TableName;
use crate::pg::config::PgConfig;
use crate::pg::source::{self, SourceClient};

mod replay;
mod wait;

/// Differing keys kept to report; the count covers all of them.
const KEPT_DIFFERENCES: usize = 100_000;
/// Differing keys printed per comparison.
const SHOWN_DIFFERENCES: usize = 5;

/// Rows and their checksum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) rows: u64,
    pub(crate) checksum: u64,
}

impl Tally {
    fn add(&mut self, hash: u64) {
        self.rows += 1;
        self.checksum = self.checksum.wrapping_add(hash);
    }
}

/// Where a key differs: held by one side only, or by both with other values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    OnlyLeft,
    OnlyRight,
    Both,
}

/// One comparison: `left` (the source, or silver) against bronze replayed
/// to `position`.
#[derive(Debug, Clone)]
pub(crate) struct Comparison {
    pub(crate) left: &'static str,
    pub(crate) position: Lsn,
    pub(crate) left_tally: Tally,
    pub(crate) bronze_tally: Tally,
    /// Keys that differ, all of them.
    pub(crate) differing: u64,
    /// The smallest differing keys, described (`id=42`).
    pub(crate) first: Vec<(String, Side)>,
}

impl Comparison {
    pub(crate) fn equal(&self) -> bool {
        self.differing == 0
    }
}

#[derive(Debug, Clone)]
pub(crate) struct TableReport {
    pub(crate) table: TableName,
    pub(crate) source: Comparison,
    pub(crate) silver: Comparison,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub(crate) tables: Vec<TableReport>,
    /// Tables without a primary key, whose lake holds their history only:
    /// not compared (docs/operations.md).
    pub(crate) history_only: Vec<TableName>,
}

impl Report {
    pub fn equal(&self) -> bool {
        self.tables
            .iter()
            .all(|t| t.source.equal() && t.silver.equal())
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for t in &self.tables {
            let _ = writeln!(out, "{}", t.table);
            for c in [&t.source, &t.silver] {
                let verdict = if c.equal() {
                    "equal".to_owned()
                } else {
                    format!("{} keys differ", c.differing)
                };
                let _ = writeln!(
                    out,
                    "  {:<6} at {}: {} rows, checksum {:016x}; bronze {} rows, checksum {:016x}: {verdict}",
                    c.left,
                    c.position,
                    c.left_tally.rows,
                    c.left_tally.checksum,
                    c.bronze_tally.rows,
                    c.bronze_tally.checksum,
                );
                for (key, side) in &c.first {
                    let what = match side {
                        Side::OnlyLeft => format!("in {} only", c.left),
                        Side::OnlyRight => "in bronze only".to_owned(),
                        Side::Both => "values differ".to_owned(),
                    };
                    let _ = writeln!(out, "    {key}: {what}");
                }
            }
        }
        for table in &self.history_only {
            let _ = writeln!(
                out,
                "{table}\n  not compared: no primary key, the lake holds its history (bronze) only"
            );
        }
        out.push_str(match (self.equal(), self.history_only.is_empty()) {
            (true, true) => "the lake matches the source\n",
            (true, false) => "the lake matches the source in every table compared\n",
            (false, _) => "the lake DIFFERS from the source\n",
        });
        out
    }
}

/// Attempts at a consistent read of the source.
const ATTEMPTS: usize = 3;

/// Compares every captured table of `options` (see the module comment),
/// waiting up to `wait` for the lake to reach the source's position. A
/// read spoiled by a TRUNCATE after its snapshot (src/cdc/snapshot.rs), or
/// met by a load after it (a resync's, or a table's loaded beside the
/// stream), is tried again with a new snapshot, up to [`ATTEMPTS`] reads.
pub async fn verify(config: &PgConfig, options: &RunOptions, wait: Duration) -> Result<Report> {
    let mut attempt = 1;
    loop {
        match verify_once(config, options, wait).await {
            Err(e) if e.kind() == ErrorKind::Concurrent && attempt < ATTEMPTS => {
                tracing::warn!(error = %e, "the source changed under the read; verifying again");
                attempt += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) if e.kind() == ErrorKind::Concurrent => {
                return Err(Error::new(
                    ErrorKind::Concurrent,
                    format!(
                        "gave up after {ATTEMPTS} reads, each spoiled by a change meanwhile \
                         (a TRUNCATE, or a reload landing after the read's snapshot): verify \
                         again once the tables are quieter"
                    ),
                )
                .with_source(e));
            }
            result => return result,
        }
    }
}

async fn verify_once(config: &PgConfig, options: &RunOptions, wait: Duration) -> Result<Report> {
    let namespace = namespace(options.namespace.as_deref().unwrap_or(&config.dbname));
    let client = Arc::new(SourceClient::connect(config).await?);
    let catalog = Catalog::new(client.clone());
    let mut load = read_now(
        config,
        &catalog,
        &options.capture.slot,
        options.capture.tables.clone(),
    )
    .await?;
    // Before the wait: a TRUNCATE meanwhile would empty the tables to the
    // snapshot. It waits for verify instead.
    load.lock_tables().await?;
    crate::failpoint::stall("verify").await;
    let position = load.consistent_point();
    wait_for_lake(&client, options, position, wait).await?;
    let lake = Lake::open_existing(&options.lake).await?;
    // A table renamed at the source keeps its Iceberg tables' names.
    let mut chosen = options.table_names.clone();
    for table in &options.capture.tables {
        if !chosen.contains_key(table) {
            let oid = source::table_oid(&client, table).await?;
            let name = table_set::recorded_name(&lake, &namespace, table, Some(oid)).await?;
            chosen.insert(table.clone(), name);
        }
    }
    let names = names(&options.capture.tables, &chosen)?;
    if wait_for_resyncs(&lake, &namespace, &names, &options.capture.tables, wait).await? {
        // Silver was reloaded from a snapshot after this one.
        return Err(Error::new(
            ErrorKind::Concurrent,
            "a resync reloaded silver meanwhile: verifying again from a new snapshot",
        ));
    }
    let mut source = SourceRows {
        load: &mut load,
        pending: None,
    };
    let mut tables = Vec::new();
    let mut history = Vec::new();
    for table in &options.capture.tables {
        let (bronze_ident, silver_ident) = idents(&namespace, &names, table);
        if lake
            .table_if_exists(&bronze_ident)
            .await?
            .is_some_and(|b| history_only(&b))
        {
            // Its rows still end this table's part of the load.
            while source.next(table).await?.is_some() {}
            history.push(table.clone());
            continue;
        }
        let missing = |ident| {
            Error::new(
                ErrorKind::Lake,
                "the lake lacks the table: run has not loaded it yet",
            )
            .with_context("table", ident)
        };
        // Silver before bronze: bronze then holds silver's position too.
        let silver = lake
            .table_if_exists(&silver_ident)
            .await?
            .ok_or_else(|| missing(&silver_ident))?;
        let bronze = lake
            .table_if_exists(&bronze_ident)
            .await?
            .ok_or_else(|| missing(&bronze_ident))?;
        let silver_position = Position::of(&silver)?
            .ok_or_else(|| missing(&silver_ident))?
            .end_lsn;
        let first = source.next(table).await?;
        let relation = match &first {
            Some(rows) => rows.relation.clone(),
            None => source
                .load
                .relations()
                .iter()
                .find(|r| r.name == *table)
                .cloned()
                .ok_or_else(|| {
                    Error::new(ErrorKind::Server, "the source table was not read")
                        .with_context("table", table)
                })?,
        };
        if !has_silver(&relation) {
            return Err(Error::new(
                ErrorKind::Lake,
                "the source table has no primary key any more, and the lake still keeps its \
                 current rows by key: a run that reaches the change drops that silver table \
                 (bronze keeps the history); run, then verify again",
            )
            .with_context("table", table));
        }
        let shape = Shape::new(&evolve::as_table_holds(
            &relation,
            bronze.metadata().current_schema(),
        ))?;

        let mut against_source = Differences::new(replay(&bronze, &shape, position).await?);
        let mut next = first;
        while let Some(rows) = next {
            let (columns, verbatim) = load_columns(shape.schema.fields(), &rows, position)?;
            let batch = RecordBatch::try_new(shape.schema.clone(), columns).map_err(|e| {
                Error::new(ErrorKind::Lake, "cannot assemble the source rows")
                    .with_context("table", table)
                    .with_source(e)
            })?;
            against_source.add(&shape.hash(&batch, |row| verbatim.entries(row))?);
            next = source.next(table).await?;
        }

        let mut against_silver = Differences::new(replay(&bronze, &shape, silver_position).await?);
        let mut silver_columns = shape.columns();
        if column_names(&silver).iter().any(|c| c == VERBATIM) {
            silver_columns.push(VERBATIM.to_owned());
        }
        let renamed = renamed_since(&silver);
        let mut rows = scan(&silver, None, &silver_columns).await?;
        while let Some(batch) = rows.try_next().await? {
            let kept = batch.column_by_name(VERBATIM).cloned();
            let batch = align(&batch, &shape.schema, &silver_ident.to_string())?;
            against_silver
                .add(&shape.hash(&batch, |row| kept_entries(kept.as_ref(), row, &renamed))?);
        }
        tables.push(TableReport {
            table: table.clone(),
            source: against_source.finish(&shape, "source", position),
            silver: against_silver.finish(&shape, "silver", silver_position),
        });
    }
    // Ends the snapshot and drops the temporary slot.
    while load.next_rows().await?.is_some() {}
    Ok(Report {
        tables,
        history_only: history,
    })
}

/// The source rows of the load, table by table.
struct SourceRows<'a> {
    load: &'a mut SnapshotLoad,
    /// The first rows of the next table.
    pending: Option<LoadRows>,
}

impl SourceRows<'_> {
    /// The next rows of `table`; `None` once the load is past it.
    async fn next(&mut self, table: &TableName) -> Result<Option<LoadRows>> {
        let rows = match self.pending.take() {
            Some(rows) => rows,
            None => match self.load.next_rows().await? {
                Some(rows) => rows,
                None => return Ok(None),
            },
        };
        if rows.relation.name == *table {
            Ok(Some(rows))
        } else {
            self.pending = Some(rows);
            Ok(None)
        }
    }
}

/// The columns compared (the source table's, as the pipeline maps them)
/// and how a row is hashed and keyed.
struct Shape {
    schema: Arc<ArrowSchema>,
    /// Indices of the key columns in `schema`, in key order.
    key_columns: Vec<usize>,
    key: KeyCodec,
    rows: RowConverter,
}

impl Shape {
    fn new(relation: &RelationInfo) -> Result<Shape> {
        let bad = |e: &dyn std::fmt::Display| {
            Error::new(
                ErrorKind::Lake,
                format!("cannot map the table's columns: {e}"),
            )
            .with_context("table", &relation.name)
        };
        // Columns matched by name: the rows compared come from two tables,
        // each with field ids of its own.
        let fields: Vec<Field> = source_arrow_fields(relation)?
            .iter()
            .map(|f| f.as_ref().clone().with_metadata(Default::default()))
            .collect();
        let schema = Arc::new(ArrowSchema::new(fields));
        let key_columns: Vec<usize> = relation
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_primary_key)
            .map(|(i, _)| i)
            .collect();
        if key_columns.is_empty() {
            return Err(bad(&"it has no primary key"));
        }
        let key_fields: Vec<&Field> = key_columns.iter().map(|&i| schema.field(i)).collect();
        let key = KeyCodec::new(&key_fields)?;
        let rows = RowConverter::new(
            schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )
        .map_err(|e| bad(&e))?;
        Ok(Shape {
            schema,
            key_columns,
            key,
            rows,
        })
    }

    fn columns(&self) -> Vec<String> {
        self.schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    fn key_fields(&self) -> Vec<&Field> {
        self.key_columns
            .iter()
            .map(|&i| self.schema.field(i))
            .collect()
    }

    fn keys(&self, columns: &[ArrayRef]) -> Result<Vec<Key>> {
        self.key.encode_columns(columns)
    }

    /// Each row's key and the hash of all its compared columns and of the
    /// values kept verbatim for them (`verbatim`, by row, sorted; entries
    /// of other names, a dropped column's or bronze's `_cdc_before.*`, are
    /// not compared).
    fn hash(
        &self,
        batch: &RecordBatch,
        verbatim: impl Fn(usize) -> Vec<(String, String)>,
    ) -> Result<Vec<(Key, u64)>> {
        let key_columns: Vec<ArrayRef> = self
            .key_columns
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        let keys = self.keys(&key_columns)?;
        let rows = self.rows.convert_columns(batch.columns()).map_err(|e| {
            Error::new(ErrorKind::Lake, "cannot encode rows to compare").with_source(e)
        })?;
        Ok(keys
            .into_iter()
            .zip(rows.iter())
            .enumerate()
            .map(|(i, (key, row))| {
                let mut hasher = std::hash::DefaultHasher::new();
                row.as_ref().hash(&mut hasher);
                let mut kept = verbatim(i);
                kept.retain(|(column, _)| self.schema.index_of(column).is_ok());
                kept.hash(&mut hasher);
                (key, hasher.finish())
            })
            .collect())
    }
}

/// The entries of row `row` of a `_cdc_verbatim` column, sorted, each
/// under its column's name now: an entry names its column as it was
/// called when the row was written (`renamed`, [`renamed_since`]).
fn kept_entries(
    column: Option<&ArrayRef>,
    row: usize,
    renamed: &HashMap<String, String>,
) -> Vec<(String, String)> {
    let mut entries = column.map_or_else(Vec::new, |c| verbatim_entries(c.as_ref(), row));
    for (name, _) in &mut entries {
        if let Some(now) = renamed.get(name) {
            name.clone_from(now);
        }
    }
    entries.sort();
    entries
}

/// The names `table`'s top-level fields had before their current ones,
/// each with the current one, from its schemas' history; a name a field
/// of the current schema has is its own.
fn renamed_since(table: &Table) -> HashMap<String, String> {
    let metadata = table.metadata();
    let current = metadata.current_schema();
    let mut schemas: Vec<_> = metadata.schemas_iter().collect();
    schemas.sort_by_key(|s| s.schema_id());
    let mut last_id_of: HashMap<String, i32> = HashMap::new();
    for schema in schemas {
        for field in schema.as_struct().fields() {
            last_id_of.insert(field.name.clone(), field.id);
        }
    }
    last_id_of
        .into_iter()
        .filter(|(name, _)| current.as_struct().field_by_name(name).is_none())
        .filter_map(|(name, id)| Some((name, current.field_by_id(id)?.name.clone())))
        .collect()
}

/// One side's rows checked off against bronze's.
struct Differences {
    bronze: HashMap<Key, u64>,
    bronze_tally: Tally,
    left: Tally,
    differing: u64,
    kept: Vec<(Key, Side)>,
}

impl Differences {
    fn new(bronze: HashMap<Key, u64>) -> Differences {
        let mut bronze_tally = Tally::default();
        bronze.values().for_each(|&h| bronze_tally.add(h));
        Differences {
            bronze,
            bronze_tally,
            left: Tally::default(),
            differing: 0,
            kept: Vec::new(),
        }
    }

    fn differ(&mut self, key: Key, side: Side) {
        self.differing += 1;
        if self.kept.len() < KEPT_DIFFERENCES {
            self.kept.push((key, side));
        }
    }

    fn add(&mut self, rows: &[(Key, u64)]) {
        for (key, hash) in rows {
            self.left.add(*hash);
            match self.bronze.remove(key) {
                None => self.differ(key.clone(), Side::OnlyLeft),
                Some(h) if h != *hash => self.differ(key.clone(), Side::Both),
                Some(_) => {}
            }
        }
    }

    fn finish(mut self, shape: &Shape, left: &'static str, position: Lsn) -> Comparison {
        let rest: Vec<Key> = self.bronze.drain().map(|(key, _)| key).collect();
        rest.into_iter()
            .for_each(|key| self.differ(key, Side::OnlyRight));
        // Keys sort by their bytes as their values do (src/lake/table/key.rs).
        self.kept.sort_by(|(a, _), (b, _)| a.cmp(b));
        let fields = shape.key_fields();
        Comparison {
            left,
            position,
            left_tally: self.left,
            bronze_tally: self.bronze_tally,
            differing: self.differing,
            first: self
                .kept
                .iter()
                .take(SHOWN_DIFFERENCES)
                .map(|(key, side)| (shape.key.describe(&fields, key), *side))
                .collect(),
        }
    }
}
