//! The pipeline benchmark (docs/benchmarks.md): wal2iceberg against
//! PostgreSQL's own ceilings, measured on the same data in the same run.
//!
//! It starts a throwaway PostgreSQL, loads `orders` with N rows, and times
//! `COPY orders TO STDOUT` (binary and text) through psql and DuckDB's
//! postgres extension writing one zstd Parquet file
//! (`benches/duckdb_load.py`) as the load references, then wal2iceberg's
//! initial load. With the slot in place it
//! runs the workload (N inserts in transactions of 1,000, N/2 updates in
//! transactions of 100, N/10 deletes in transactions of 100, one
//! transaction of N inserts), copies the slot three times, drains the
//! copies with `pg_recvlogical` (protocol 1; protocol 2 with and without
//! `streaming on`), each stopped by a marker committed after the
//! workload, as the streaming reference, then lets wal2iceberg apply the
//! same WAL; the CPU per change of each and of its walsender
//! (`stream.rs`). Then a
//! steady 1,000 transactions per second for the commit-to-visible latency,
//! and a full scan of silver through pyiceberg. The restart phase times a
//! start until streaming with the key index persisted and rebuilt. The s3
//! phase applies the same WAL to a lake on the local disk and to one on S3
//! (s3s-fs when installed, else moto's server) and counts the requests
//! the S3 apply made per table commit.
//!
//! ```sh
//! cargo bench --bench pipeline -- [--rows N] [--phases load,stream,restart,latency,read,s3] [--one-core] [--streaming]
//! ```
//!
//! `--one-core` runs wal2iceberg pinned to one core (`taskset -c 1`), the
//! references as ever: the apply's changes per CPU-second then show what
//! one core does. `--streaming` runs the apply with `--streaming` and
//! compares it with the reference drain that streams too.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wal2iceberg::ops::scratch::{ScratchPostgres, find_bin_dir};

mod ack_relay;
mod latency;
mod s3;
mod s3_server;
mod stream;
use wal2iceberg::pg::config::PgConfig;
use wal2iceberg::pg::source::SourceClient;

const SLOT: &str = "bench";
const PUBLICATION: &str = "wal2iceberg";
/// The slot of a load timed but not kept.
const TRY_SLOT: &str = "bench_try";
/// How often the load and its references are timed.
const LOAD_TRIES: usize = 3;
/// How long a run waits on a quiet stream before it exits; subtracted
/// from its wall time.
const IDLE_EXIT: Duration = Duration::from_millis(500);
/// The peer figure of the issue (a Python sink with psycopg2 and
/// pyiceberg), for context only.
const PEER_CHANGES_PER_SECOND: f64 = 5_000.0;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    rows: u64,
    phases: Vec<String>,
    one_core: bool,
    streaming: bool,
}

fn parse_args() -> BenchResult<Args> {
    let mut args = Args {
        rows: 1_000_000,
        phases: ["load", "stream", "restart", "latency", "read", "s3"]
            .map(String::from)
            .to_vec(),
        one_core: false,
        streaming: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--rows" => args.rows = it.next().ok_or("--rows needs a number")?.parse()?,
            "--phases" => {
                args.phases = it
                    .next()
                    .ok_or("--phases needs a list")?
                    .split(',')
                    .map(str::to_owned)
                    .collect();
            }
            "--one-core" => args.one_core = true,
            "--streaming" => args.streaming = true,
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    if args.rows < 1_000 || !args.rows.is_multiple_of(1_000) {
        return Err("--rows must be a multiple of 1,000".into());
    }
    Ok(args)
}

/// One line of the report: a figure, and its target when it has one.
struct Line {
    what: String,
    value: String,
    target: Option<(String, bool)>,
}

#[derive(Default)]
struct Report {
    lines: Vec<Line>,
}

impl Report {
    fn figure(&mut self, what: &str, value: String) {
        println!("  {what}: {value}");
        self.lines.push(Line {
            what: what.to_owned(),
            value,
            target: None,
        });
    }

    fn check(&mut self, what: &str, value: String, target: String, pass: bool) {
        println!(
            "  {what}: {value} (target {target}: {})",
            if pass { "pass" } else { "FAIL" }
        );
        self.lines.push(Line {
            what: what.to_owned(),
            value,
            target: Some((target, pass)),
        });
    }

    fn print(&self) -> bool {
        println!("\n| figure | value | target | result |\n| --- | --- | --- | --- |");
        for l in &self.lines {
            let (target, result) = match &l.target {
                Some((t, pass)) => (t.as_str(), if *pass { "pass" } else { "FAIL" }),
                None => ("", ""),
            };
            println!("| {} | {} | {target} | {result} |", l.what, l.value);
        }
        self.lines
            .iter()
            .all(|l| l.target.as_ref().is_none_or(|(_, pass)| *pass))
    }
}

struct Bench {
    pg: ScratchPostgres,
    bin: PathBuf,
    url: String,
    client: SourceClient,
    lake: tempfile::TempDir,
    rows: u64,
    /// wal2iceberg runs on one core.
    one_core: bool,
    /// The apply streams large transactions (`--streaming`).
    streaming: bool,
    report: Report,
}

/// What `/usr/bin/time -v` says about a finished command.
struct Timed {
    seconds: f64,
    peak_rss_mb: f64,
    /// User and system CPU, seconds.
    cpu: f64,
    stderr: String,
}

fn timed(command: &mut Command) -> BenchResult<Timed> {
    let start = Instant::now();
    let out = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    let seconds = start.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("{command:?} failed: {stderr}").into());
    }
    let peak_rss_mb = stderr
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .and_then(|kb| kb.trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0);
    Ok(Timed {
        seconds,
        peak_rss_mb,
        cpu: cpu_seconds(&stderr),
        stderr,
    })
}

