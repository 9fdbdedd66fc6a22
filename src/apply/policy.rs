//! When to commit the open batch and when to stop.

use std::time::Duration;

use tokio::time::Instant;

use super::RunOptions;
use crate::cdc::event::Event;

/// What the stream loop does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    Wait,
    Flush,
    Exit,
    FlushAndExit,
    /// Stop without committing the open batch.
    Abandon,
}

/// How often a stop request is looked at while the stream is quiet.
pub(super) const SHUTDOWN_POLL: Duration = Duration::from_millis(250);

/// A stream quiet for this many flush intervals, with nothing staged, gets
/// a full compaction (see `Pipeline::compact_idle`).
pub(super) const IDLE_COMPACTION_FLUSHES: u32 = 5;

/// When to commit the open batch and when to stop: a batch is committed
/// at a transaction's end once it reached a limit or its interval, or when
/// the stream goes quiet between transactions; never inside a transaction,
/// however long its changes take to arrive, so a snapshot never holds part
/// of one. The stream is never idle while a streamed transaction is open:
/// its chunks are changes arriving, though they become events only at its
/// Stream Commit.
pub(super) struct FlushPolicy {
    interval: Duration,
    max_rows: usize,
    max_bytes: usize,
    exit_when_idle: Option<Duration>,
    in_tx: bool,
    /// Whether the server is streaming a transaction not yet ended
    /// (`ChangeStream::in_streamed_transaction`).
    in_streamed_tx: bool,
    /// Whether the server has read the source's WAL as far as it reached
    /// when the stream began (`ChangeStream::caught_up`): until then a
    /// quiet stream is the server still reading, not an idle source.
    caught_up: bool,
    /// When the complete transactions waiting in the batch are due.
    flush_at: Option<Instant>,
    pub(super) last_event: Instant,
}

impl FlushPolicy {
    pub(super) fn new(options: &RunOptions, now: Instant) -> FlushPolicy {
        FlushPolicy {
            interval: options.run.flush_interval,
            max_rows: options.run.max_batch_rows,
            max_bytes: options.run.max_batch_bytes,
            exit_when_idle: options.run.exit_when_idle,
            in_tx: false,
            in_streamed_tx: false,
            caught_up: false,
            flush_at: None,
            last_event: now,
        }
    }

