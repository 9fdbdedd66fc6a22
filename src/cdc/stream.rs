//! The change stream of one slot: replication messages in, events out, and
//! the caller's confirmations back to the server.
//!
//! The caller confirms the `end_lsn` of a transaction's Commit event once
//! that transaction is durable on its side. While nothing is pending (no
//! transaction open or spooled, and everything delivered confirmed), a
//! keepalive's WAL end is confirmed too, so a slot on a quiet database, or
//! one whose changes are all in other databases, does not hold WAL forever.

use tokio::time::Instant;

use super::assembler::Assembler;
use super::event::Event;
use crate::error::Result;
use crate::pg::lsn::Lsn;
use crate::pg::replication::{ReplicationMessage, ReplicationStream};

/// What [`ChangeStream::next_before`] found.
#[derive(Debug)]
pub enum Next {
    Event(Event),
    /// The deadline passed while waiting for the server.
    Idle,
    /// The server ended the stream.
    Closed,
}

pub struct ChangeStream {
    replication: ReplicationStream,
    assembler: Assembler,
    /// The end LSN of the last Commit handed out.
    delivered: Lsn,
    /// Never confirm a keepalive's position: the caller reads the slot
    /// without consuming it.
    reading_only: bool,
    /// No confirmation goes past it: the stream is read again from there.
    ceiling: Option<Lsn>,
}

impl ChangeStream {
    pub(crate) fn new(
        replication: ReplicationStream,
        assembler: Assembler,
        start: Lsn,
    ) -> ChangeStream {
        ChangeStream {
            replication,
            assembler,
            delivered: start,
            reading_only: false,
            ceiling: None,
        }
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
                    self.assembler.push(wal_start, data).await?;
                }
                Some(ReplicationMessage::PrimaryKeepalive { wal_end, .. }) => {
                    if !self.reading_only
                        && self.ceiling.is_none()
                        && self.assembler.is_idle()
                        && self.replication.confirmed() >= self.delivered
                    {
                        self.replication.confirm(wal_end).await?;
                        self.delivered = self.delivered.max(wal_end);
                    }
                }
            }
        }
    }

    /// Reads the slot without consuming it: keepalives are not confirmed
    /// either (the caller confirms nothing).
    pub fn never_confirm(&mut self) {
        self.reading_only = true;
    }

    /// Confirms nothing past where the slot stands now, for the rest of
    /// the stream: what comes after is to be read again.
    pub fn hold(&mut self) {
        self.ceiling = Some(self.replication.confirmed());
    }

    /// Everything up to `lsn` is durable: report it to the server now (up
    /// to where [`Self::hold`] holds the slot).
    pub async fn confirm(&mut self, lsn: Lsn) -> Result<()> {
        let lsn = self.ceiling.map_or(lsn, |ceiling| lsn.min(ceiling));
        self.replication.confirm(lsn).await
    }

    /// How often status updates go out when nothing else prompts one.
    pub fn set_status_interval(&mut self, interval: std::time::Duration) {
        self.replication.set_status_interval(interval);
    }

    /// Whether a streamed transaction is open: the server is sending its
    /// changes in chunks, which become events only at its Stream Commit.
    /// A consumer waiting for the stream to go quiet must wait for it too.
    pub fn in_streamed_transaction(&self) -> bool {
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