/// The CPU seconds `/usr/bin/time -v` reports, user and system.
fn cpu_seconds(stderr: &str) -> f64 {
    ["User time (seconds): ", "System time (seconds): "]
        .iter()
        .filter_map(|field| {
            stderr
                .lines()
                .find_map(|l| l.trim().strip_prefix(field))
                .and_then(|s| s.trim().parse::<f64>().ok())
        })
        .sum()
}

fn time_v(program: &Path) -> Command {
    let mut c = Command::new("/usr/bin/time");
    c.arg("-v").arg(program);
    c
}

impl Bench {
    async fn start(args: &Args) -> BenchResult<Bench> {
        let pg = ScratchPostgres::start(
            &[
                ("max_wal_size", "'16GB'"),
                ("shared_buffers", "'1GB'"),
                ("checkpoint_timeout", "'30min'"),
            ],
            &[],
        )?;
        let admin = SourceClient::connect(&PgConfig::parse(&pg.url("postgres"))?).await?;
        admin.batch_execute("CREATE DATABASE bench").await?;
        let url = pg.url("bench");
        let client = SourceClient::connect(&PgConfig::parse(&url)?).await?;
        Ok(Bench {
            bin: find_bin_dir()?,
            pg,
            url,
            client,
            lake: tempfile::Builder::new()
                .prefix("wal2iceberg-bench-")
                .tempdir()?,
            rows: args.rows,
            one_core: args.one_core,
            streaming: args.streaming,
            report: Report::default(),
        })
    }

    fn wal2iceberg(&self, extra: &[&str]) -> Command {
        self.wal2iceberg_into(SLOT, self.lake.path(), extra)
    }

    fn wal2iceberg_into(&self, slot: &str, lake: &Path, extra: &[&str]) -> Command {
        let bin = env!("CARGO_BIN_EXE_wal2iceberg");
        let mut c = if self.one_core {
            let mut c = time_v(Path::new("taskset"));
            c.args(["-c", "1", bin]);
            c
        } else {
            time_v(Path::new(bin))
        };
        self.run_args(&mut c, slot, lake, extra);
        c
    }

    /// wal2iceberg alone, not under `/usr/bin/time`: a signal to time would
    /// leave it running.
    fn wal2iceberg_alone(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"));
        self.run_args(&mut c, SLOT, self.lake.path(), extra);
        c
    }

    fn run_args(&self, c: &mut Command, slot: &str, lake: &Path, extra: &[&str]) {
        c.args(["run", "--source", &self.url, "--tables", "public.orders"])
            .args(["--slot", slot, "--publication", PUBLICATION])
            .args(["--lake", &lake.display().to_string()])
            .args(["--namespace", "bench"])
            .args(extra)
            .env("RUST_LOG", "wal2iceberg=warn");
    }

    fn psql(&self, sql: &str) -> Command {
        let mut c = time_v(&self.bin.join("psql"));
        c.args(["-X", "-q", "-d", &self.url, "-c", sql]);
        c
    }

    async fn sql(&self, sql: &str) -> BenchResult<()> {
        self.client.batch_execute(sql).await?;
        Ok(())
    }

    async fn lsn(&self) -> BenchResult<String> {
        Ok(self
            .client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?
            .get(0))
    }

    async fn create(&self) -> BenchResult<()> {
        let n = self.rows;
        self.sql(&format!(
            "CREATE TABLE orders(id bigint PRIMARY KEY, customer_id int, status text, \
               amount numeric(12,2), note text, created_at timestamptz, updated_at timestamptz);
             INSERT INTO orders SELECT i, (i % 10000)::int, 'new', (i % 100000) / 100.0, \
               'order note ' || i, now(), now() FROM generate_series(1, {n}) i;"
        ))
        .await?;
        self.sql("VACUUM ANALYZE orders").await
    }

