//! Turns pgoutput messages into ordered change events.
//!
//! Ordinary transactions arrive whole, after their commit, and pass through
//! one message at a time. Streamed transactions (protocol 2, `streaming
//! on`) arrive in chunks between Stream Start and Stream Stop, interleaved
//! with other transactions, before anyone knows whether they commit. Their
//! messages are spooled to an anonymous temporary file, so memory stays
//! flat, and replayed in order at Stream Commit; Stream Abort discards the
//! spool, or only the aborted subtransaction's messages.
//!
//! Relation messages inside a stream belong to that transaction's view of
//! the table: they are spooled too and applied during the replay, which is
//! also what the server assumes once the stream commits.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncReadExt;

use self::spool::{Replay, Spool};
use super::event::{BeforeImage, Change, Datum, Event, ImageKind, Op, TxInfo};
use super::partition_rows::{self, PartitionRow};
use super::relation::{self, Catalog, Describe, RelationCache, RelationInfo, TupleRole};
use super::temporal::pg_micros_to_unix;
use crate::error::{Error, ErrorKind, Result};
use crate::model::Lsn;
use crate::model::TableName;
use crate::pg::pgoutput::{Decoder, Message, OldTupleKind};

/// The transaction whose messages are passing through now.
struct OpenTx {
    tx: TxInfo,
    seq: u64,
}

/// A row an update moves to another partition, which the server sends as
/// a delete and then an insert, as it would a delete and an insert the
/// user made: the trigger's [`partition_rows::MOVING`] message tells them
/// apart.
enum Moving {
    /// The trigger named the row; its delete comes next.
    Marked(PartitionRow),
    /// Its delete, held until the next change says whether its insert
    /// follows.
    Deleted(Change),
}

pub(crate) struct Assembler<D = Catalog> {
    /// Changes of other tables (a publication can hold more) are dropped.
    tables: HashSet<TableName>,
    /// The captured tables by OID, as first named: a table renamed at the
    /// source (`ALTER TABLE ... RENAME`), which the publication follows by
    /// OID, keeps its captured name.
    captured: HashMap<u32, TableName>,
    decoder: Decoder,
    catalog: D,
    relations: RelationCache,
    /// Captured tables the stream has not described, as the catalog
    /// describes them: for rows of partitions ([`partition_rows`]).
    described: HashMap<TableName, Arc<RelationInfo>>,
    open: Option<OpenTx>,
    moving: Option<Moving>,
    /// The top-level xid of the open Stream Start/Stop block.
    streaming: Option<u32>,
    spools: HashMap<u32, Spool>,
    replay: Option<Replay>,
    ready: VecDeque<Event>,
    rewritten: Option<ddl::Rewritten>,
}

impl<D: Describe> Assembler<D> {
    /// Knows the captured tables' OIDs from the start, so that one renamed
    /// before the stream first describes it is still captured.
    pub(crate) fn with_oids(
        mut self,
        oids: impl IntoIterator<Item = (u32, TableName)>,
    ) -> Assembler<D> {
        self.captured.extend(oids);
        self
    }

    pub(crate) fn new(catalog: D, tables: &[TableName]) -> Assembler<D> {
        Assembler {
            tables: tables.iter().cloned().collect(),
            captured: HashMap::new(),
            decoder: Decoder::new(),
            catalog,
            relations: RelationCache::default(),
            described: HashMap::new(),
            open: None,
            moving: None,
            streaming: None,
            spools: HashMap::new(),
            replay: None,
            ready: VecDeque::new(),
            rewritten: None,
        }
    }

    /// True between transactions, with nothing spooled or pending: a
    /// keepalive's position may then be confirmed.
    pub(crate) fn is_idle(&self) -> bool {
        self.open.is_none()
            && self.moving.is_none()
            && !self.in_streamed_transaction()
            && self.replay.is_none()
            && self.ready.is_empty()
    }

    /// True from the first Stream Start of a transaction to its Stream
    /// Commit or Abort: its changes are arriving, only not as events yet.
    pub(crate) fn in_streamed_transaction(&self) -> bool {
        !self.spools.is_empty()
    }

