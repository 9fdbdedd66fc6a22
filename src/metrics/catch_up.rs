//! How far behind the source the run is when it holds no pending
//! transaction: whether the server has read its WAL as far as the source
//! had written it at the monitor's last looks.
//!
//! Transactions arrive in commit order, so while one is pending the age of
//! the oldest pending one is exact. With none pending, every commit before
//! a look the stream has read past has arrived: at most the age of the
//! newest such look is unheld, and nothing when the stream has read past
//! the newest look of all (to the monitor's interval, 5 s by default).
//! Before the stream has read past any look, nothing is known.

use std::collections::VecDeque;

/// Looks kept while the stream has not read past them; beyond it the
/// oldest is forgotten, which only makes the bound older.
const AHEAD: usize = 1024;

#[derive(Debug, Default)]
pub(super) struct CatchUp {
    /// Looks at the source's WAL end (position, µs since the epoch) the
    /// stream has not read past yet, oldest first.
    ahead: VecDeque<(u64, i64)>,
    /// When the newest look the stream has read past was taken.
    reached: Option<i64>,
}

impl CatchUp {
    /// The source's WAL ended at `wal_end` at `at`.
    pub(super) fn looked(&mut self, wal_end: u64, at: i64) {
        if self.ahead.len() == AHEAD {
            self.ahead.pop_front();
        }
        self.ahead.push_back((wal_end, at));
    }

    /// The server has read the source's WAL up to `read` for the stream.
    pub(super) fn read(&mut self, read: u64) {
        while let Some(&(wal_end, at)) = self.ahead.front()
            && wal_end <= read
        {
            self.reached = Some(at);
            self.ahead.pop_front();
        }
    }

    /// Seconds behind at `now` with nothing pending; `None` when unknown.
    pub(super) fn behind(&self, now: i64) -> Option<f64> {
        let reached = self.reached?;
        Some(if self.ahead.is_empty() {
            0.0
        } else {
            (now - reached).max(0) as f64 / 1e6
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_the_newest_look_the_stream_read_past() {
        let mut c = CatchUp::default();
        assert_eq!(c.behind(10_000_000), None, "nothing read yet");
        c.looked(100, 1_000_000);
        c.read(99);
        assert_eq!(c.behind(10_000_000), None);
        c.read(100);
        assert_eq!(c.behind(10_000_000), Some(0.0), "past the newest look");
        c.looked(200, 6_000_000);
        c.looked(300, 11_000_000);
        c.read(250);
        assert_eq!(
            c.behind(16_000_000),
            Some(10.0),
            "past the look at 6 s only"
        );
        c.read(300);
        assert_eq!(c.behind(16_000_000), Some(0.0));
    }

    #[test]
    fn a_forgotten_look_only_makes_the_bound_older() {
        let mut c = CatchUp::default();
        c.looked(1, 0);
        c.read(1);
        for i in 0..=AHEAD as u64 {
            c.looked(10 + i, 1_000_000 + i as i64);
        }
        assert_eq!(c.ahead.len(), AHEAD);
        assert_eq!(c.behind(3_000_000), Some(3.0));
    }
}
