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

use crate::error::{Result, postgres};
use crate::metrics::metrics;
use crate::pg::config::PgConfig;
use crate::pg::source::SourceClient;

/// How often the slot is looked at by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct MonitorOptions {
    pub slot: String,
    pub interval: Duration,
    pub heartbeat: Option<Duration>,
    pub retained_wal_warn_bytes: u64,
}

/// Aborts the monitor when dropped.
pub struct Monitor(JoinHandle<()>);

impl Drop for Monitor {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub async fn start(config: &PgConfig, options: MonitorOptions) -> Result<Monitor> {
    let client = SourceClient::connect(config).await?;
    Ok(Monitor(tokio::spawn(watch(client, options))))
}

async fn watch(client: SourceClient, options: MonitorOptions) {
    let mut ticker = tokio::time::interval(options.interval);
    let mut next_heartbeat = options.heartbeat.map(|d| tokio::time::Instant::now() + d);
    let mut over = false;
    loop {
        ticker.tick().await;
        if let Err(err) = look(&client, &options, &mut over).await {
            tracing::warn!(error = %err, "cannot read the slot's state; trying again");
        }
        if let (Some(at), Some(every)) = (next_heartbeat, options.heartbeat)
            && tokio::time::Instant::now() >= at
        {
            next_heartbeat = Some(at + every);
            if let Err(err) = client
                .batch_execute("SELECT pg_logical_emit_message(false, 'wal2iceberg', 'heartbeat')")
                .await
            {
                tracing::warn!(error = %postgres(err, "heartbeat failed"), "heartbeat failed");
            }
        }
    }
}

async fn look(client: &SourceClient, options: &MonitorOptions, over: &mut bool) -> Result<()> {
    let row = client
        .query_opt(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8, \
             pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn)::int8, wal_status, \
             safe_wal_size, pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&options.slot],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_replication_slots"))?;
    let Some(row) = row else {
        tracing::error!(slot = %options.slot, "the replication slot is gone");
        return Ok(());
    };
    let retained: Option<i64> = row.get(0);
    let lag: Option<i64> = row.get(1);
    let wal_status: Option<String> = row.get(2);
    let safe_wal_size: Option<i64> = row.get(3);
    let wal_end: i64 = row.get(4);
    let m = metrics();
    m.source_wal_end(wal_end as u64);
    m.retained_wal_bytes.set(retained.unwrap_or(0));
    m.replication_lag_bytes.set(lag.unwrap_or(0));
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
    match wal_status.as_deref() {
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