    /// Takes one XLogData payload.
    pub(crate) async fn push(&mut self, wal_start: Lsn, payload: Bytes) -> Result<()> {
        let message = self
            .decoder
            .decode(payload.clone())
            .map_err(|e| Error::from(e).with_context("lsn", wal_start))?;
        match message {
            Message::Begin(b) => {
                if self.open.is_some() {
                    return Err(out_of_order("Begin inside an open transaction", wal_start));
                }
                let tx = TxInfo {
                    xid: b.xid,
                    commit_lsn: b.final_lsn,
                    commit_ts: pg_micros_to_unix(b.commit_ts),
                };
                self.open = Some(OpenTx { tx, seq: 0 });
                self.ready.push_back(Event::Begin(tx));
            }
            Message::Commit(c) => {
                let open = self
                    .open
                    .take()
                    .ok_or_else(|| out_of_order("Commit without Begin", wal_start))?;
                self.settle_moving();
                self.ready.push_back(Event::Commit {
                    tx: open.tx,
                    end_lsn: c.end_lsn,
                });
            }
            Message::StreamStart(s) => {
                self.streaming = Some(s.xid);
                if let std::collections::hash_map::Entry::Vacant(slot) = self.spools.entry(s.xid) {
                    slot.insert(Spool::create()?);
                }
            }
            Message::StreamStop => self.streaming = None,
            // The server ends a streamed transaction outside its chunks
            // (pgoutput.c asserts it): one inside a block would leave the
            // block's later changes without a spool.
            Message::StreamAbort(_) | Message::StreamCommit { .. } if self.streaming.is_some() => {
                let what = if matches!(message, Message::StreamAbort(_)) {
                    "a Stream Abort inside a stream block"
                } else {
                    "a Stream Commit inside a stream block"
                };
                return Err(out_of_order(what, wal_start));
            }
            Message::StreamAbort(a) => {
                if a.xid == a.subxid {
                    self.spools.remove(&a.xid);
                } else if let Some(spool) = self.spools.get_mut(&a.xid) {
                    spool.aborted.insert(a.subxid);
                }
            }
            Message::StreamCommit { xid, commit } => {
                let spool = self.spools.remove(&xid).ok_or_else(|| {
                    out_of_order("Stream Commit of a transaction never streamed", wal_start)
                })?;
                let tx = TxInfo {
                    xid,
                    commit_lsn: commit.commit_lsn,
                    commit_ts: pg_micros_to_unix(commit.commit_ts),
                };
                self.ready.push_back(Event::Begin(tx));
                self.replay = Some(spool.into_replay(tx, commit.end_lsn).await?);
            }
            Message::Relation(Some(subxid), _)
            | Message::Type(Some(subxid), _)
            | Message::Insert(Some(subxid), _)
            | Message::Update(Some(subxid), _)
            | Message::Delete(Some(subxid), _)
            | Message::Truncate(Some(subxid), _)
            | Message::Message(Some(subxid), _) => {
                let top = self.streaming.ok_or_else(|| {
                    out_of_order("a streamed change outside a stream block", wal_start)
                })?;
                let spool = self.spools.get_mut(&top).ok_or_else(|| {
                    out_of_order(
                        "a streamed change of a transaction already ended",
                        wal_start,
                    )
                })?;
                spool.append(wal_start, subxid, &payload).await?;
            }
            Message::Origin { .. } | Message::Type(None, _) => {}
            other => {
                let mut open = self.open.take();
                let result = self
                    .apply(other, open.as_mut().map(|o| (o.tx, &mut o.seq)), wal_start)
                    .await;
                self.open = open;
                result?;
            }
        }
        Ok(())
    }

