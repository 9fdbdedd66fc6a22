//! The slot seen from the source while a run streams: every few seconds,
//! lag and retained WAL from `pg_replication_slots` into the metrics, a
//! loud warning when the slot retains more WAL than the threshold (and
//! when it is at risk or lost), and, when asked, a heartbeat message so
//! the slot advances on a server where only other databases write WAL.
//!
//! It runs on a connection of its own and never stops the pipeline: a
//! failed look is logged and tried again at the next tick.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::cdc::source::Source;
use crate::error::Result;
use crate::metrics::metrics;
use crate::pg::config::PgConfig;

/// How often the slot is looked at by default.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub(crate) struct MonitorOptions {
    pub(crate) slot: String,
    pub(crate) interval: Duration,
    pub(crate) heartbeat: Option<Duration>,
    pub(crate) retained_wal_warn_bytes: u64,
}

/// Aborts the monitor when dropped.
pub(crate) struct Monitor(JoinHandle<()>);

impl Drop for Monitor {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) async fn start(config: &PgConfig, options: MonitorOptions) -> Result<Monitor> {
    let source = Source::connect(config).await?;
    Ok(Monitor(tokio::spawn(watch(source, options))))
}

async fn watch(source: Source, options: MonitorOptions) {
    let mut ticker = tokio::time::interval(options.interval);
    let mut next_heartbeat = options.heartbeat.map(|d| tokio::time::Instant::now() + d);
    let mut over = false;
    loop {
        ticker.tick().await;
        if let Err(err) = look(&source, &options, &mut over).await {
            tracing::warn!(error = %err, "cannot read the slot's state; trying again");
        }
        if let (Some(at), Some(every)) = (next_heartbeat, options.heartbeat)
            && tokio::time::Instant::now() >= at
        {
            next_heartbeat = Some(at + every);
            if let Err(err) = source.heartbeat().await {
                tracing::warn!(error = %err, "heartbeat failed");
            }
        }
    }
}

async fn look(source: &Source, options: &MonitorOptions, over: &mut bool) -> Result<()> {
    let Some(health) = source.slot_health(&options.slot).await? else {
        tracing::error!(slot = %options.slot, "the replication slot is gone");
        return Ok(());
    };
    let retained = health.retained_bytes;
    let safe_wal_size = health.safe_wal_size;
    let m = metrics();
    m.source_wal_end(health.wal_end);
    m.retained_wal_bytes.set(retained.unwrap_or(0));
    m.replication_lag_bytes.set(health.lag_bytes.unwrap_or(0));
    let now_over = retained.is_some_and(|r| r as u64 > options.retained_wal_warn_bytes);
    m.retained_wal_over_threshold.set(i64::from(now_over));
    if now_over && !*over {
        tracing::warn!(
            slot = %options.slot,
            retained_wal_bytes = retained,
            threshold = options.retained_wal_warn_bytes,
            "the slot retains more WAL than the threshold: the source's disk fills until wal2iceberg catches up"
        );
    }
    *over = now_over;
    match health.wal_status.as_deref() {
        Some("unreserved") => tracing::warn!(
            slot = %options.slot,
            safe_wal_size,
            "the slot is about to lose WAL it needs (wal_status unreserved): it will be invalidated at the next checkpoint unless wal2iceberg catches up"
        ),
        Some("lost") => tracing::error!(
            slot = %options.slot,
            "the slot was invalidated (wal_status lost): the lake cannot be continued from it; see docs/operations.md"
        ),
        _ => {}
    }
    Ok(())
}
