//! Prometheus metrics for one process, through `prometheus-client`, and
//! the HTTP server (hyper, with a connection cap and timeouts) that serves
//! them on `/metrics` (OpenMetrics text, which Prometheus reads) beside
//! `/healthz`. Names follow
//! `wal2iceberg_<name>_<unit>[_total]`; docs/operations.md lists them with
//! example alert rules.

mod catch_up;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::error::{Error, ErrorKind, Result};

/// Latency buckets, in seconds.
const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0, 30.0, 60.0, 300.0,
];

/// A gauge of seconds (or of a timestamp in seconds).
type Seconds = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableOp {
    table: String,
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableContent {
    table: String,
    content: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabel {
    table: String,
}

/// A gauge with no labels that has no sample until it is first set.
type Optional = Family<Vec<(String, String)>, Seconds>;

pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) replication_lag_bytes: Gauge,
    pub(crate) retained_wal_bytes: Gauge,
    /// 1 while the retained WAL is above the warning threshold.
    pub(crate) retained_wal_over_threshold: Gauge,
    /// Source commit time (µs since the epoch) of the last transaction
    /// committed to the lake, as far as this process knows (the lake's
    /// positions at start); 0 before any.
    pub(crate) last_source_commit_micros: AtomicI64,
    /// Source commit time of the oldest transaction received and not yet
    /// visible in the lake; 0 when there is none.
    pub(crate) oldest_pending_commit_micros: AtomicI64,
    /// How far the server has read the source's WAL for the stream.
    stream_read_lsn: AtomicU64,
    catch_up: Mutex<catch_up::CatchUp>,
    seconds_behind: Optional,
    last_source_commit_age: Optional,
    pub(crate) received_bytes: Counter,
    pub(crate) iceberg_commits: Counter,
    pub(crate) iceberg_commit_retries: Counter,
    pub(crate) initial_load_rows: Counter,
    pub(crate) initial_load_bytes: Counter,
    commit_duration: Histogram,
    commit_to_visible: Histogram,
    pub(crate) compactions: Counter,
    pub(crate) snapshots_expired: Counter,
    last_compaction: Seconds,
    last_expiry: Seconds,
    changes: Family<TableOp, Counter>,
    silver_files: Family<TableContent, Gauge>,
    lake_table_files: Family<TableContent, Gauge>,
    lake_table_bytes: Family<TableLabel, Gauge>,
    backfill_rows: Family<TableLabel, Counter>,
    backfill_rows_estimated: Family<TableLabel, Gauge>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// This process's metrics.
pub(crate) fn metrics() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    fn new() -> Metrics {
        let histogram = || Histogram::new(BUCKETS.iter().copied());
        let mut m = Metrics {
            registry: Registry::default(),
            replication_lag_bytes: Gauge::default(),
            retained_wal_bytes: Gauge::default(),
            retained_wal_over_threshold: Gauge::default(),
            last_source_commit_micros: AtomicI64::new(0),
            oldest_pending_commit_micros: AtomicI64::new(0),
            stream_read_lsn: AtomicU64::new(0),
            catch_up: Mutex::default(),
            seconds_behind: Optional::default(),
            last_source_commit_age: Optional::default(),
            received_bytes: Counter::default(),
            iceberg_commits: Counter::default(),
            iceberg_commit_retries: Counter::default(),
            initial_load_rows: Counter::default(),
            initial_load_bytes: Counter::default(),
            commit_duration: histogram(),
            commit_to_visible: histogram(),
            compactions: Counter::default(),
            snapshots_expired: Counter::default(),
            last_compaction: Seconds::default(),
            last_expiry: Seconds::default(),
            changes: Family::default(),
            silver_files: Family::default(),
            lake_table_files: Family::default(),
            lake_table_bytes: Family::default(),
            backfill_rows: Family::default(),
            backfill_rows_estimated: Family::default(),
        };
        let r = &mut m.registry;
        for (name, help, gauge) in [
            (
                "wal2iceberg_replication_lag_bytes",
                "WAL written by the source and not yet confirmed by the slot",
                &m.replication_lag_bytes,
            ),
            (
                "wal2iceberg_retained_wal_bytes",
                "WAL the slot keeps on the source's disk (current LSN - restart_lsn)",
                &m.retained_wal_bytes,
            ),
            (
                "wal2iceberg_retained_wal_over_threshold",
                "1 while the retained WAL is above retained_wal_warn_bytes",
                &m.retained_wal_over_threshold,
            ),
        ] {
            r.register(name, help, gauge.clone());
        }
        for (name, help, seconds) in [
            (
                "wal2iceberg_last_compaction_timestamp_seconds",
                "when the last compaction committed (0: none yet)",
                &m.last_compaction,
            ),
            (
                "wal2iceberg_last_expiry_timestamp_seconds",
                "when the automatic snapshot expiry last ran (0: not yet)",
                &m.last_expiry,
            ),
        ] {
            r.register(name, help, seconds.clone());
        }
        // Unknown until the stream has read as far as the source's WAL
        // reached at a look (`catch_up`): no sample before.
        r.register(
            "wal2iceberg_lag_seconds",
            "age of the oldest source commit not yet visible in the lake; 0 when none",
            m.seconds_behind.clone(),
        );
        // The same series under its first name, which dashboards use.
        r.register(
            "wal2iceberg_seconds_behind",
            "the same as wal2iceberg_lag_seconds (its older name)",
            m.seconds_behind.clone(),
        );
        // Before anything is in the lake there is no last commit: no sample.
        r.register(
            "wal2iceberg_last_source_commit_age_seconds",
            "seconds since the source commit of the last transaction in the lake (it grows on a \
             quiet source: not a lag)",
            m.last_source_commit_age.clone(),
        );
        for (name, help, counter) in [
            (
                "wal2iceberg_received_bytes",
                "replication payload bytes received",
                &m.received_bytes,
            ),
            (
                "wal2iceberg_iceberg_commits",
                "Iceberg snapshots committed",
                &m.iceberg_commits,
            ),
            (
                "wal2iceberg_iceberg_commit_retries",
                "Iceberg commits retried after a concurrent commit",
                &m.iceberg_commit_retries,
            ),
            (
                "wal2iceberg_initial_load_rows",
                "rows read by initial loads",
                &m.initial_load_rows,
            ),
            (
                "wal2iceberg_initial_load_bytes",
                "bytes of binary COPY data read by initial loads",
                &m.initial_load_bytes,
            ),
            (
                "wal2iceberg_compactions",
                "compactions committed, bronze and silver",
                &m.compactions,
            ),
            (
                "wal2iceberg_snapshots_expired",
                "snapshots removed by the automatic expiry",
                &m.snapshots_expired,
            ),
        ] {
            r.register(name, help, counter.clone());
        }
        r.register(
            "wal2iceberg_silver_files",
            "live files of each silver table, by source table and content",
            m.silver_files.clone(),
        );
        r.register(
            "wal2iceberg_lake_table_files",
            "live files of each lake table (bronze and silver), by content, as of its last \
             compaction or expiry",
            m.lake_table_files.clone(),
        );
        r.register(
            "wal2iceberg_lake_table_bytes",
            "bytes of the live files of each lake table, as of its last compaction or expiry",
            m.lake_table_bytes.clone(),
        );
        r.register(
            "wal2iceberg_backfill_rows",
            "rows the chunked backfill read into the lake, by source table",
            m.backfill_rows.clone(),
        );
        r.register(
            "wal2iceberg_backfill_rows_estimated",
            "the source's estimate of the rows of a table under chunked backfill (pg_class.reltuples)",
            m.backfill_rows_estimated.clone(),
        );
        r.register(
            "wal2iceberg_changes_applied",
            "changes committed to the lake, by source table and op",
            m.changes.clone(),
        );
        r.register(
            "wal2iceberg_iceberg_commit_duration_seconds",
            "time to write and commit one Iceberg snapshot",
            m.commit_duration.clone(),
        );
        r.register(
            "wal2iceberg_commit_to_visible_seconds",
            "from a transaction's source commit to its Iceberg commit",
            m.commit_to_visible.clone(),
        );
        m
    }

    pub(crate) fn add_changes(&self, table: &str, op: &'static str, n: u64) {
        let labels = TableOp {
            table: table.to_owned(),
            op,
        };
        self.changes.get_or_create(&labels).inc_by(n);
    }

    /// A chunk of `rows` taken by a table's backfill, of about `estimate`.
    pub(crate) fn backfill_chunk(&self, table: &str, rows: u64, estimate: Option<u64>) {
        let label = TableLabel {
            table: table.to_owned(),
        };
        self.backfill_rows.get_or_create(&label).inc_by(rows);
        if let Some(estimate) = estimate {
            self.backfill_rows_estimated
                .get_or_create(&label)
                .set(gauge_value(estimate));
        }
    }

    /// The live data and delete files of a source table's silver table.
    pub(crate) fn set_silver_files(&self, table: &str, data: usize, deletes: usize) {
        for (content, n) in [("data", data), ("delete", deletes)] {
            let labels = TableContent {
                table: table.to_owned(),
                content,
            };
            self.silver_files
                .get_or_create(&labels)
                .set(gauge_value(n as u64));
        }
    }

    pub(crate) fn set_lake_table(
        &self,
        table: &str,
        data_files: u64,
        delete_files: u64,
        bytes: u64,
    ) {
        for (content, n) in [("data", data_files), ("delete", delete_files)] {
            let labels = TableContent {
                table: table.to_owned(),
                content,
            };
            self.lake_table_files
                .get_or_create(&labels)
                .set(gauge_value(n));
        }
        let labels = TableLabel {
            table: table.to_owned(),
        };
        self.lake_table_bytes
            .get_or_create(&labels)
            .set(gauge_value(bytes));
    }

    pub(crate) fn observe_commit_duration(&self, took: Duration) {
        self.commit_duration.observe(took.as_secs_f64());
    }

    pub(crate) fn observe_commit_to_visible(&self, took: Duration) {
        self.commit_to_visible.observe(took.as_secs_f64());
    }

    /// A compaction committed now.
    pub(crate) fn compacted(&self) {
        self.compactions.inc();
        self.last_compaction.set(now_micros() as f64 / 1e6);
    }

    /// The server has read the source's WAL up to `lsn` for the stream.
    pub(crate) fn stream_read(&self, lsn: u64) {
        self.stream_read_lsn.fetch_max(lsn, Ordering::Relaxed);
    }

    /// The source's WAL ended at `lsn` just now.
    pub(crate) fn source_wal_end(&self, lsn: u64) {
        let mut catch_up = self.catch_up.lock().unwrap_or_else(|p| p.into_inner());
        catch_up.read(self.stream_read_lsn.load(Ordering::Relaxed));
        catch_up.looked(lsn, now_micros());
    }

    /// The automatic expiry ran now.
    pub(crate) fn expired(&self) {
        self.last_expiry.set(now_micros() as f64 / 1e6);
    }

    /// The OpenMetrics text of every metric, the ages computed now.
    pub(crate) fn render(&self) -> String {
        let age = |micros: i64| (now_micros() - micros).max(0) as f64 / 1e6;
        let pending = self.oldest_pending_commit_micros.load(Ordering::Relaxed);
        let behind = if pending == 0 {
            let mut catch_up = self.catch_up.lock().unwrap_or_else(|p| p.into_inner());
            catch_up.read(self.stream_read_lsn.load(Ordering::Relaxed));
            catch_up.behind(now_micros())
        } else {
            Some(age(pending))
        };
        match behind {
            Some(seconds) => {
                self.seconds_behind.get_or_create(&Vec::new()).set(seconds);
            }
            None => self.seconds_behind.clear(),
        }
        let last = self.last_source_commit_micros.load(Ordering::Relaxed);
        if last != 0 {
            self.last_source_commit_age
                .get_or_create(&Vec::new())
                .set(age(last));
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(crate) fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The media type of [`Metrics::render`]'s text.
const METRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_TYPE: &str = "text/plain; charset=utf-8";

/// At most this many metrics connections are served at once; the next
/// waits until one ends.
const MAX_CONNECTIONS: usize = 32;
/// A connection that has not sent a whole request head by then is closed.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Whatever a client does, its connection ends by then.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `/metrics` and `/healthz` on `addr` until the process ends.
pub(crate) async fn serve(addr: SocketAddr) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Error::new(ErrorKind::Config, "cannot listen for metrics")
            .with_context("address", addr)
            .with_source(e)
    })?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving /metrics and /healthz");
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = open.clone().acquire_owned().await else {
                return;
            };
            let socket = match listener.accept().await {
                Ok((socket, _)) => socket,
                // Out of file descriptors, say: try again later, not at once.
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a metrics connection");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            tokio::spawn(async move {
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(socket), service_fn(respond));
                // An error here is the client's (it hung up, or sent no
                // HTTP): nothing for the run to act on.
                let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
                drop(permit);
            });
        }
    });
    Ok(bound)
}

