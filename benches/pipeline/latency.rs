//! The latency phase: a steady 1,000 single-row transactions per second
//! while wal2iceberg runs, the commit-to-visible latency read from its
//! metrics' histogram.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Bench, BenchResult, SLOT};

/// What the latency phase runs at, and for how long.
const STEADY_RATE: u64 = 1_000;
const STEADY_FOR: Duration = Duration::from_secs(30);
/// wal2iceberg's default flush interval, which the latency targets use.
const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

impl Bench {
    /// A steady 1,000 single-row transactions per second while wal2iceberg
    /// runs; latency from its commit-to-visible histogram.
    pub(crate) async fn latency(&mut self) -> BenchResult<()> {
        println!("latency: {STEADY_RATE} transactions/s for {STEADY_FOR:?}");
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut run = self
            .wal2iceberg_alone(&["--metrics-addr", &metrics.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // Steady state: the load starts once the run has caught up. A
        // restarted slot is decoded again from its restart_lsn, which can
        // lie before a large transaction whose changes were all confirmed
        // (PostgreSQL moves restart_lsn only at the running-transactions
        // records it decodes after a confirmation): the walsender reads
        // that WAL again before anything new arrives.
        let opening = Instant::now();
        let row = self
            .client
            .query_one(
                "SELECT pg_current_wal_lsn()::text, \
                 pg_wal_lsn_diff(confirmed_flush_lsn, restart_lsn)::int8 \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .await?;
        let (now_lsn, redecoded): (String, i64) = (row.get(0), row.get(1));
        while self
            .client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active \
                 AND confirmed_flush_lsn >= $2::text::pg_lsn",
                &[&SLOT, &now_lsn],
            )
            .await?
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.report.figure(
            "start until caught up (tables opened, WAL decoded again)",
            format!(
                "{:.1} s ({:.0} MB from restart_lsn)",
                opening.elapsed().as_secs_f64(),
                redecoded as f64 / 1e6
            ),
        );
        let mut tick = tokio::time::interval(Duration::from_secs(1) / STEADY_RATE as u32);
        let until = Instant::now() + STEADY_FOR;
        let mut i: u64 = 0;
        while Instant::now() < until {
            tick.tick().await;
            i += 1;
            let id = (i * 7919) % self.rows + 1;
            self.client
                .execute(
                    "UPDATE orders SET amount = amount + 1, updated_at = now() WHERE id = $1",
                    &[&(id as i64)],
                )
                .await?;
        }
        // Let the last batch land before reading the histogram.
        tokio::time::sleep(FLUSH_INTERVAL * 3).await;
        let scrape = http_get(&metrics.to_string(), "/metrics").await?;
        // Then quiet: the run compacts silver fully (no delete file left)
        // before the read phase scans it.
        let quiet = Instant::now();
        let deletes = "wal2iceberg_silver_files{table=\"public.orders\",content=\"delete\"}";
        while gauge(&http_get(&metrics.to_string(), "/metrics").await?, deletes) != Some(0.0)
            && quiet.elapsed() < Duration::from_secs(300)
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let settled = quiet.elapsed().as_secs_f64();
        let _ = Command::new("kill").arg(run.id().to_string()).status();
        run.wait()?;
        self.report.figure(
            "quiet until silver holds no delete file",
            format!("{settled:.1} s"),
        );
        let buckets = histogram(&scrape, "wal2iceberg_commit_to_visible_seconds_bucket");
        let flush = FLUSH_INTERVAL.as_secs_f64();
        let p50 = quantile(&buckets, 0.5);
        let p99 = quantile(&buckets, 0.99);
        let r = &mut self.report;
        r.figure("steady transactions", format!("{i}"));
        // Issue 20's targets at a 1 s flush: p50 at most the flush
        // interval, p99 at most twice it.
        r.check(
            "commit-to-visible p50 (bucket bound)",
            format!("<= {p50} s"),
            format!("<= {flush} s"),
            p50 <= flush,
        );
        r.check(
            "commit-to-visible p99 (bucket bound)",
            format!("<= {p99} s"),
            format!("<= {} s", 2.0 * flush),
            p99 <= 2.0 * flush,
        );
        Ok(())
    }
}

/// The value of a gauge series in a Prometheus scrape.
fn gauge(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

async fn http_get(addr: &str, path: &str) -> BenchResult<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}

/// `(upper bound, cumulative count)` of a Prometheus histogram.
fn histogram(scrape: &str, series: &str) -> Vec<(f64, f64)> {
    scrape
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(series)?.strip_prefix("{le=\"")?;
            let (bound, count) = rest.split_once("\"} ")?;
            let bound = if bound == "+Inf" {
                f64::INFINITY
            } else {
                bound.parse().ok()?
            };
            Some((bound, count.trim().parse().ok()?))
        })
        .collect()
}

/// The smallest bucket bound holding the quantile `q`.
fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map_or(0.0, |b| b.1);
    buckets
        .iter()
        .find(|(_, count)| *count >= q * total && total > 0.0)
        .map_or(f64::INFINITY, |b| b.0)
}