    /// The next event, if one is ready; `None` means: push more.
    pub(crate) async fn next_event(&mut self) -> Result<Option<Event>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(Some(event));
            }
            let Some(mut replay) = self.replay.take() else {
                return Ok(None);
            };
            if replay.remaining == 0 {
                self.settle_moving();
                self.ready.push_back(Event::Commit {
                    tx: replay.tx,
                    end_lsn: replay.end_lsn,
                });
                continue;
            }
            replay.remaining -= 1;
            let lsn = Lsn(replay.reader.read_u64().await?);
            let subxid = replay.reader.read_u32().await?;
            let len = replay.reader.read_u32().await? as usize;
            let mut payload = vec![0u8; len];
            replay.reader.read_exact(&mut payload).await?;
            if !replay.aborted.contains(&subxid) {
                let message = replay
                    .decoder
                    .decode(Bytes::from(payload))
                    .map_err(|e| Error::from(e).with_context("lsn", lsn))?;
                let tx = replay.tx;
                let result = self.apply(message, Some((tx, &mut replay.seq)), lsn).await;
                if result.is_err() {
                    return result.map(|()| None);
                }
            }
            self.replay = Some(replay);
        }
    }

    /// Applies a relation or change message of the transaction `tx`.
    async fn apply(
        &mut self,
        message: Message,
        tx: Option<(TxInfo, &mut u64)>,
        lsn: Lsn,
    ) -> Result<()> {
        if let Message::Relation(_, rel) = message {
            let mut relation = self.catalog.describe(rel).await?;
            match self.captured.get(&relation.oid) {
                Some(name) if *name != relation.name => {
                    // A Relation message has no WAL position of its own:
                    // its transaction's commit says where it is.
                    let commit_lsn = tx.as_ref().map_or(lsn, |(tx, _)| tx.commit_lsn);
                    tracing::warn!(
                        table = %name, stream_name = %relation.name, %commit_lsn,
                        "the stream names the table otherwise than this run does (it was \
                         renamed): its changes go on to the same Iceberg tables, and later \
                         starts follow it by its OID (docs/tables.md, Schema changes)"
                    );
                    relation.name = name.clone();
                }
                Some(_) => {}
                // Another table under a captured name: the one captured was
                // dropped (or renamed away) and this one created since. Its
                // rows are not the captured table's.
                None if self.captured.values().any(|n| *n == relation.name) => {
                    return Err(Error::new(
                        ErrorKind::Preflight,
                        "the source table was dropped and created again while the run streamed: \
                         its Iceberg tables hold the old table's rows; drop them (`wal2iceberg \
                         drop-table --table <table>`) and run again to load the new one",
                    )
                    .with_context("table", &relation.name)
                    .with_context("relation_oid", relation.oid)
                    .with_context("lsn", lsn));
                }
                None if self.tables.contains(&relation.name) => {
                    self.captured.insert(relation.oid, relation.name.clone());
                }
                None => {}
            }
            self.described.remove(&relation.name);
            self.relations.insert(relation);
            return Ok(());
        }
        if let Message::Type(..) = message {
            return Ok(());
        }
        if let Message::Message(_, m) = message {
            match m.prefix.as_str() {
                partition_rows::FENCE => return Ok(()),
                // Only a hint: a move it cannot name stays a delete and an insert.
                partition_rows::MOVING if m.transactional && tx.is_some() => {
                    match PartitionRow::parse(&m.prefix, &m.content, lsn) {
                        Ok(row) if self.tables.contains(&row.table()) => {
                            self.settle_moving();
                            self.moving = Some(Moving::Marked(row));
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(%lsn, error = %e, "a moving-row message is not ours: ignored")
                        }
                    }
                    return Ok(());
                }
                relation::COLUMNS if m.transactional => {
                    match relation::parse_columns(&m.content) {
                        Ok((table, oid, columns)) => {
                            self.catalog.note_columns(table.clone(), columns.clone());
                            if let Some((tx, _)) = tx {
                                self.described(&table, oid, &columns, tx, m.lsn).await?;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(%lsn, error = %e, "a column-numbers message is not ours: ignored")
                        }
                    }
                    return Ok(());
                }
                relation::REWRITE if m.transactional => {
                    match (relation::parse_rewrite(&m.content), tx) {
                        (Ok(tables), Some((tx, _))) => self.rewrote(tables, tx, m.lsn),
                        (Ok(_), None) => {}
                        (Err(e), _) => {
                            tracing::warn!(%lsn, error = %e, "a rewrite message is not ours: ignored")
                        }
                    }
                    return Ok(());
                }
                partition_rows::FAILED => partition_rows::log_failure(&m.content, lsn),
                _ => {}
            }
            if m.transactional
                && let Some(op) = partition_rows::op_of(&m.prefix)
                && let Some((tx, seq)) = tx
            {
                let row = PartitionRow::parse(&m.prefix, &m.content, lsn)?;
                return self.partition_row(op, row, tx, seq, lsn).await;
            }
            self.settle_moving();
            self.ready.push_back(Event::Message {
                tx: if m.transactional {
                    tx.map(|(t, _)| t)
                } else {
                    None
                },
                lsn: m.lsn,
                prefix: m.prefix,
                content: m.content.to_vec(),
            });
            return Ok(());
        }
        let (tx, seq) = tx.ok_or_else(|| out_of_order("a change outside a transaction", lsn))?;
        let mut next = Numbering { tx, seq, lsn };
        // Rows of tables not captured are not decoded: a value of theirs
        // must not stop the captured ones.
        let captured = |oid| -> Result<Option<Arc<RelationInfo>>> {
            let relation = self.relations.get(oid, lsn)?;
            Ok(self.tables.contains(&relation.name).then_some(relation))
        };
        let xid = tx.xid;
        let with_xid = |e: Error| e.with_context("xid", xid);
        match message {
            Message::Insert(_, m) => {
                let Some(relation) = captured(m.relation_oid)? else {
                    return Ok(());
                };
                let after = relation
                    .decode_tuple(m.new, TupleRole::Complete, lsn)
                    .map_err(with_xid)?;
                let change = next.change(relation, Op::Insert, None, Some(after), 0);
                self.route(&mut next, change);
            }
            Message::Update(_, m) => {
                let Some(relation) = captured(m.relation_oid)? else {
                    return Ok(());
                };
                let before = match m.old {
                    Some((kind, old)) => {
                        Some(before_image(&relation, kind, old, lsn).map_err(with_xid)?)
                    }
                    None => None,
                };
                let after = relation
                    .decode_tuple(m.new, TupleRole::Complete, lsn)
                    .map_err(with_xid)?;
                let change = next.change(relation, Op::Update, before, Some(after), 0);
                self.route(&mut next, change);
            }
            Message::Delete(_, m) => {
                let Some(relation) = captured(m.relation_oid)? else {
                    return Ok(());
                };
                let before = before_image(&relation, m.old_kind, m.old, lsn).map_err(with_xid)?;
                let change = next.change(relation, Op::Delete, Some(before), None, 0);
                self.route(&mut next, change);
            }
            Message::Truncate(_, m) => {
                for oid in m.relation_oids {
                    let relation = self.relations.get(oid, lsn)?;
                    if self.tables.contains(&relation.name) {
                        let change = next.change(relation, Op::Truncate, None, None, m.options);
                        self.route(&mut next, change);
                    }
                }
            }
            _ => {
                return Err(out_of_order(
                    "a transaction-control message inside a replayed stream",
                    lsn,
                ));
            }
        }
        Ok(())
    }
}