    /// How long to wait for the next event before [`Self::on_idle`]: at
    /// most [`SHUTDOWN_POLL`], so a stop request is seen while idle.
    pub(super) fn deadline(&self, now: Instant) -> Instant {
        let poll = now + SHUTDOWN_POLL;
        if self.in_tx {
            return poll;
        }
        let idle_at = self
            .exit_when_idle
            .filter(|_| !self.in_streamed_tx && self.caught_up)
            .map(|d| self.last_event + d);
        [self.flush_at, idle_at, Some(poll)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(poll)
    }

    /// What a stop request means now: commit what is complete, or abandon
    /// a batch a transaction is still arriving into.
    pub(super) fn on_shutdown(&self, complete: bool) -> Step {
        if self.in_tx {
            Step::Abandon
        } else if complete {
            Step::FlushAndExit
        } else {
            Step::Exit
        }
    }

    /// After each wait for the stream: while a streamed transaction is
    /// open, and when it ends, changes were arriving just now.
    pub(super) fn streamed(&mut self, open: bool, now: Instant) {
        if open || self.in_streamed_tx {
            self.last_event = now;
        }
        self.in_streamed_tx = open;
    }

    /// After each wait for the stream: whether the server has caught up
    /// with the WAL the source had when the stream began.
    pub(super) fn read_source(&mut self, caught_up: bool) {
        self.caught_up = caught_up;
    }

    pub(super) fn saw(&mut self, event: &Event, now: Instant) {
        self.last_event = now;
        match event {
            Event::Begin(_) => self.in_tx = true,
            Event::Commit { .. } => self.in_tx = false,
            Event::Change(_)
            | Event::Message { .. }
            | Event::Rewritten { .. }
            | Event::Described { .. } => {}
        }
    }

    /// After an event went into the batch; `complete` says whether the
    /// batch holds a finished transaction.
    pub(super) fn after_event(
        &mut self,
        now: Instant,
        complete: bool,
        rows: usize,
        bytes: usize,
    ) -> Step {
        if self.in_tx || !complete {
            return Step::Wait;
        }
        let due = *self.flush_at.get_or_insert(now + self.interval);
        if rows >= self.max_rows || bytes >= self.max_bytes || now >= due {
            Step::Flush
        } else {
            Step::Wait
        }
    }

    pub(super) fn on_idle(&mut self, now: Instant, complete: bool) -> Step {
        if self.in_tx {
            Step::Wait
        } else if complete {
            Step::Flush
        } else if !self.in_streamed_tx
            && self.caught_up
            && self
                .exit_when_idle
                .is_some_and(|d| now >= self.last_event + d)
        {
            Step::Exit
        } else {
            Step::Wait
        }
    }

    /// Whether the stream stands between transactions.
    pub(super) fn between_transactions(&self) -> bool {
        !self.in_tx
    }

    pub(super) fn flushed(&mut self) {
        self.flush_at = None;
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::cdc::capture::CaptureOptions;
    use crate::cdc::event::TxInfo;
    use crate::model::Lsn;

    fn policy(now: Instant) -> FlushPolicy {
        let mut options = RunOptions::new(CaptureOptions::new(Vec::new()), PathBuf::new());
        options.run.flush_interval = Duration::from_secs(1);
        options.run.max_batch_rows = 100;
        options.run.exit_when_idle = Some(Duration::from_secs(5));
        let mut policy = FlushPolicy::new(&options, now);
        policy.read_source(true);
        policy
    }

    fn begin() -> Event {
        Event::Begin(TxInfo {
            xid: 7,
            commit_lsn: Lsn(100),
            commit_ts: 0,
        })
    }

    fn commit() -> Event {
        Event::Commit {
            tx: TxInfo {
                xid: 7,
                commit_lsn: Lsn(100),
                commit_ts: 0,
            },
            end_lsn: Lsn(108),
        }
    }

    #[test]
    fn nothing_is_flushed_or_ended_inside_a_transaction() {
        let t0 = Instant::now();
        let mut p = policy(t0);
        p.saw(&begin(), t0);
        assert_eq!(p.after_event(t0, false, 0, 0), Step::Wait);
        p.saw(&commit(), t0);
        assert_eq!(p.after_event(t0, true, 1, 10), Step::Wait, "not due yet");
        // The next transaction starts; its changes stall past the interval
        // and past the idle exit: the complete one before it must wait.
        p.saw(&begin(), t0);
        assert_eq!(
            p.deadline(t0),
            t0 + SHUTDOWN_POLL,
            "only the stop request is polled"
        );
        assert_eq!(p.on_shutdown(true), Step::Abandon);
        assert_eq!(p.on_idle(t0 + Duration::from_secs(9), true), Step::Wait);
        p.saw(&commit(), t0 + Duration::from_secs(10));
        assert_eq!(
            p.after_event(t0 + Duration::from_secs(10), true, 2, 20),
            Step::Flush,
            "due at the first transaction end past the interval"
        );
        p.flushed();
        assert_eq!(p.on_idle(t0 + Duration::from_secs(12), false), Step::Wait);
        assert_eq!(p.on_idle(t0 + Duration::from_secs(15), false), Step::Exit);
        assert_eq!(p.on_shutdown(false), Step::Exit);
        p.saw(&commit(), t0);
        assert_eq!(p.on_shutdown(true), Step::FlushAndExit);
    }

    #[test]
    fn a_quiet_stream_the_server_is_still_reading_for_is_not_idle() {
        let t0 = Instant::now();
        let mut p = policy(t0);
        p.read_source(false);
        let late = t0 + Duration::from_secs(60);
        assert_eq!(p.deadline(late), late + SHUTDOWN_POLL, "no idle deadline");
        assert_eq!(p.on_idle(late, false), Step::Wait);
        p.read_source(true);
        assert_eq!(p.on_idle(late, false), Step::Exit);
    }

    #[test]
    fn an_open_streamed_transaction_keeps_the_stream_from_going_idle() {
        let t0 = Instant::now();
        let mut p = policy(t0);
        p.streamed(true, t0 + Duration::from_secs(1));
        assert_eq!(
            p.deadline(t0 + Duration::from_secs(1)),
            t0 + Duration::from_secs(1) + SHUTDOWN_POLL
        );
        // Its chunks stall far past the idle exit; it is still open.
        assert_eq!(p.on_idle(t0 + Duration::from_secs(60), false), Step::Wait);
        // It ended (aborted: no event): the idle clock starts there.
        let ended = t0 + Duration::from_secs(61);
        p.streamed(false, ended);
        assert_eq!(p.on_idle(ended + Duration::from_secs(4), false), Step::Wait);
        assert_eq!(p.deadline(ended), ended + SHUTDOWN_POLL);
        assert_eq!(
            p.deadline(ended + Duration::from_millis(4900)),
            ended + Duration::from_secs(5)
        );
        assert_eq!(p.on_idle(ended + Duration::from_secs(5), false), Step::Exit);
    }

    #[test]
    fn limits_flush_at_the_transaction_end_and_quiet_flushes_what_is_complete() {
        let t0 = Instant::now();
        let mut p = policy(t0);
        p.saw(&commit(), t0);
        assert_eq!(p.after_event(t0, true, 100, 0), Step::Flush, "row limit");
        p.flushed();
        p.saw(&commit(), t0);
        assert_eq!(p.after_event(t0, true, 1, 0), Step::Wait);
        assert_eq!(p.deadline(t0), t0 + SHUTDOWN_POLL);
        assert_eq!(
            p.deadline(t0 + Duration::from_millis(900)),
            t0 + Duration::from_secs(1)
        );
        assert_eq!(p.on_idle(t0 + Duration::from_secs(1), true), Step::Flush);
    }
}