async fn respond(
    request: Request<Incoming>,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    let (status, content_type, body) = match request.uri().path() {
        "/metrics" => (StatusCode::OK, METRICS_TYPE, metrics().render()),
        "/healthz" => (StatusCode::OK, TEXT_TYPE, "ok\n".to_owned()),
        _ => (StatusCode::NOT_FOUND, TEXT_TYPE, "not found\n".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(text: &'a str, series: &str) -> Option<&'a str> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
    }

    #[test]
    fn the_exposition_names_escapes_and_leaves_out_what_is_unknown() {
        let m = Metrics::new();
        let text = m.render();
        for name in ["wal2iceberg_lag_seconds", "wal2iceberg_seconds_behind"] {
            assert_eq!(
                sample(&text, name),
                None,
                "the stream has read nothing: {text}"
            );
        }
        let age = "wal2iceberg_last_source_commit_age_seconds";
        assert_eq!(sample(&text, age), None, "no last commit yet: {text}");
        assert!(text.ends_with("# EOF\n"), "{text}");

        m.last_source_commit_micros
            .store(now_micros() - 2_000_000, Ordering::Relaxed);
        m.add_changes("public.\"odd\\name\"", "c", 3);
        m.received_bytes.inc_by(10);
        m.observe_commit_duration(Duration::from_millis(30));
        let text = m.render();
        let seconds: f64 = sample(&text, age).expect(&text).parse().unwrap();
        assert!((2.0..60.0).contains(&seconds), "{text}");
        assert_eq!(
            sample(
                &text,
                r#"wal2iceberg_changes_applied_total{table="public.\"odd\\name\"",op="c"}"#
            ),
            Some("3"),
            "{text}"
        );
        assert_eq!(
            sample(&text, "wal2iceberg_received_bytes_total"),
            Some("10")
        );
        assert_eq!(
            sample(
                &text,
                r#"wal2iceberg_iceberg_commit_duration_seconds_bucket{le="0.05"}"#
            ),
            Some("1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_request_does_not_hold_the_server() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        // Every connection the server takes at once, each stuck mid-head.
        let mut stuck = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
            socket
                .write_all(b"GET /metrics HTTP/1.1\r\n")
                .await
                .unwrap();
            stuck.push(socket);
        }
        let started = std::time::Instant::now();
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        socket
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        tokio::time::timeout(HEADER_TIMEOUT * 3, socket.read_to_string(&mut response))
            .await
            .expect("answered once the stuck connections timed out")
            .unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("\r\n\r\nok\n"), "{response}");
        assert!(
            started.elapsed() >= HEADER_TIMEOUT / 2,
            "the cap held the new connection back: {:?}",
            started.elapsed()
        );
        // The stuck ones were closed by the server, not left open.
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(1), stuck[0].read_to_end(&mut rest))
            .await
            .expect("a stuck connection is closed")
            .ok();
    }
}
