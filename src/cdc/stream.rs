//! The change stream of one slot: replication messages in, events out, and
//! the caller's confirmations back to the server.
//!
//! The caller confirms the `end_lsn` of a transaction's Commit event once
//! that transaction is durable on its side. While nothing is pending (no
//! transaction open or spooled, and everything delivered confirmed), a
//! keepalive's WAL end is confirmed too, so a slot on a quiet database, or
//! one whose changes are all in other databases, does not hold WAL forever.
//!
//! A caller that keeps a copy (the lake) also bounds the confirmations by
//! what it records ([`ChangeStream::record`]): the slot never stands past
//! a position the copy does not know it reached, so a start can tell the
//! slot it confirmed from another that took its name (docs/tables.md,
//! The table set).

use tokio::time::Instant;

use super::assembler::Assembler;
use super::event::Event;
use crate::error::Result;
use crate::model::Lsn;
use crate::pg::replication::{ReplicationMessage, ReplicationStream};

/// What [`ChangeStream::next_before`] found.
#[derive(Debug)]
pub enum Next {
    Event(Event),
    /// The deadline passed while waiting for the server, or the slot
    /// waits for the caller to record a position ([`ChangeStream::unrecorded`]).
    Idle,
    /// The server ended the stream.
    Closed,
}

pub struct ChangeStream {
    replication: ReplicationStream,
    assembler: Assembler,
    /// The end LSN of the last Commit handed out.
    delivered: Lsn,
    /// Everything before it is durable on the caller's side: what it
    /// confirmed, and keepalives' WAL ends while nothing was pending.
    durable: Lsn,
    /// The caller records positions: no confirmation goes past the last
    /// one it recorded.
    recorded: Option<Lsn>,
    /// Never confirm a keepalive's position: the caller reads the slot
    /// without consuming it.
    reading_only: bool,
    /// No confirmation goes past it: the stream is read again from there.
    ceiling: Option<Lsn>,
    /// A keepalive asked for a reply while a position waited unrecorded:
    /// the server waits for it (a walsender shutting down ends only once
    /// the slot stands where it sent).
    asked: bool,
    /// How far the server has read its WAL for this stream: the greatest
    /// position a message or keepalive carried.
    server_read: Lsn,
    /// Where the source's WAL ended when the stream began
    /// (IDENTIFY_SYSTEM's `xlogpos`).
    source_end: Lsn,
}

impl ChangeStream {
    pub(crate) fn new(
        replication: ReplicationStream,
        assembler: Assembler,
        start: Lsn,
        source_end: Lsn,
    ) -> ChangeStream {
        crate::metrics::metrics().source_wal_end(source_end.0);
        ChangeStream {
            replication,
            assembler,
            delivered: start,
            durable: start,
            recorded: None,
            reading_only: false,
            ceiling: None,
            asked: false,
            server_read: start,
            source_end,
        }
    }

    /// Whether the server has read past where the source's WAL ended when
    /// the stream began: every transaction committed before the run
    /// started has been delivered.
    pub(crate) fn caught_up(&self) -> bool {
        self.server_read >= self.source_end
    }

    fn read_to(&mut self, lsn: Lsn) {
        self.server_read = self.server_read.max(lsn);
        crate::metrics::metrics().stream_read(self.server_read.0);
    }