    /// COPY through psql into /dev/null, and wal2iceberg's initial load,
    /// each [`LOAD_TRIES`] times in turn, the best of each compared: on a
    /// small shared machine one run of either moves by a third. Every load
    /// but the last goes to a slot and lake of its own, dropped after; the
    /// last one's slot and lake are the stream phase's.
    async fn load(&mut self) -> BenchResult<()> {
        println!("load: {} rows", self.rows);
        let n = self.rows as f64;
        let idle = format!("{}ms", IDLE_EXIT.as_millis());
        let (mut binary, mut text, mut ours) = (f64::MAX, f64::MAX, f64::MAX);
        let mut peer = f64::MAX;
        let mut peak_rss_mb: f64 = 0.0;
        let mut cpu = f64::MAX;
        for attempt in 1..=LOAD_TRIES {
            binary =
                binary.min(timed(&mut self.psql("COPY orders TO STDOUT (FORMAT binary)"))?.seconds);
            text = text.min(timed(&mut self.psql("COPY orders TO STDOUT"))?.seconds);
            peer = peer.min(self.duckdb_load()?);
            let run = if attempt == LOAD_TRIES {
                timed(&mut self.wal2iceberg(&["--exit-when-idle", &idle]))?
            } else {
                let lake = tempfile::Builder::new()
                    .prefix("wal2iceberg-bench-try-")
                    .tempdir()?;
                let run = timed(&mut self.wal2iceberg_into(
                    TRY_SLOT,
                    lake.path(),
                    &["--exit-when-idle", &idle],
                ))?;
                self.sql(&format!("SELECT pg_drop_replication_slot('{TRY_SLOT}')"))
                    .await?;
                run
            };
            ours = ours.min(run.seconds - IDLE_EXIT.as_secs_f64());
            cpu = cpu.min(run.cpu);
            peak_rss_mb = peak_rss_mb.max(run.peak_rss_mb);
        }
        let r = &mut self.report;
        r.figure(
            &format!("COPY binary (psql > /dev/null, best of {LOAD_TRIES})"),
            format!("{:.0} rows/s ({binary:.2} s)", n / binary),
        );
        r.figure(
            &format!("COPY text (psql > /dev/null, best of {LOAD_TRIES})"),
            format!("{:.0} rows/s ({text:.2} s)", n / text),
        );
        r.figure(
            &format!("DuckDB postgres extension into one zstd Parquet file (best of {LOAD_TRIES})"),
            format!("{:.0} rows/s ({peer:.2} s)", n / peer),
        );
        r.figure(
            &format!("wal2iceberg initial load (best of {LOAD_TRIES})"),
            format!("{:.0} rows/s ({ours:.2} s)", n / ours),
        );
        r.figure("load ratio to COPY binary", format!("{:.2}", binary / ours));
        // The peer writes each value once; wal2iceberg writes bronze and
        // silver, the same values twice, and the target holds even so.
        let ratio = peer / ours;
        r.check(
            "load ratio to DuckDB's one file",
            format!("{ratio:.2}"),
            ">= 1.00".into(),
            ratio >= 1.0,
        );
        let per_row = cpu * 1e6 / n;
        r.check(
            "load CPU per row (least of the loads)",
            format!("{per_row:.2} µs ({cpu:.2} s)"),
            "<= 1.00 µs".into(),
            per_row <= 1.0,
        );
        r.check(
            "load peak RSS",
            format!("{peak_rss_mb:.0} MB"),
            "< 300 MB".into(),
            peak_rss_mb < 300.0,
        );
        Ok(())
    }

