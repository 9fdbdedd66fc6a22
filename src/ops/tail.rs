//! `wal2iceberg tail`: the decoded change stream as JSON lines, like
//! pg_recvlogical with wal2json. A transaction is confirmed to the server
//! once its last line is written and flushed, so a restart resumes after
//! what was printed.

use std::io::Write;
use std::time::Duration;

use tokio::time::Instant;

use crate::cdc::capture::{self, Capture, CaptureOptions};
use crate::cdc::event::Event;
use crate::cdc::stream::Next;
use crate::error::{Error, ErrorKind, Result};
use crate::pg::config::PgConfig;

pub struct TailOptions {
    pub capture: CaptureOptions,
    /// Exit 0 once no event arrived for this long; run forever when unset.
    pub exit_when_idle: Option<Duration>,
}

/// Streams events to `out` until idle (if asked) or until the server ends
/// the stream. Returns the number of events written.
pub async fn tail(config: &PgConfig, options: &TailOptions, out: &mut dyn Write) -> Result<u64> {
    let mut written = 0u64;
    let mut stream = match capture::open(config, &options.capture).await? {
        Capture::Fresh { mut load, pending } => {
            while let Some(event) = load.next_event().await? {
                write_event(out, &event)?;
                written += 1;
            }
            out.flush()?;
            let consistent_point = load.consistent_point();
            let mut stream = pending.start().await?;
            stream.confirm(consistent_point).await?;
            stream
        }
        Capture::Resume { pending, .. } => pending.start().await?,
    };
    let idle_from_now = || options.exit_when_idle.map(|d| Instant::now() + d);
    let mut deadline = idle_from_now();
    loop {
        let next = stream.next_before(deadline).await?;
        // A streamed transaction's chunks arrive as no event until its
        // Stream Commit: while one is open, the stream is not idle.
        let streaming = stream.in_streamed_transaction();
        match next {
            Next::Event(event) => {
                write_event(out, &event)?;
                written += 1;
                if let Event::Commit { end_lsn, .. } = event {
                    out.flush()?;
                    stream.confirm(end_lsn).await?;
                }
                deadline = idle_from_now();
            }
            Next::Idle if streaming => deadline = idle_from_now(),
            Next::Idle => break,
            Next::Closed => {
                return Err(Error::new(
                    ErrorKind::Connection,
                    "the server ended the replication stream",
                ));
            }
        }
    }
    stream.stop().await?;
    Ok(written)
}

fn write_event(out: &mut dyn Write, event: &Event) -> Result<()> {
    serde_json::to_writer(&mut *out, &event.to_json()).map_err(|e| {
        // The I/O error itself, so that a closed output stays recognizable.
        Error::new(ErrorKind::Io, "cannot write an event").with_source(std::io::Error::from(e))
    })?;
    out.write_all(b"\n")?;
    Ok(())
}
