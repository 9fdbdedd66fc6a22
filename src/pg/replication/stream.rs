//! The CopyBoth stream of one slot, on a task of its own.
//!
//! The task owns the replication connection. It reads the server's
//! messages into a bounded channel, and it sends status updates on its
//! timer, at once when a keepalive asks for a reply, and whenever the
//! consumer confirms. Whatever the consumer does between two reads (a
//! commit to a slow object store, a compaction) never holds a status update
//! back, so `wal_sender_timeout` never ends the connection because of it.
//!
//! Messages travel in batches: every complete message one socket read
//! brought, up to [`BATCH_MESSAGES`], goes over in one send, so the
//! consumer's thread is woken once a read rather than once a message (a
//! wakeup per message was a quarter of the apply's CPU).
//!
//! Backpressure comes from the channel: once it holds its byte budget
//! ([`BUDGET_BYTES`]) the task stops reading the socket. The server's send
//! buffer then fills and the walsender waits, still reading our replies.
//!
//! Feedback rule: the `flush_lsn` we report is exactly the highest position
//! the consumer passed to [`ReplicationStream::confirm`], never more, and
//! never less than a value reported before. The server keeps every
//! transaction whose commit ends after it and sends it again after a
//! reconnect.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use postgres_protocol::message::backend::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use super::{InCopyBoth, ReplicationMessage, in_copy_both, pg_now_micros, slot_error};
use super::{standby_status_update, status_interval_for};
use crate::error::{Error, ErrorKind, Result};
use crate::model::Lsn;
use crate::pg::conn::{Frame, ReplicationConnection};

/// Bytes of messages read ahead of the consumer at most. A message larger
/// than this waits until the channel is empty and then takes all of it.
pub(crate) const BUDGET_BYTES: usize = 64 << 20;

/// Messages in one batch at most.
const BATCH_MESSAGES: usize = 256;

/// Bytes in one batch at most, but for its last message.
const BATCH_BYTES: usize = 1 << 20;

/// Batches read ahead of the consumer at most: with full batches, 4,096
/// messages however small.
const BUDGET_BATCHES: usize = 16;

/// The consumer's end of a slot's stream: messages in order, confirmations
/// back. Dropping it closes the connection without a last status update.
pub struct ReplicationStream {
    batches: mpsc::Receiver<Delivered>,
    /// The rest of the batch taken last.
    ready: VecDeque<ReplicationMessage>,
    control: mpsc::UnboundedSender<Control>,
    /// The highest position confirmed so far.
    confirmed: Lsn,
    /// The task, until its end was taken up; it ends when the server ends
    /// the stream, on an error, or when asked to stop.
    task: Option<JoinHandle<Result<()>>>,
}

/// Messages in order and their share of the read-ahead budget, given back
/// once the consumer takes the batch.
struct Delivered {
    messages: Vec<ReplicationMessage>,
    _budget: OwnedSemaphorePermit,
}

enum Control {
    Confirm(Lsn),
    StatusInterval(Duration),
    /// A last status update, CopyDone, the server's closing messages.
    Stop,
}

impl ReplicationStream {
    /// Spawns the task that owns `conn`, which has just entered CopyBoth
    /// at `start`. `wal_sender_timeout` sets the status updates' cadence.
    pub(super) fn spawn(
        conn: ReplicationConnection,
        slot: String,
        start: Lsn,
        wal_sender_timeout: Option<Duration>,
    ) -> ReplicationStream {
        let (deliver, batches) = mpsc::channel(BUDGET_BATCHES);
        let (control, orders) = mpsc::unbounded_channel();
        let feeder = Feeder {
            conn,
            slot,
            received: start,
            confirmed: start,
            status_interval: status_interval_for(wal_sender_timeout),
            next_status: Instant::now(),
            budget: Arc::new(Semaphore::new(BUDGET_BYTES)),
            deliver,
            orders,
        };
        ReplicationStream {
            batches,
            ready: VecDeque::new(),
            control,
            confirmed: start,
            task: Some(tokio::spawn(feeder.run())),
        }
    }

    /// The highest position confirmed so far.
    pub(crate) fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// How often status updates go out when nothing else prompts one.
    pub(crate) fn set_status_interval(&mut self, interval: Duration) {
        // A task that has ended sends nothing more anyway.
        let _ = self.control.send(Control::StatusInterval(interval));
    }

