//! The initial load: every published table read inside the snapshot the
//! slot exported, as [`Op::Read`] changes of one snapshot transaction at the
//! slot's consistent point. The rows come as runs of binary COPY data
//! ([`LoadRows`]), which the pipeline turns into Arrow columns without a
//! value per cell; [`SnapshotLoad::next_event`] gives them as changes.
//!
//! Why there is no gap and no duplicate: the exported snapshot sees exactly
//! the transactions that committed before the consistent point, and the
//! slot streams exactly those that commit after it
//! (<https://www.postgresql.org/docs/current/protocol-replication.html>,
//! CREATE_REPLICATION_SLOT). The snapshot is only valid while the
//! replication connection that exported it stays idle, so the whole load
//! runs before START_REPLICATION is sent.
//!
//! Several tables load in parallel ([`SnapshotLoad::in_parallel`]): every
//! further connection imports the same snapshot (`SET TRANSACTION
//! SNAPSHOT`), as `pg_dump --jobs` does, takes the next piece not yet
//! started, and decodes its runs on a task of its own. A piece is a whole
//! table, or, for a table without a key (which the chunked backfill
//! cannot read) of [`SPLIT_PAGES`] pages or more per connection, a range
//! of its heap blocks (a TID range scan): a large keyless table is read
//! on every connection at once. A table with a key is read whole here:
//! `--backfill chunked` is its parallel read, and on two cores a second
//! backend on one table took CPU from the encoding (docs/benchmarks.md).
//!
//! TRUNCATE and the table-rewriting forms of ALTER TABLE are not MVCC-safe
//! (<https://www.postgresql.org/docs/current/mvcc-caveats.html>): one that
//! commits after the snapshot was taken leaves the table empty to it. So
//! each table is locked (ACCESS SHARE, as pg_dump does) before its COPY,
//! and a table whose storage changed since the snapshot stops the load
//! with an [`crate::error::ErrorKind::Concurrent`] error instead of
//! loading nothing.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_postgres::CopyOutStream;

use super::event::{Change, Datum, Event, Op, TxInfo};
use super::relation::{Catalog, RelationInfo};
use super::value::{Value, Wire};
use crate::error::{Error, Result};
use crate::model::Lsn;
use crate::model::TableName;
use crate::pg::config::PgConfig;
use crate::pg::conn::ReplicationConnection;
use crate::pg::copy::{BinaryCopyReader, CopyRows};
use crate::pg::source::{self, Blocks, SourceClient};

/// A run of rows ends at this many rows, or about this many bytes.
const RUN_ROWS: usize = 64 * 1024;
const RUN_BYTES: usize = 32 << 20;

/// A table is split into block ranges, one per connection, when each range
/// would have at least this many pages (8 MB of 8 kB pages).
const SPLIT_PAGES: u64 = 1024;

struct TableCopy {
    relation: Arc<RelationInfo>,
    wires: Arc<[Wire]>,
    stream: Pin<Box<CopyOutStream>>,
    reader: BinaryCopyReader,
    /// `pg_class.reltuples`: the planner's estimate, -1 if never analyzed.
    estimate: i64,
}

/// Rows of one table in COPY's binary format, each column in the form
/// `wires` names.
pub struct LoadRows {
    pub relation: Arc<RelationInfo>,
    pub(crate) wires: Arc<[Wire]>,
    pub rows: CopyRows,
    /// The `seq` of the first row: the load numbers its rows from 0.
    pub(crate) first_seq: u64,
    /// Rows of the table read so far, these included.
    pub table_rows: u64,
    /// The table's row estimate, when it was ever analyzed or vacuumed.
    pub estimate: Option<u64>,
}

impl LoadRows {
    /// Calls `f` with each row's values, in column order.
    pub fn for_each_row(&self, lsn: Lsn, mut f: impl FnMut(Vec<Datum>)) -> Result<()> {
        self.rows.for_each(|fields| {
            let row = fields
                .zip(self.wires.iter())
                .zip(&self.relation.columns)
                .map(|((field, wire), column)| match field {
                    None => Ok(Datum::Value(Value::Null)),
                    Some(bytes) => self
                        .relation
                        .decode_field(column, *wire, bytes, lsn)
                        .map(Datum::Value),
                })
                .collect::<Result<Vec<_>>>()?;
            f(row);
            Ok(())
        })
    }
}

/// What one connection reads of a table: all of it, or a range of its
/// heap blocks.
#[derive(Debug, Clone)]
struct Piece {
    table: TableName,
    blocks: Option<Blocks>,
}

/// What the pieces of one table share.
#[derive(Default)]
struct Tally {
    /// Rows read so far.
    rows: AtomicU64,
    /// Pieces not yet read to their end.
    pieces: AtomicUsize,
}

