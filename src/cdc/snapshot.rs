//! The initial load: every published table read inside the snapshot the
//! slot exported, as [`Op::Read`] changes of one snapshot transaction at the
//! slot's consistent point.
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
//! with an [`ErrorKind::Concurrent`] error instead of loading nothing.

use std::pin::Pin;
use std::sync::Arc;

use tokio_postgres::CopyOutStream;

use super::event::{Change, Datum, Event, Op, TxInfo};
use super::relation::{Catalog, RelationInfo};
use crate::error::{Error, ErrorKind, Result};
use crate::pg::conn::ReplicationConnection;
use crate::pg::copy::{CopyTextReader, split_fields};
use crate::pg::lsn::Lsn;
use crate::pg::source::{self, SourceClient, TableName};

struct TableCopy {
    relation: Arc<RelationInfo>,
    stream: Pin<Box<CopyOutStream>>,
    reader: CopyTextReader,
    rows: u64,
    /// `pg_class.reltuples`: the planner's estimate, -1 if never analyzed.
    estimate: i64,
}

/// How far the load of the current table has come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadProgress {
    pub table: TableName,
    pub rows: u64,
    /// The row estimate, when the table was ever analyzed or vacuumed.
    pub estimate: Option<u64>,
}

/// Yields the load as events: Begin, one Read change per row, Commit.
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

    /// The table being copied and how far it got.
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

    pub async fn next_event(&mut self) -> Result<Option<Event>> {
        if !self.began {
            self.began = true;
            return Ok(Some(Event::Begin(self.tx)));
        }
        loop {
            if self.finished {
                return Ok(None);
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
                        return Ok(Some(Event::Commit {
                            tx: self.tx,
                            end_lsn: self.tx.commit_lsn,
                        }));
                    }
                }
                continue;
            };
            if let Some(line) = copy.reader.next_line() {
                let row = decode_row(&copy.relation, &line, self.tx.commit_lsn)?;
                copy.rows += 1;
                let change = Change {
                    op: Op::Read,
                    relation: copy.relation.clone(),
                    tx: self.tx,
                    seq: self.seq,
                    lsn: self.tx.commit_lsn,
                    before: None,
                    after: Some(row),
                    truncate_options: 0,
                };
                self.seq += 1;
                return Ok(Some(Event::Change(change)));
            }
            match source::next_copy_chunk(&mut copy.stream, &copy.relation.name).await? {
                Some(chunk) => copy.reader.push(&chunk),
                None => {
                    if copy.reader.has_partial_line() {
                        return Err(Error::new(
                            ErrorKind::Protocol,
                            "COPY ended in the middle of a row",
                        )
                        .with_context("table", &copy.relation.name));
                    }
                    tracing::info!(table = %copy.relation.name, rows = copy.rows, "initial load of table done");
                    self.current = None;
                }
            }
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
        let stream = Box::pin(source::copy_out(&self.client, &described).await?);
        self.relations.push(relation.clone());
        tracing::info!(table = %table, "initial load of table started");
        Ok(TableCopy {
            relation,
            stream,
            reader: CopyTextReader::new(),
            rows: 0,
            estimate,
        })
    }
}

fn decode_row(relation: &RelationInfo, line: &[u8], lsn: Lsn) -> Result<Vec<Datum>> {
    let fields = split_fields(line, relation.columns.len())
        .map_err(|e| Error::from(e).with_context("table", &relation.name))?;
    relation.decode_copy_row(fields, lsn)
}