    /// The next XLogData or keepalive; `None` once the server has ended
    /// the stream, or the task's error. Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Result<Option<ReplicationMessage>> {
        loop {
            if let Some(message) = self.ready.pop_front() {
                return Ok(Some(message));
            }
            match self.batches.recv().await {
                Some(delivered) => self.ready = delivered.messages.into(),
                None => return self.ended().await.map(|()| None),
            }
        }
    }

    /// Records that everything up to `lsn` is durable; the task tells the
    /// server at once. A position lower than one confirmed before is
    /// ignored, so the reported position never moves backwards.
    pub(crate) async fn confirm(&mut self, lsn: Lsn) -> Result<()> {
        if lsn <= self.confirmed {
            return Ok(());
        }
        self.confirmed = lsn;
        if self.control.send(Control::Confirm(lsn)).is_err() {
            self.ended().await?;
            return Err(Error::new(
                ErrorKind::Connection,
                "the replication stream ended before a confirmation went out",
            )
            .with_context("lsn", lsn));
        }
        Ok(())
    }

    /// Ends the stream: a last status update, CopyDone, and the server's
    /// closing messages, then the connection is closed.
    pub(crate) async fn stop(mut self) -> Result<()> {
        let _ = self.control.send(Control::Stop);
        self.ended().await
    }

    /// How the task ended. Cancel-safe: the handle is kept until it
    /// answered.
    async fn ended(&mut self) -> Result<()> {
        let Some(task) = self.task.as_mut() else {
            return Ok(());
        };
        let ended = task.await;
        self.task = None;
        ended.map_err(|e| {
            Error::new(
                ErrorKind::Connection,
                "the replication stream's task failed",
            )
            .with_source(e)
        })?
    }
}

/// The task's side: the connection and what it owes the server.
struct Feeder {
    conn: ReplicationConnection,
    slot: String,
    received: Lsn,
    confirmed: Lsn,
    status_interval: Duration,
    next_status: Instant,
    budget: Arc<Semaphore>,
    deliver: mpsc::Sender<Delivered>,
    orders: mpsc::UnboundedReceiver<Control>,
}

/// What woke the task.
enum Woke {
    Order(Option<Control>),
    StatusDue,
    Frame(Result<Frame>),
    /// Room in the channel for the message read, or `None`: the consumer
    /// is gone.
    Room(Option<(OwnedSemaphorePermit, mpsc::OwnedPermit<Delivered>)>),
}

/// What ends the task once the messages read before it are handed over.
enum Ending {
    /// The server sent CopyDone: answer it.
    CopyDone,
    /// The server finished the command.
    Ended,
    Failed(Error),
}

impl Feeder {
    async fn run(mut self) -> Result<()> {
        // The batch read and not yet handed over, with its cost.
        let mut waiting: Option<(Vec<ReplicationMessage>, u32)> = None;
        let mut ending: Option<Ending> = None;
        loop {
            if waiting.is_none()
                && let Some(ending) = ending.take()
            {
                return self.end(ending).await;
            }
            let cost = waiting.as_ref().map(|(_, cost)| *cost);
            let woke = tokio::select! {
                biased;
                order = self.orders.recv() => Woke::Order(order),
                () = sleep_until(self.next_status) => Woke::StatusDue,
                frame = self.conn.read_frame(), if cost.is_none() => Woke::Frame(frame),
                room = room(&self.budget, &self.deliver, cost.unwrap_or(0)), if cost.is_some() => {
                    Woke::Room(room)
                }
            };
            match woke {
                // The consumer dropped its end: close without a word.
                Woke::Order(None) => return Ok(()),
                Woke::Order(Some(Control::Confirm(lsn))) => {
                    if lsn > self.confirmed {
                        self.confirmed = lsn;
                        self.send_status().await?;
                    }
                }
                Woke::Order(Some(Control::StatusInterval(interval))) => {
                    self.status_interval = interval;
                    self.next_status = Instant::now() + interval;
                }
                Woke::Order(Some(Control::Stop)) => return self.stop().await,
                Woke::StatusDue => self.send_status().await?,
                Woke::Frame(frame) => {
                    let (batch, cost, end) = self.batch(frame).await?;
                    if !batch.is_empty() {
                        waiting = Some((batch, cost));
                    }
                    ending = end;
                }
                Woke::Room(None) => return Ok(()),
                Woke::Room(Some((budget, slot))) => {
                    if let Some((messages, _)) = waiting.take() {
                        slot.send(Delivered {
                            messages,
                            _budget: budget,
                        });
                    }
                }
            }
        }
    }

