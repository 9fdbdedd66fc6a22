//! `wal2iceberg tail`: the decoded change stream as JSON lines, like
//! pg_recvlogical with wal2json. It never consumes a slot by accident
//! ([`TailSlot`]): by default it reads a temporary slot of its own, gone
//! when it ends; a named slot (a run's) it reads without confirming, so
//! the run still gets every change. Only `--consume` confirms each
//! transaction once its last line is written and flushed, so that a
//! restart resumes after what was printed; it refuses a slot the lake it
//! is pointed at records, whose changes would never reach that lake.

use std::io::Write;
use std::time::Duration;

use iceberg::NamespaceIdent;
use tokio::time::Instant;

use crate::apply::table_set;
use crate::cdc::capture::{self, Capture, CaptureOptions};
use crate::cdc::event::Event;
use crate::cdc::stream::Next;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::LakeLocation;
use crate::pg::config::PgConfig;
use crate::pg::source::{self, SourceClient};
use crate::shutdown::Shutdown;

pub struct TailOptions {
    pub capture: CaptureOptions,
    /// Exit 0 once no event arrived for this long; run forever when unset.
    pub exit_when_idle: Option<Duration>,
    pub slot: TailSlot,
    /// The lake and namespace whose slot `--consume` refuses, if any.
    pub lake: Option<(LakeLocation, NamespaceIdent)>,
    /// SIGINT or SIGTERM: stop between events, cleanly, and exit 0.
    pub shutdown: Shutdown,
}

/// Which slot tail reads, and whether it confirms what it printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailSlot {
    /// A temporary slot of its own: the tables' rows now, then changes.
    Temporary,
    /// The named slot, which must exist, from its position; nothing is
    /// confirmed, so its consumer misses nothing.
    Peek,
    /// The named slot, created if missing, confirmed as printed.
    Consume,
}

/// Streams events to `out` until idle (if asked), a stop request, or the
/// server ends the stream. Returns the number of events written.
pub async fn tail(config: &PgConfig, options: &TailOptions, out: &mut dyn Write) -> Result<u64> {
    options.capture.validate()?;
    let mut capture_options = options.capture.clone();
    capture_options.manage_publication = false;
    match options.slot {
        TailSlot::Temporary => {
            capture_options.slot = capture::temporary_slot_name("wal2iceberg_tail");
            capture_options.temporary_slot = true;
        }
        TailSlot::Peek => {
            let client = SourceClient::connect(config).await?;
            if source::slot_info(&client, &capture_options.slot)
                .await?
                .is_none()
            {
                return Err(Error::new(
                    ErrorKind::Slot,
                    format!(
                        "replication slot {:?} does not exist: tail reads a named slot without \
                         consuming it. Leave out --slot to tail from a temporary slot of its own, \
                         or pass --consume to create this slot and consume it",
                        capture_options.slot
                    ),
                ));
            }
        }
        TailSlot::Consume => {
            if let Some((lake, namespace)) = &options.lake
                && table_set::lake_replicates_slot(lake, namespace, &capture_options.slot).await?
            {
                return Err(Error::new(
                    ErrorKind::Slot,
                    format!(
                        "replication slot {:?} is the lake's (its bronze tables in namespace {} \
                         record it): tail --consume would confirm changes the lake never gets. \
                         Leave out --consume to read it without consuming it, or consume a slot \
                         of its own",
                        capture_options.slot,
                        namespace.join(".")
                    ),
                )
                .with_context("slot", &capture_options.slot));
            }
            tracing::warn!(
                slot = %capture_options.slot,
                "tail --consume confirms each transaction it prints: a run on this slot never \
                 sees those changes"
            );
        }
    }
    let confirms = options.slot != TailSlot::Peek;
    let mut written = 0u64;
    let mut stream = match capture::open(config, &capture_options).await? {
        Capture::Fresh {
            mut load, pending, ..
        } => {
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
    if !confirms {
        stream.never_confirm();
    }
    let idle_from_now = || options.exit_when_idle.map(|d| Instant::now() + d);
    let mut idle_at = idle_from_now();
    while !options.shutdown.is_requested() {
        // Wakes at least every quarter second to see a stop request.
        let wake = Instant::now() + Duration::from_millis(250);
        let next = stream
            .next_before(Some(idle_at.map_or(wake, |d| d.min(wake))))
            .await?;
        // A streamed transaction's chunks arrive as no event until its
        // Stream Commit: while one is open, the stream is not idle.
        let streaming = stream.in_streamed_transaction();
        match next {
            Next::Event(event) => {
                write_event(out, &event)?;
                written += 1;
                if let Event::Commit { end_lsn, .. } = event {
                    out.flush()?;
                    if confirms {
                        stream.confirm(end_lsn).await?;
                    }
                }
                idle_at = idle_from_now();
            }
            Next::Idle if streaming => idle_at = idle_from_now(),
            Next::Idle if idle_at.is_some_and(|d| Instant::now() >= d) => break,
            Next::Idle => {}
            Next::Closed => {
                return Err(Error::new(
                    ErrorKind::Connection,
                    "the server ended the replication stream",
                ));
            }
        }
    }
    out.flush()?;
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