impl<D: Describe> Assembler<D> {
    /// A row an attached partition held, as a read of the captured table
    /// it was attached to, or one a partition's TRUNCATE removed, as a
    /// delete; rows of other tables are dropped.
    async fn partition_row(
        &mut self,
        op: Op,
        row: PartitionRow,
        tx: TxInfo,
        seq: &mut u64,
        lsn: Lsn,
    ) -> Result<()> {
        let table = row.table();
        if !self.tables.contains(&table) {
            return Ok(());
        }
        let relation = match self
            .relations
            .named(&table)
            .or_else(|| self.described.get(&table).cloned())
        {
            Some(relation) => relation,
            None => {
                let described = self.catalog.describe_table(&table).await?.ok_or_else(|| {
                    Error::new(
                        ErrorKind::Protocol,
                        "rows of a partition name a table that cannot be described",
                    )
                    .with_context("table", &table)
                    .with_context("lsn", lsn)
                })?;
                let described = Arc::new(described);
                self.described.insert(table, described.clone());
                described
            }
        };
        let with_xid = |e: Error| e.with_context("xid", tx.xid);
        let (before, after) = match op {
            Op::Delete => (
                Some(row.decode_key(&relation, lsn).map_err(with_xid)?),
                None,
            ),
            _ => (None, Some(row.decode(&relation, lsn).map_err(with_xid)?)),
        };
        let mut next = Numbering { tx, seq, lsn };
        self.settle_moving();
        self.ready
            .push_back(Event::Change(next.change(relation, op, before, after, 0)));
        Ok(())
    }