/// What the connections of one load share: the pieces no connection has
/// started yet, each table's tally, and the numbering of rows.
struct Plan {
    pending: Mutex<VecDeque<Piece>>,
    tallies: HashMap<TableName, Tally>,
    seq: AtomicU64,
}

impl Plan {
    fn new(pieces: Vec<Piece>) -> Plan {
        let mut tallies = HashMap::<TableName, Tally>::new();
        for piece in &pieces {
            tallies
                .entry(piece.table.clone())
                .or_default()
                .pieces
                .fetch_add(1, Ordering::Relaxed);
        }
        Plan {
            pending: Mutex::new(pieces.into()),
            tallies,
            seq: AtomicU64::new(0),
        }
    }

    /// The pieces not started yet; a queue that outlives a panicked holder.
    fn pending(&self) -> MutexGuard<'_, VecDeque<Piece>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tally(&self, table: &TableName) -> &Tally {
        &self.tallies[table]
    }
}

/// One connection inside the exported snapshot, copying one table at a
/// time.
struct TableReader {
    client: SourceClient,
    catalog: Catalog,
    current: Option<TableCopy>,
    /// The tables this connection read, empty ones included.
    relations: Vec<Arc<RelationInfo>>,
}

impl TableReader {
    async fn open(
        client: SourceClient,
        catalog: Catalog,
        snapshot_name: &str,
    ) -> Result<TableReader> {
        source::begin_snapshot(&client, snapshot_name).await?;
        Ok(TableReader {
            client,
            catalog,
            current: None,
            relations: Vec::new(),
        })
    }

    /// The next run of rows of the plan's tables; `None` once none is
    /// left to start.
    async fn next_rows(&mut self, plan: &Plan) -> Result<Option<LoadRows>> {
        loop {
            let Some(copy) = self.current.as_mut() else {
                let Some(piece) = plan.pending().pop_front() else {
                    return Ok(None);
                };
                self.current = Some(self.start_copy(&piece).await?);
                continue;
            };
            let ended = if copy.reader.rows() >= RUN_ROWS || copy.reader.bytes() >= RUN_BYTES {
                false
            } else {
                match source::next_copy_chunk(&mut copy.stream, &copy.relation.name).await? {
                    Some(chunk) => {
                        copy.reader.push(&chunk).map_err(|e| {
                            Error::from(e).with_context("table", &copy.relation.name)
                        })?;
                        continue;
                    }
                    None => {
                        copy.reader.finish().map_err(|e| {
                            Error::from(e).with_context("table", &copy.relation.name)
                        })?;
                        true
                    }
                }
            };
            let rows = copy.reader.take();
            let tally = plan.tally(&copy.relation.name);
            let taken = rows.len() as u64;
            let run = LoadRows {
                relation: copy.relation.clone(),
                wires: copy.wires.clone(),
                first_seq: plan.seq.fetch_add(taken, Ordering::Relaxed),
                table_rows: tally.rows.fetch_add(taken, Ordering::Relaxed) + taken,
                estimate: u64::try_from(copy.estimate).ok(),
                rows,
            };
            if ended {
                if tally.pieces.fetch_sub(1, Ordering::AcqRel) == 1 {
                    tracing::info!(table = %run.relation.name, rows = run.table_rows, "initial load of table done");
                }
                self.current = None;
            }
            if !run.rows.is_empty() {
                return Ok(Some(run));
            }
        }
    }

    /// Ends the snapshot transaction, releasing the tables' locks.
    async fn finish(&mut self) -> Result<()> {
        self.client
            .batch_execute("COMMIT")
            .await
            .map_err(|e| crate::error::postgres(e, "cannot end the snapshot transaction"))
    }

    async fn start_copy(&mut self, piece: &Piece) -> Result<TableCopy> {
        let table = &piece.table;
        let described = source::describe_table(&self.client, table).await?;
        source::lock_unchanged_since_snapshot(&self.client, std::slice::from_ref(table)).await?;
        let relation = Arc::new(self.catalog.relation_from_table(&described).await?);
        let estimate: i64 = self
            .client
            .query_one(
                "SELECT reltuples::int8 FROM pg_class WHERE oid = $1",
                &[&described.oid],
            )
            .await
            .map_err(|e| crate::error::postgres(e, "cannot read the table's row estimate"))?
            .get(0);
        let (wires, casts): (Vec<Wire>, Vec<bool>) = relation
            .columns
            .iter()
            .map(|c| Wire::of(c.type_oid))
            .unzip();
        let stream =
            Box::pin(source::copy_out(&self.client, &described, &casts, piece.blocks).await?);
        self.relations.push(relation.clone());
        if piece.blocks.is_none_or(|b| b.from == 0) {
            tracing::info!(table = %table, "initial load of table started");
        }
        Ok(TableCopy {
            reader: BinaryCopyReader::new(relation.columns.len()),
            relation,
            wires: wires.into(),
            stream,
            estimate,
        })
    }