    /// The message in `frame` and those after it that the same socket read
    /// brought, up to a batch's limits, with their cost; and what ended the
    /// stream among them, if something did.
    async fn batch(
        &mut self,
        frame: Result<Frame>,
    ) -> Result<(Vec<ReplicationMessage>, u32, Option<Ending>)> {
        let mut batch = Vec::new();
        let mut cost = 0usize;
        let mut frame = Some(frame);
        while let Some(next) = frame.take() {
            let next = match next {
                Ok(next) => next,
                Err(e) => return Ok((batch, budget_share(cost), Some(Ending::Failed(e)))),
            };
            match in_copy_both(next) {
                Ok(InCopyBoth::CopyData(data)) => {
                    let message = ReplicationMessage::decode(data)?;
                    cost += self.took(&message).await?;
                    batch.push(message);
                }
                Ok(InCopyBoth::Skip) => {}
                Ok(InCopyBoth::CopyDone) => {
                    return Ok((batch, budget_share(cost), Some(Ending::CopyDone)));
                }
                Ok(InCopyBoth::Ended) => {
                    return Ok((batch, budget_share(cost), Some(Ending::Ended)));
                }
                Err(e) => return Ok((batch, budget_share(cost), Some(Ending::Failed(e)))),
            }
            if batch.len() < BATCH_MESSAGES && cost < BATCH_BYTES {
                frame = self.conn.buffered_frame().transpose();
            }
        }
        Ok((batch, budget_share(cost), None))
    }

    async fn end(mut self, ending: Ending) -> Result<()> {
        match ending {
            Ending::CopyDone => {
                self.conn.queue_copy_done();
                self.conn.flush().await
            }
            Ending::Ended => Ok(()),
            Ending::Failed(e) => Err(slot_error(e, &self.slot)),
        }
    }

    /// Notes what a message tells of the server's position, answers a
    /// keepalive that asks for it, and returns the message's share of the
    /// budget.
    async fn took(&mut self, message: &ReplicationMessage) -> Result<usize> {
        match message {
            ReplicationMessage::XLogData {
                wal_start, data, ..
            } => {
                self.received = self.received.max(*wal_start);
                crate::metrics::metrics()
                    .received_bytes
                    .inc_by(data.len() as u64);
                Ok(data.len().max(1))
            }
            ReplicationMessage::PrimaryKeepalive {
                wal_end,
                reply_requested,
                ..
            } => {
                self.received = self.received.max(*wal_end);
                if *reply_requested {
                    self.send_status().await?;
                }
                Ok(1)
            }
        }
    }

    async fn send_status(&mut self) -> Result<()> {
        let write = self.received.max(self.confirmed);
        let update = standby_status_update(write, self.confirmed, self.confirmed, pg_now_micros());
        self.conn.queue_copy_data(&update);
        self.conn.flush().await?;
        self.next_status = Instant::now() + self.status_interval;
        tracing::trace!(slot = %self.slot, flush_lsn = %self.confirmed, "sent standby status update");
        Ok(())
    }

    async fn stop(mut self) -> Result<()> {
        self.send_status().await?;
        self.conn.queue_copy_done();
        self.conn.flush().await?;
        // Drain until the server finishes the command.
        loop {
            match self.conn.read_frame().await {
                Ok(Frame::Message(Message::ReadyForQuery(_))) => break,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Connection => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        self.conn.close().await
    }
}

/// A batch's share of the read-ahead budget: one larger than all of it
/// waits until the channel is empty and then takes all of it.
fn budget_share(cost: usize) -> u32 {
    u32::try_from(cost.min(BUDGET_BYTES)).unwrap_or(u32::MAX)
}

/// Waits for `cost` bytes of the budget and a place in the channel.
async fn room(
    budget: &Arc<Semaphore>,
    deliver: &mpsc::Sender<Delivered>,
    cost: u32,
) -> Option<(OwnedSemaphorePermit, mpsc::OwnedPermit<Delivered>)> {
    let permit = budget.clone().acquire_many_owned(cost).await.ok()?;
    let slot = deliver.clone().reserve_owned().await.ok()?;
    Some((permit, slot))
}
