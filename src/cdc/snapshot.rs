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
//! TRUNCATE and the table-rewriting forms of ALTER TABLE are not MVCC-safe
//! (<https://www.postgresql.org/docs/current/mvcc-caveats.html>): one that
//! commits after the snapshot was taken leaves the table empty to it. So
//! each table is locked (ACCESS SHARE, as pg_dump does) before its COPY,
//! and a table whose storage changed since the snapshot stops the load
//! with an [`crate::error::ErrorKind::Concurrent`] error instead of
//! loading nothing.

use std::pin::Pin;
use std::sync::Arc;

use tokio_postgres::CopyOutStream;

use super::event::{Change, Datum, Event, Op, TxInfo};
use super::relation::{Catalog, RelationInfo};
use super::value::{Value, Wire};
use crate::error::{Error, Result};
use crate::pg::conn::ReplicationConnection;
use crate::pg::copy::{BinaryCopyReader, CopyRows};
use crate::pg::lsn::Lsn;
use crate::pg::source::{self, SourceClient, TableName};

/// A run of rows ends at this many rows, or about this many bytes.
const RUN_ROWS: usize = 64 * 1024;
const RUN_BYTES: usize = 32 << 20;

struct TableCopy {
    relation: Arc<RelationInfo>,
    /// The COPY ended; the table stays current for [`SnapshotLoad::progress`]
    /// until the next run is asked for.
    done: bool,
    wires: Arc<[Wire]>,
    stream: Pin<Box<CopyOutStream>>,
    reader: BinaryCopyReader,
    rows: u64,
    /// `pg_class.reltuples`: the planner's estimate, -1 if never analyzed.
    estimate: i64,
}

/// Rows of one table in COPY's binary format, each column in the form
/// `wires` names.
pub struct LoadRows {
    pub relation: Arc<RelationInfo>,
    pub wires: Arc<[Wire]>,
    pub rows: CopyRows,
    /// The `seq` of the first row: the load numbers its rows from 0.
    pub first_seq: u64,
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
                    Some(bytes) => wire
                        .decode(&column.pg_type, bytes)
                        .map(Datum::Value)
                        .map_err(|e| self.relation.value_error(column, lsn, e)),
                })
                .collect::<Result<Vec<_>>>()?;
            f(row);
            Ok(())
        })
    }
}

/// How far the load of the current table has come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadProgress {
    pub table: TableName,
    pub rows: u64,
    /// The row estimate, when the table was ever analyzed or vacuumed.
    pub estimate: Option<u64>,
}

/// Reads the load table by table, in runs of rows.
pub struct SnapshotLoad {
    client: SourceClient,
    catalog: Catalog,
    pending: std::vec::IntoIter<TableName>,
    current: Option<TableCopy>,
    /// The tables read so far, empty ones included.
    relations: Vec<Arc<RelationInfo>>,
    /// The replication connection of a temporary slot that exported the
    /// snapshot; closed (dropping the slot) when the load ends.
    exporter: Option<ReplicationConnection>,
    tx: TxInfo,
    seq: u64,
    /// Rows decoded for [`SnapshotLoad::next_event`], not yet returned.
    events: std::collections::VecDeque<Change>,
    began: bool,
    finished: bool,
}

impl SnapshotLoad {
    /// Opens the exported snapshot on `client` (a connection of its own).
    pub async fn begin(
        client: SourceClient,
        catalog: Catalog,
        snapshot_name: &str,
        consistent_point: Lsn,
        tables: Vec<TableName>,
        exporter: Option<ReplicationConnection>,
    ) -> Result<SnapshotLoad> {
        source::begin_snapshot(&client, snapshot_name).await?;
        let commit_ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Ok(SnapshotLoad {
            client,
            catalog,
            pending: tables.into_iter(),
            current: None,
            relations: Vec::new(),
            exporter,
            tx: TxInfo {
                xid: 0,
                commit_lsn: consistent_point,
                commit_ts,
            },
            seq: 0,
            events: std::collections::VecDeque::new(),
            began: false,
            finished: false,
        })
    }

    /// Locks every table still to be read now rather than just before its
    /// COPY, for a caller that keeps the snapshot open a while first.
    pub async fn lock_tables(&self) -> Result<()> {
        source::lock_unchanged_since_snapshot(&self.client, self.pending.as_slice()).await
    }

    /// The consistent point: confirm it once the load is durable.
    pub fn consistent_point(&self) -> Lsn {
        self.tx.commit_lsn
    }

    /// The table being copied (or the one whose last rows were just handed
    /// out) and how far it got.
    pub fn progress(&self) -> Option<LoadProgress> {
        self.current.as_ref().map(|c| LoadProgress {
            table: c.relation.name.clone(),
            rows: c.rows,
            estimate: u64::try_from(c.estimate).ok(),
        })
    }

    /// The relations of the tables loaded so far: all of them, empty ones
    /// included, once the load has ended.
    pub fn relations(&self) -> &[Arc<RelationInfo>] {
        &self.relations
    }

    /// The load's transaction: xid 0, committed at the consistent point.
    pub fn tx(&self) -> TxInfo {
        self.tx
    }

    /// The next run of rows, all of one table; `None` once every table was
    /// read (the snapshot is then closed).
    pub async fn next_rows(&mut self) -> Result<Option<LoadRows>> {
        loop {
            if self.finished {
                return Ok(None);
            }
            if self.current.as_ref().is_some_and(|c| c.done) {
                self.current = None;
            }
            let Some(copy) = self.current.as_mut() else {
                match self.pending.next() {
                    Some(table) => self.current = Some(self.start_copy(&table).await?),
                    None => {
                        self.client.batch_execute("COMMIT").await.map_err(|e| {
                            crate::error::postgres(e, "cannot end the snapshot transaction")
                        })?;
                        self.finished = true;
                        if let Some(exporter) = self.exporter.take() {
                            exporter.close().await?;
                        }
                        return Ok(None);
                    }
                }
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
            copy.rows += rows.len() as u64;
            let relation = copy.relation.clone();
            let wires = copy.wires.clone();
            if ended {
                tracing::info!(table = %relation.name, rows = copy.rows, "initial load of table done");
                copy.done = true;
            }
            if rows.is_empty() {
                continue;
            }
            let first_seq = self.seq;
            self.seq += rows.len() as u64;
            return Ok(Some(LoadRows {
                relation,
                wires,
                rows,
                first_seq,
            }));
        }
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

    async fn start_copy(&mut self, table: &TableName) -> Result<TableCopy> {
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
        let stream = Box::pin(source::copy_out(&self.client, &described, &casts).await?);
        self.relations.push(relation.clone());
        tracing::info!(table = %table, "initial load of table started");
        Ok(TableCopy {
            reader: BinaryCopyReader::new(relation.columns.len()),
            relation,
            done: false,
            wires: wires.into(),
            stream,
            rows: 0,
            estimate,
        })
    }
}