    /// Reads runs until the plan has no table left, handing each, turned
    /// into a `T` by `decode`, to `out`; stops early once `out` is closed.
    async fn feed<T>(
        mut self,
        plan: Arc<Plan>,
        decode: Arc<dyn Fn(LoadRows) -> Result<T> + Send + Sync>,
        out: mpsc::Sender<Result<T>>,
    ) -> Result<Vec<Arc<RelationInfo>>> {
        loop {
            let item = match self.next_rows(&plan).await {
                Ok(Some(rows)) => decode(rows),
                Ok(None) => {
                    self.finish().await?;
                    return Ok(self.relations);
                }
                Err(e) => Err(e),
            };
            let failed = item.is_err();
            if out.send(item).await.is_err() || failed {
                return Ok(Vec::new());
            }
        }
    }
}

/// Reads the load table by table, in runs of rows, on one connection; or,
/// through [`SnapshotLoad::in_parallel`], on several.
pub struct SnapshotLoad {
    reader: TableReader,
    plan: Arc<Plan>,
    /// Every table the load reads.
    tables: Vec<TableName>,
    snapshot_name: String,
    /// The replication connection of a temporary slot that exported the
    /// snapshot; closed (dropping the slot) when the load ends.
    exporter: Option<ReplicationConnection>,
    tx: TxInfo,
    /// Rows decoded for [`SnapshotLoad::next_event`], not yet returned.
    events: VecDeque<Change>,
    began: bool,
    finished: bool,
}

impl SnapshotLoad {
    /// Opens the exported snapshot on `client` (a connection of its own).
    pub(crate) async fn begin(
        client: SourceClient,
        catalog: Catalog,
        snapshot_name: &str,
        consistent_point: Lsn,
        tables: Vec<TableName>,
        exporter: Option<ReplicationConnection>,
    ) -> Result<SnapshotLoad> {
        let reader = TableReader::open(client, catalog, snapshot_name).await?;
        let commit_ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Ok(SnapshotLoad {
            reader,
            plan: Arc::new(Plan::new(
                tables
                    .iter()
                    .map(|table| Piece {
                        table: table.clone(),
                        blocks: None,
                    })
                    .collect(),
            )),
            tables,
            snapshot_name: snapshot_name.to_owned(),
            exporter,
            tx: TxInfo {
                xid: 0,
                commit_lsn: consistent_point,
                commit_ts,
            },
            events: VecDeque::new(),
            began: false,
            finished: false,
        })
    }

    /// Locks every table still to be read now rather than just before its
    /// COPY, for a caller that keeps the snapshot open a while first.
    pub(crate) async fn lock_tables(&self) -> Result<()> {
        let pending: Vec<TableName> = self
            .plan
            .pending()
            .iter()
            .map(|p| p.table.clone())
            .collect();
        source::lock_unchanged_since_snapshot(&self.reader.client, &pending).await
    }

    /// The consistent point: confirm it once the load is durable.
    pub fn consistent_point(&self) -> Lsn {
        self.tx.commit_lsn
    }

    /// The relations of the tables read so far: all of them, empty ones
    /// included, once the load has ended.
    pub(crate) fn relations(&self) -> &[Arc<RelationInfo>] {
        &self.reader.relations
    }

    /// Every table the load reads.
    pub(crate) fn tables(&self) -> &[TableName] {
        &self.tables
    }

    /// The load's transaction: xid 0, committed at the consistent point.
    pub(crate) fn tx(&self) -> TxInfo {
        self.tx
    }

    /// The next run of rows, all of one table, the tables in the order
    /// given; `None` once every table was read (the snapshot is then
    /// closed).
    pub async fn next_rows(&mut self) -> Result<Option<LoadRows>> {
        if self.finished {
            return Ok(None);
        }
        if let Some(rows) = self.reader.next_rows(&self.plan).await? {
            return Ok(Some(rows));
        }
        self.reader.finish().await?;
        self.finished = true;
        if let Some(exporter) = self.exporter.take() {
            exporter.close().await?;
        }
        Ok(None)
    }

    /// The load as events, one change per row: Begin, the rows, Commit.
    pub async fn next_event(&mut self) -> Result<Option<Event>> {
        if !self.began {
            self.began = true;
            return Ok(Some(Event::Begin(self.tx)));
        }
        loop {
            if let Some(change) = self.events.pop_front() {
                return Ok(Some(Event::Change(change)));
            }
            if self.finished {
                return Ok(None);
            }
            let Some(rows) = self.next_rows().await? else {
                return Ok(Some(Event::Commit {
                    tx: self.tx,
                    end_lsn: self.tx.commit_lsn,
                }));
            };
            let tx = self.tx;
            let mut seq = rows.first_seq;
            rows.for_each_row(tx.commit_lsn, |row| {
                self.events.push_back(Change {
                    op: Op::Read,
                    relation: rows.relation.clone(),
                    tx,
                    seq,
                    lsn: tx.commit_lsn,
                    before: None,
                    after: Some(row),
                    truncate_options: 0,
                });
                seq += 1;
            })?;
        }
    }