    /// The next event, or `Idle` if the server sends none before `deadline`.
    /// The deadline only interrupts waiting on the wire, never decoding.
    pub async fn next_before(&mut self, deadline: Option<Instant>) -> Result<Next> {
        loop {
            if let Some(event) = self.assembler.next_event().await? {
                if let Event::Commit { end_lsn, .. } = &event {
                    self.delivered = self.delivered.max(*end_lsn);
                }
                return Ok(Next::Event(event));
            }
            let received = match deadline {
                None => self.replication.recv().await?,
                Some(d) => match tokio::time::timeout_at(d, self.replication.recv()).await {
                    Ok(r) => r?,
                    Err(_) => return Ok(Next::Idle),
                },
            };
            match received {
                None => return Ok(Next::Closed),
                Some(ReplicationMessage::XLogData {
                    wal_start, data, ..
                }) => {
                    self.read_to(wal_start);
                    self.assembler.push(wal_start, data).await?;
                }
                Some(ReplicationMessage::PrimaryKeepalive {
                    wal_end,
                    reply_requested,
                    ..
                }) => {
                    self.read_to(wal_end);
                    if !self.reading_only
                        && self.ceiling.is_none()
                        && self.assembler.is_idle()
                        && self.durable >= self.delivered
                    {
                        let waiting = self.unrecorded().is_some();
                        self.delivered = self.delivered.max(wal_end);
                        self.confirm(wal_end).await?;
                        // The caller has a position to record: it is told
                        // now, not when its deadline comes.
                        if self.unrecorded().is_some() && (reply_requested || !waiting) {
                            self.asked |= reply_requested;
                            return Ok(Next::Idle);
                        }
                    }
                }
            }
        }
    }

    /// Reads the slot without consuming it: keepalives are not confirmed
    /// either (the caller confirms nothing).
    pub(crate) fn never_confirm(&mut self) {
        self.reading_only = true;
    }

    /// Confirms nothing past where the slot stands now, for the rest of
    /// the stream: what comes after is to be read again.
    pub(crate) fn hold(&mut self) {
        self.ceiling = Some(self.replication.confirmed());
    }

    /// Everything up to `lsn` is durable: report it to the server now (up
    /// to where [`Self::hold`] holds the slot, and to what the caller
    /// recorded).
    pub async fn confirm(&mut self, lsn: Lsn) -> Result<()> {
        self.durable = self.durable.max(lsn);
        let mut lsn = self.durable;
        if let Some(ceiling) = self.ceiling {
            lsn = lsn.min(ceiling);
        }
        if let Some(recorded) = self.recorded {
            lsn = lsn.min(recorded);
        }
        self.replication.confirm(lsn).await
    }

    /// From now on the caller records the positions it holds: the slot is
    /// confirmed up to `lsn`, which it recorded, and past it only as far
    /// as later calls say.
    pub(crate) async fn record(&mut self, lsn: Lsn) -> Result<()> {
        self.recorded = Some(self.recorded.map_or(lsn, |r| r.max(lsn)));
        self.asked &= self.unrecorded().is_some();
        self.confirm(lsn).await
    }

    /// Whether the server asked for a reply while [`Self::unrecorded`]
    /// waits: it waits for the caller to record it (a fast shutdown
    /// does), so that is due now.
    pub(crate) fn reply_asked(&self) -> bool {
        self.asked && self.unrecorded().is_some()
    }

    /// The durable position the slot waits at because the caller has not
    /// recorded it (a batch with nothing for its tables, or a keepalive
    /// while nothing was pending); none when nothing waits for that.
    pub(crate) fn unrecorded(&self) -> Option<Lsn> {
        let recorded = self.recorded?;
        let durable = self
            .ceiling
            .map_or(self.durable, |ceiling| self.durable.min(ceiling));
        (durable > recorded).then_some(durable)
    }

    /// How often status updates go out when nothing else prompts one.
    pub fn set_status_interval(&mut self, interval: std::time::Duration) {
        self.replication.set_status_interval(interval);
    }

    /// Whether a streamed transaction is open: the server is sending its
    /// changes in chunks, which become events only at its Stream Commit.
    /// A consumer waiting for the stream to go quiet must wait for it too.
    pub(crate) fn in_streamed_transaction(&self) -> bool {
        self.assembler.in_streamed_transaction()
    }

    pub fn confirmed(&self) -> Lsn {
        self.replication.confirmed()
    }

    /// Ends the stream cleanly after a final status update.
    pub async fn stop(self) -> Result<()> {
        self.replication.stop().await
    }
}