    /// Queues a change of a captured table. A moving row's delete waits
    /// for the next change: the insert that ends the move makes them one
    /// update, under the delete's number and before image; anything else
    /// lets the delete go first, as it is.
    fn route(&mut self, next: &mut Numbering, change: Change) {
        match self.moving.take() {
            Some(Moving::Marked(row)) if row.table() == change.relation.name => {
                if change.op == Op::Delete
                    && let Some(before) = &change.before
                    && row.same_row(&change.relation, before, change.lsn)
                {
                    self.moving = Some(Moving::Deleted(change));
                    return;
                }
            }
            Some(Moving::Deleted(deleted)) => {
                // By value: the server describes the table again before
                // the first change of each partition a session meets.
                if change.op == Op::Insert && deleted.relation == change.relation {
                    next.take_back();
                    self.ready.push_back(Event::Change(Change {
                        op: Op::Update,
                        after: change.after,
                        ..deleted
                    }));
                    return;
                }
                self.ready.push_back(Event::Change(deleted));
            }
            other => self.moving = other,
        }
        self.ready.push_back(Event::Change(change));
    }

    /// Ends a move in waiting: its delete, if held, goes out as it is.
    fn settle_moving(&mut self) {
        if let Some(Moving::Deleted(deleted)) = self.moving.take() {
            self.ready.push_back(Event::Change(deleted));
        }
    }
}

/// The place of a transaction's next change: the transaction, the number
/// it gets, and its message's position.
struct Numbering<'a> {
    tx: TxInfo,
    seq: &'a mut u64,
    lsn: Lsn,
}

impl Numbering<'_> {
    /// The number just taken goes unused: its change became part of the
    /// one before.
    fn take_back(&mut self) {
        *self.seq -= 1;
    }

    fn change(
        &mut self,
        relation: Arc<RelationInfo>,
        op: Op,
        before: Option<BeforeImage>,
        after: Option<Vec<Datum>>,
        truncate_options: u8,
    ) -> Change {
        let seq = *self.seq;
        *self.seq += 1;
        Change {
            op,
            relation,
            tx: self.tx,
            seq,
            lsn: self.lsn,
            before,
            after,
            truncate_options,
        }
    }
}

fn before_image(
    relation: &RelationInfo,
    kind: OldTupleKind,
    old: Vec<crate::pg::pgoutput::TupleValue>,
    lsn: Lsn,
) -> Result<BeforeImage> {
    let (kind, role) = match kind {
        OldTupleKind::Key => (ImageKind::Key, TupleRole::KeyOnly),
        OldTupleKind::Full => (ImageKind::Full, TupleRole::Complete),
    };
    Ok(BeforeImage {
        kind,
        row: relation.decode_tuple(old, role, lsn)?,
    })
}

fn out_of_order(what: &str, lsn: Lsn) -> Error {
    Error::new(ErrorKind::Protocol, format!("the server sent {what}")).with_context("lsn", lsn)
}

mod ddl;
#[cfg(any(test, feature = "fuzzing"))]
pub mod script;
mod spool;
#[cfg(test)]
mod tests;