    /// Reads the tables on up to `connections` connections at once, each
    /// in the same exported snapshot (connections beyond the first are
    /// opened with `config`), and turns each run into a `T` with `decode`
    /// on its connection's task. A table without a key of [`SPLIT_PAGES`]
    /// pages or more per connection is read in block ranges, one per
    /// connection, at once. The runs of a table read whole keep their order; runs of
    /// different tables, and of a split table's ranges, interleave. Call
    /// it before reading any run.
    pub async fn in_parallel<T: Send + 'static>(
        mut self,
        config: &PgConfig,
        connections: usize,
        decode: impl Fn(LoadRows) -> Result<T> + Send + Sync + 'static,
    ) -> Result<ParallelLoad<T>> {
        let pieces = self.split(connections).await?;
        let tables = self.tables.len();
        let client = self.reader.catalog.client().clone();
        let mut readers = vec![self.reader];
        for _ in 1..connections.min(pieces) {
            let connection = SourceClient::connect(config).await?;
            let catalog = Catalog::new(client.clone());
            readers.push(TableReader::open(connection, catalog, &self.snapshot_name).await?);
        }
        tracing::info!(
            tables,
            pieces,
            connections = readers.len(),
            "initial load reads in one snapshot"
        );
        let (out, received) = mpsc::channel(readers.len());
        let decode: Arc<dyn Fn(LoadRows) -> Result<T> + Send + Sync> = Arc::new(decode);
        let mut tasks = JoinSet::new();
        for reader in readers {
            tasks.spawn(reader.feed(self.plan.clone(), decode.clone(), out.clone()));
        }
        Ok(ParallelLoad {
            received,
            tasks,
            exporter: self.exporter,
            relations: Vec::new(),
        })
    }
}

impl SnapshotLoad {
    /// Plans the pieces for `connections`: each table whole, but an
    /// ordinary table without a key of at least [`SPLIT_PAGES`] pages per
    /// connection in one block range per connection. How many pieces there are.
    async fn split(&mut self, connections: usize) -> Result<usize> {
        let parts = u32::try_from(connections).unwrap_or(u32::MAX);
        let planned: Vec<Piece> = self.plan.pending().iter().cloned().collect();
        let mut pieces = Vec::new();
        for piece in planned {
            let pages = match parts {
                0 | 1 => None,
                _ => source::keyless_heap_blocks(&self.reader.client, &piece.table).await?,
            };
            match pages.filter(|&p| p >= SPLIT_PAGES * u64::from(parts)) {
                Some(pages) => {
                    tracing::info!(
                        table = %piece.table,
                        pages,
                        ranges = parts,
                        "initial load reads the table, which has no key, in block ranges on several connections at once"
                    );
                    pieces.extend(Blocks::split(pages, parts).into_iter().map(|blocks| Piece {
                        table: piece.table.clone(),
                        blocks: Some(blocks),
                    }));
                }
                None => pieces.push(piece),
            }
        }
        let count = pieces.len();
        self.plan = Arc::new(Plan::new(pieces));
        Ok(count)
    }
}

/// A load read on several connections at once ([`SnapshotLoad::in_parallel`]);
/// dropping it stops every connection's task.
pub struct ParallelLoad<T> {
    received: mpsc::Receiver<Result<T>>,
    tasks: JoinSet<Result<Vec<Arc<RelationInfo>>>>,
    exporter: Option<ReplicationConnection>,
    relations: Vec<Arc<RelationInfo>>,
}

impl<T> ParallelLoad<T> {
    /// The next decoded run, of any table; `None` once every table was
    /// read and every snapshot transaction ended.
    pub async fn next(&mut self) -> Result<Option<T>> {
        if let Some(item) = self.received.recv().await {
            return item.map(Some);
        }
        while let Some(joined) = self.tasks.join_next().await {
            match joined {
                Ok(relations) => {
                    for relation in relations? {
                        if !self.relations.iter().any(|r| r.name == relation.name) {
                            self.relations.push(relation);
                        }
                    }
                }
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
        if let Some(exporter) = self.exporter.take() {
            exporter.close().await?;
        }
        Ok(None)
    }

    /// Every table's relation, empty ones included, once
    /// [`ParallelLoad::next`] gave `None`.
    pub fn relations(&self) -> &[Arc<RelationInfo>] {
        &self.relations
    }
}
