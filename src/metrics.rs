//! Prometheus metrics for one process, and the small HTTP server that
//! serves them on `/metrics` (text exposition format 0.0.4) beside
//! `/healthz`. Names follow `wal2iceberg_<name>_<unit>[_total]`;
//! docs/operations.md lists them with example alert rules.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::error::{Error, ErrorKind, Result};

/// Latency buckets, in seconds.
const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0, 30.0, 60.0, 300.0,
];

pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    const fn new() -> Histogram {
        Histogram {
            counts: [const { AtomicU64::new(0) }; BUCKETS.len()],
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            if seconds <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(value.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

pub struct Metrics {
    pub replication_lag_bytes: AtomicI64,
    pub retained_wal_bytes: AtomicI64,
    /// 1 while the retained WAL is above the warning threshold.
    pub retained_wal_over_threshold: AtomicI64,
    /// Source commit time (µs since the epoch) of the last transaction
    /// committed to the lake, as far as this process knows (the lake's
    /// positions at start); 0 before any.
    pub last_source_commit_micros: AtomicI64,
    /// Source commit time of the oldest transaction received and not yet
    /// visible in the lake; 0 when there is none.
    pub oldest_pending_commit_micros: AtomicI64,
    pub received_bytes: AtomicU64,
    pub iceberg_commits: AtomicU64,
    pub iceberg_commit_retries: AtomicU64,
    pub initial_load_rows: AtomicU64,
    pub initial_load_bytes: AtomicU64,
    pub commit_duration: Histogram,
    pub commit_to_visible: Histogram,
    pub compactions: AtomicU64,
    pub snapshots_expired: AtomicU64,
    /// When the last compaction and the last expiry ran (µs since the
    /// epoch); 0 before the first.
    pub last_compaction_micros: AtomicI64,
    pub last_expiry_micros: AtomicI64,
    /// Changes committed, by (source table, op code).
    changes: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Live files of each silver table, by (source table, content).
    silver_files: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Per lake table (bronze and silver): live data files, delete files
    /// and their bytes, from its current snapshot's summary.
    lake_tables: Mutex<BTreeMap<String, [u64; 3]>>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    replication_lag_bytes: AtomicI64::new(0),
    retained_wal_bytes: AtomicI64::new(0),
    retained_wal_over_threshold: AtomicI64::new(0),
    last_source_commit_micros: AtomicI64::new(0),
    oldest_pending_commit_micros: AtomicI64::new(0),
    received_bytes: AtomicU64::new(0),
    iceberg_commits: AtomicU64::new(0),
    iceberg_commit_retries: AtomicU64::new(0),
    initial_load_rows: AtomicU64::new(0),
    initial_load_bytes: AtomicU64::new(0),
    commit_duration: Histogram::new(),
    commit_to_visible: Histogram::new(),
    compactions: AtomicU64::new(0),
    snapshots_expired: AtomicU64::new(0),
    last_compaction_micros: AtomicI64::new(0),
    last_expiry_micros: AtomicI64::new(0),
    changes: Mutex::new(BTreeMap::new()),
    silver_files: Mutex::new(BTreeMap::new()),
    lake_tables: Mutex::new(BTreeMap::new()),
});

/// This process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    pub fn add_changes(&self, table: &str, op: &'static str, n: u64) {
        let mut changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        *changes.entry((table.to_owned(), op)).or_default() += n;
    }

    /// The live data and delete files of a source table's silver table.
    pub fn set_silver_files(&self, table: &str, data: usize, deletes: usize) {
        let mut files = self.silver_files.lock().unwrap_or_else(|e| e.into_inner());
        files.insert((table.to_owned(), "data"), data as u64);
        files.insert((table.to_owned(), "delete"), deletes as u64);
    }

    pub fn set_lake_table(&self, table: &str, data_files: u64, delete_files: u64, bytes: u64) {
        let mut tables = self.lake_tables.lock().unwrap_or_else(|e| e.into_inner());
        tables.insert(table.to_owned(), [data_files, delete_files, bytes]);
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let gauge = |out: &mut String, name: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        let load = |a: &AtomicI64| a.load(Ordering::Relaxed) as f64;
        gauge(
            &mut out,
            "wal2iceberg_replication_lag_bytes",
            "WAL written by the source and not yet confirmed by the slot",
            load(&self.replication_lag_bytes),
        );
        gauge(
            &mut out,
            "wal2iceberg_retained_wal_bytes",
            "WAL the slot keeps on the source's disk (current LSN - restart_lsn)",
            load(&self.retained_wal_bytes),
        );
        gauge(
            &mut out,
            "wal2iceberg_retained_wal_over_threshold",
            "1 while the retained WAL is above retained_wal_warn_bytes",
            load(&self.retained_wal_over_threshold),
        );
        let age = |micros: i64| (now_micros() - micros).max(0) as f64 / 1e6;
        let pending = self.oldest_pending_commit_micros.load(Ordering::Relaxed);
        gauge(
            &mut out,
            "wal2iceberg_seconds_behind",
            "age of the oldest source commit received and not yet visible in the lake; 0 when none",
            if pending == 0 { 0.0 } else { age(pending) },
        );
        // Before anything is in the lake there is no last commit: no sample.
        let last = self.last_source_commit_micros.load(Ordering::Relaxed);
        let name = "wal2iceberg_last_source_commit_age_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} seconds since the source commit of the last transaction in the lake \
             (it grows on a quiet source: not a lag)\n# TYPE {name} gauge"
        );
        if last != 0 {
            let _ = writeln!(out, "{name} {}", age(last));
        }
        counter(
            &mut out,
            "wal2iceberg_received_bytes_total",
            "replication payload bytes received",
            self.received_bytes.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "wal2iceberg_iceberg_commits_total",
            "Iceberg snapshots committed",
            self.iceberg_commits.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "wal2iceberg_iceberg_commit_retries_total",
            "Iceberg commits retried after a concurrent commit",
            self.iceberg_commit_retries.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "wal2iceberg_initial_load_rows_total",
            "rows read by initial loads",
            self.initial_load_rows.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "wal2iceberg_initial_load_bytes_total",
            "bytes of binary COPY data read by initial loads",
            self.initial_load_bytes.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "wal2iceberg_compactions_total",
            "compactions committed, bronze and silver",
            self.compactions.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "wal2iceberg_snapshots_expired_total",
            "snapshots removed by the automatic expiry",
            self.snapshots_expired.load(Ordering::Relaxed),
        );
        let seconds = |a: &AtomicI64| a.load(Ordering::Relaxed) as f64 / 1e6;
        gauge(
            &mut out,
            "wal2iceberg_last_compaction_timestamp_seconds",
            "when the last compaction committed (0: none yet)",
            seconds(&self.last_compaction_micros),
        );
        gauge(
            &mut out,
            "wal2iceberg_last_expiry_timestamp_seconds",
            "when the automatic snapshot expiry last ran (0: not yet)",
            seconds(&self.last_expiry_micros),
        );
        let name = "wal2iceberg_silver_files";
        let _ = writeln!(
            out,
            "# HELP {name} live files of each silver table, by source table and content\n# TYPE {name} gauge"
        );
        let files = self.silver_files.lock().unwrap_or_else(|e| e.into_inner());
        for ((table, content), n) in files.iter() {
            let _ = writeln!(out, "{name}{{table=\"{table}\",content=\"{content}\"}} {n}");
        }
        drop(files);
        let tables = self.lake_tables.lock().unwrap_or_else(|e| e.into_inner());
        let name = "wal2iceberg_lake_table_files";
        let _ = writeln!(
            out,
            "# HELP {name} live files of each lake table (bronze and silver), by content, as of its last compaction or expiry\n# TYPE {name} gauge"
        );
        for (table, [data, deletes, _]) in tables.iter() {
            let _ = writeln!(out, "{name}{{table=\"{table}\",content=\"data\"}} {data}");
            let _ = writeln!(
                out,
                "{name}{{table=\"{table}\",content=\"delete\"}} {deletes}"
            );
        }
        let name = "wal2iceberg_lake_table_bytes";
        let _ = writeln!(
            out,
            "# HELP {name} bytes of the live files of each lake table, as of its last compaction or expiry\n# TYPE {name} gauge"
        );
        for (table, [_, _, bytes]) in tables.iter() {
            let _ = writeln!(out, "{name}{{table=\"{table}\"}} {bytes}");
        }
        drop(tables);
        let name = "wal2iceberg_changes_applied_total";
        let _ = writeln!(
            out,
            "# HELP {name} changes committed to the lake, by source table and op\n# TYPE {name} counter"
        );
        let changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        for ((table, op), n) in changes.iter() {
            let _ = writeln!(out, "{name}{{table=\"{table}\",op=\"{op}\"}} {n}");
        }
        drop(changes);
        self.commit_duration.render(
            &mut out,
            "wal2iceberg_iceberg_commit_duration_seconds",
            "time to write and commit one Iceberg snapshot",
        );
        self.commit_to_visible.render(
            &mut out,
            "wal2iceberg_commit_to_visible_seconds",
            "from a transaction's source commit to its Iceberg commit",
        );
        out
    }
}

pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Serves `/metrics` and `/healthz` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Error::new(ErrorKind::Config, "cannot listen for metrics")
            .with_context("address", addr)
            .with_source(e)
    })?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving /metrics and /healthz");
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut chunk = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&chunk[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&request);
                let path = line.split_whitespace().nth(1).unwrap_or("");
                let (status, body) = match path {
                    "/metrics" => ("200 OK", metrics().render()),
                    "/healthz" => ("200 OK", "ok\n".to_owned()),
                    _ => ("404 Not Found", "not found\n".to_owned()),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    Ok(bound)
}