    /// DuckDB's read of `orders` into one zstd Parquet file, in seconds:
    /// its COPY statement alone (the interpreter's start and the
    /// extension's load are left out, in the peer's favour); the file
    /// must hold every row.
    fn duckdb_load(&self) -> BenchResult<f64> {
        let script = format!("{}/benches/duckdb_load.py", env!("CARGO_MANIFEST_DIR"));
        let folder = tempfile::Builder::new()
            .prefix("wal2iceberg-bench-duckdb-")
            .tempdir()?;
        let file = folder.path().join("orders.parquet");
        let out = Command::new("python3")
            .args([
                &script,
                &self.url,
                "public.orders",
                &file.display().to_string(),
            ])
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "the DuckDB peer failed (python3 needs duckdb and duckdb-extension-postgres: \
                 PATH=$PWD/target/test-python/bin:$PATH): {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let load: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        if load["rows"].as_u64() != Some(self.rows) {
            return Err(format!(
                "the DuckDB peer wrote {} rows of {}",
                load["rows"], self.rows
            )
            .into());
        }
        load["seconds"]
            .as_f64()
            .ok_or_else(|| format!("the DuckDB peer said {load}").into())
    }

    /// Starts on the loaded lake with nothing new to stream, until the
    /// stream runs: with silver's key index persisted at the last clean
    /// stop, and rebuilt from silver's files once the state folder is gone
    /// (each start's wall time less the idle wait before it exits).
    async fn restart(&mut self) -> BenchResult<()> {
        println!("restart: until streaming, the key index persisted and rebuilt");
        let idle = format!("{}ms", IDLE_EXIT.as_millis());
        // A clean stop first, which persists the index.
        timed(&mut self.wal2iceberg(&["--exit-when-idle", &idle]))?;
        let keys: i64 = self
            .client
            .query_one("SELECT count(*) FROM orders", &[])
            .await?
            .get(0);
        let restored = timed(&mut self.wal2iceberg(&["--exit-when-idle", &idle]))?;
        std::fs::remove_dir_all(self.lake.path().join("state"))?;
        let rebuilt = timed(&mut self.wal2iceberg(&["--exit-when-idle", &idle]))?;
        let [restored, rebuilt] =
            [restored.seconds, rebuilt.seconds].map(|s| s - IDLE_EXIT.as_secs_f64());
        let r = &mut self.report;
        r.check(
            &format!("restart until streaming, key index persisted ({keys} keys)"),
            format!("{restored:.1} s"),
            "< 5 s".into(),
            restored < 5.0,
        );
        r.figure(
            "restart until streaming, key index rebuilt from silver",
            format!("{rebuilt:.1} s"),
        );
        Ok(())
    }

    /// A full scan of silver through pyiceberg, against the source count
    /// and against a scan of the same rows written as a fresh table.
    async fn read(&mut self) -> BenchResult<()> {
        println!("read: silver through pyiceberg");
        let expected: i64 = self
            .client
            .query_one("SELECT count(*) FROM orders", &[])
            .await?
            .get(0);
        let script = format!("{}/benches/scan_silver.py", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new("python3")
            .args([
                &script,
                &self.lake.path().display().to_string(),
                "bench.orders",
            ])
            .output()?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
        }
        let scan: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let rows = scan["rows"].as_i64().unwrap_or(-1);
        let r = &mut self.report;
        r.check(
            "silver rows through pyiceberg",
            format!("{rows} in {:.1} s", scan["seconds"].as_f64().unwrap_or(0.0)),
            format!("{expected} (the source)"),
            rows == expected,
        );
        let (seconds, fresh) = (
            scan["seconds"].as_f64().unwrap_or(f64::MAX),
            scan["fresh_seconds"].as_f64().unwrap_or(0.0),
        );
        r.check(
            "silver scan vs the same rows freshly written",
            format!("{seconds:.2} s vs {fresh:.2} s: {:.2}x", seconds / fresh),
            "<= 2x".to_owned(),
            seconds <= 2.0 * fresh,
        );
        r.figure(
            "silver files",
            format!(
                "{} data, {} delete, {:.1} MB",
                scan["data_files"],
                scan["delete_files"],
                scan["bytes"].as_f64().unwrap_or(0.0) / 1e6
            ),
        );
        Ok(())
    }
}

#[tokio::main]
async fn main() -> BenchResult<()> {
    let args = parse_args()?;
    let started = Instant::now();
    let mut bench = Bench::start(&args).await?;
    println!(
        "wal2iceberg benchmark, N = {} ({} cores), PostgreSQL on port {}",
        args.rows,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        bench.pg.port()
    );
    bench.create().await?;
    for phase in &args.phases {
        match phase.as_str() {
            "load" => bench.load().await?,
            "stream" => bench.stream().await?,
            "restart" => bench.restart().await?,
            "latency" => bench.latency().await?,
            "read" => bench.read().await?,
            "s3" => bench.s3().await?,
            other => return Err(format!("unknown phase {other:?}").into()),
        }
    }
    let files = files_written(&bench.lake.path().join("warehouse"));
    bench.report.figure(
        "files written (all tables, data and metadata)",
        format!("{} files, {:.1} MB", files.0, files.1 as f64 / 1e6),
    );
    bench.report.figure(
        "benchmark wall time",
        format!("{:.0} s", started.elapsed().as_secs_f64()),
    );
    if !bench.report.print() {
        std::process::exit(1);
    }
    Ok(())
}

/// Count and bytes of the files under `dir`.
fn files_written(dir: &Path) -> (u64, u64) {
    let mut total = (0, 0);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return total;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            let (n, bytes) = files_written(&path);
            total = (total.0 + n, total.1 + bytes);
        } else if let Ok(meta) = entry.metadata() {
            total = (total.0 + 1, total.1 + meta.len());
        }
    }
    total
}
