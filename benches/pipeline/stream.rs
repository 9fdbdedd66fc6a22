//! The stream phase: the workload into the slot, PostgreSQL's own drain
//! of it as the reference, then wal2iceberg's apply of the same WAL, with
//! the CPU each side spent per change.
//!
//! The reference is `pg_recvlogical --endpos` on a copy of the slot. Left
//! alone at the end position, it would wait for the server's next message
//! after its last change, which is no part of draining; so a marker
//! transaction (a transactional logical message) is committed after the
//! end position, and the drain stops on its first byte. That it measures
//! the drain alone shows in the same run: its output goes to a file in
//! memory, whose modification time is when the last change arrived, and
//! the check below holds the drain's wall time within 10 % of that.
//!
//! The walsender's CPU is read from the postmaster's `/proc/<pid>/stat`:
//! its reaped children's time (`cutime`, `cstime`) grows by the
//! walsender's whole CPU when a drain's walsender exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use crate::{Bench, BenchResult, IDLE_EXIT, PEER_CHANGES_PER_SECOND, PUBLICATION, SLOT, timed};

/// The marker's logical message prefix; wal2iceberg ignores it.
const MARKER: &str = "SELECT pg_logical_emit_message(true, 'wal2iceberg-bench.end', '')";
/// How far a drain's wall time may run past its last change.
const DRAIN_SLACK: f64 = 0.10;

/// One drain of the slot by `pg_recvlogical`.
struct Drain {
    /// From start to exit.
    seconds: f64,
    /// From start to the last byte written.
    last_byte: f64,
    /// The walsender's CPU.
    walsender_cpu: f64,
}

/// The CPU of the postmaster's children that ended (seconds).
struct ChildrenCpu {
    stat: PathBuf,
    tick: f64,
}

impl ChildrenCpu {
    fn of(data_dir: &Path) -> BenchResult<ChildrenCpu> {
        let pid_file = std::fs::read_to_string(data_dir.join("postmaster.pid"))?;
        let pid = pid_file.lines().next().ok_or("postmaster.pid is empty")?;
        let tick = Command::new("getconf").arg("CLK_TCK").output()?;
        Ok(ChildrenCpu {
            stat: PathBuf::from(format!("/proc/{}/stat", pid.trim())),
            tick: String::from_utf8_lossy(&tick.stdout).trim().parse()?,
        })
    }

    /// `cutime + cstime`, fields 16 and 17 of the stat line (after the
    /// command's name in parentheses, fields 3 onwards).
    fn seconds(&self) -> BenchResult<f64> {
        let stat = std::fs::read_to_string(&self.stat)?;
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .ok_or("a stat line without a command")?
            .1
            .split_whitespace()
            .collect();
        let ticks: u64 = fields[13].parse::<u64>()? + fields[14].parse::<u64>()?;
        Ok(ticks as f64 / self.tick)
    }

    /// The children's CPU spent while `f` ran; waits for the postmaster
    /// to reap a walsender that ended with it.
    fn spent<T>(&self, f: impl FnOnce() -> BenchResult<T>) -> BenchResult<(T, f64)> {
        let before = self.seconds()?;
        let out = f()?;
        std::thread::sleep(Duration::from_millis(500));
        Ok((out, self.seconds()? - before))
    }
}

impl Bench {
    /// The workload into the slot, the references, then wal2iceberg.
    pub(crate) async fn stream(&mut self) -> BenchResult<()> {
        let n = self.rows;
        let changes = n + n / 2 + n / 10 + n;
        println!("stream: {changes} changes");
        let slot = self
            .client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .await?;
        if slot.is_none() {
            return Err("the stream phase needs the load phase before it".into());
        }
        let started = std::time::Instant::now();
        self.sql(
            "CREATE PROCEDURE bench_workload(n bigint) LANGUAGE plpgsql AS $$
             DECLARE b bigint;
             BEGIN
               FOR b IN 0 .. n / 1000 - 1 LOOP
                 INSERT INTO orders SELECT n + b * 1000 + i, (i % 10000)::int, 'new', i / 100.0,
                   'order note ' || i, now(), now() FROM generate_series(1, 1000) i;
                 COMMIT;
               END LOOP;
               FOR b IN 0 .. n / 2 / 100 - 1 LOOP
                 UPDATE orders SET status = 'paid', amount = amount + 1, updated_at = now()
                   WHERE id IN (SELECT ((b * 100 + i) * 1000003) % (2 * n) + 1 FROM generate_series(0::bigint, 99) i);
                 COMMIT;
               END LOOP;
               FOR b IN 0 .. n / 10 / 100 - 1 LOOP
                 DELETE FROM orders
                   WHERE id IN (SELECT ((b * 100 + i) * 999983) % (2 * n) + 1 FROM generate_series(0::bigint, 99) i);
                 COMMIT;
               END LOOP;
               INSERT INTO orders SELECT 2 * n + i, (i % 10000)::int, 'bulk', i / 100.0,
                 'bulk note ' || i, now(), now() FROM generate_series(1, n) i;
               COMMIT;
             END $$;",
        )
        .await?;
        // Alone, so that the procedure may commit.
        self.sql(&format!("CALL bench_workload({n})")).await?;
        let end = self.lsn().await?;
        println!(
            "  (workload written in {:.1} s, up to {end})",
            started.elapsed().as_secs_f64()
        );
        // The cleanup the workload calls for runs now, so that autovacuum
        // and the checkpointer share the cores with none of the runs below.
        self.sql("VACUUM ANALYZE orders").await?;
        self.sql("CHECKPOINT").await?;
        self.sql(MARKER).await?;
        let cpu = ChildrenCpu::of(&self.pg.data_dir())?;
        let mut references = Vec::new();
        for (name, options) in [
            ("pg_recvlogical, protocol 1", &["proto_version=1"][..]),
            (
                "pg_recvlogical, protocol 2, streaming on",
                &["proto_version=2", "streaming=on"][..],
            ),
            ("pg_recvlogical, protocol 2", &["proto_version=2"][..]),
        ] {
            let copy = format!("bench_ref_{}", references.len());
            self.sql(&format!(
                "SELECT pg_copy_logical_replication_slot('{SLOT}', '{copy}')"
            ))
            .await?;
            let drain = self.drain(&copy, &end, options, &cpu)?;
            self.sql(&format!("SELECT pg_drop_replication_slot('{copy}')"))
                .await?;
            let r = &mut self.report;
            r.figure(
                name,
                format!(
                    "{:.0} changes/s ({:.1} s; walsender CPU {:.1} s, {:.2} µs a change)",
                    changes as f64 / drain.seconds,
                    drain.seconds,
                    drain.walsender_cpu,
                    drain.walsender_cpu * 1e6 / changes as f64
                ),
            );
            let past = drain.seconds / drain.last_byte - 1.0;
            r.check(
                &format!("{name}: wall time past its last change"),
                format!("{:.1} % ({:.2} s)", past * 100.0, drain.last_byte),
                format!("<= {:.0} %", DRAIN_SLACK * 100.0),
                past <= DRAIN_SLACK,
            );
            references.push(drain);
        }
        let idle = format!("{}ms", IDLE_EXIT.as_millis());
        let mut run = vec!["--exit-when-idle", &idle];
        // The reference drain with wal2iceberg's options.
        let (same_options, label) = if self.streaming {
            run.push("--streaming");
            (1, "wal2iceberg streaming apply (protocol 2, streaming on)")
        } else {
            (2, "wal2iceberg streaming apply (protocol 2)")
        };
        let (ours, walsender_cpu) = cpu.spent(|| timed(&mut self.wal2iceberg(&run)))?;
        let seconds = ours.seconds - IDLE_EXIT.as_secs_f64();
        let rate = changes as f64 / seconds;
        let our_cpu = ours.cpu;
        let per_change = |cpu: f64| cpu * 1e6 / changes as f64;
        let r = &mut self.report;
        r.figure(
            label,
            format!(
                "{rate:.0} changes/s ({seconds:.1} s; CPU {our_cpu:.1} s, {:.2} µs a change; its walsender {walsender_cpu:.1} s, {:.2} µs a change)",
                per_change(our_cpu),
                per_change(walsender_cpu)
            ),
        );
        r.figure(
            "apply changes per CPU-second (one core's worth)",
            format!(
                "{:.0}{}",
                changes as f64 / our_cpu,
                if self.one_core {
                    " (pinned to one core)"
                } else {
                    ""
                }
            ),
        );
        r.figure(
            "apply CPU per change / its own walsender's",
            format!("{:.2}", our_cpu / walsender_cpu),
        );
        let same = references[same_options].seconds / seconds;
        r.check(
            "apply ratio to pg_recvlogical (same options)",
            format!("{same:.2}"),
            ">= 0.95".into(),
            same >= 0.95,
        );
        r.figure(
            "apply ratio to pg_recvlogical protocol 1",
            format!("{:.2}", references[0].seconds / seconds),
        );
        r.figure(
            "apply ratio to pg_recvlogical protocol 2 streaming",
            format!("{:.2}", references[1].seconds / seconds),
        );
        // Against the walsender of the same options' drain: one whose
        // client reads as fast as it sends, as wal2iceberg's would on
        // enough cores. (Its own walsender, whose client reads slower,
        // spends less: it sends fuller buffers in fewer calls.)
        let cpu_ratio = our_cpu / references[same_options].walsender_cpu;
        r.check(
            "apply CPU per change / the walsender's (same options)",
            format!("{cpu_ratio:.2}"),
            "<= 1.00".into(),
            cpu_ratio <= 1.0,
        );
        let peer = rate / PEER_CHANGES_PER_SECOND;
        r.check(
            "speed-up over a Python sink (5,000 changes/s, quoted)",
            format!("{peer:.1}x"),
            ">= 20x".into(),
            peer >= 20.0,
        );
        r.check(
            "apply peak RSS",
            format!("{:.0} MB", ours.peak_rss_mb),
            "< 300 MB".into(),
            ours.peak_rss_mb < 300.0,
        );
        if ours.stderr.contains("ERROR") {
            return Err(format!("wal2iceberg reported errors: {}", ours.stderr).into());
        }
        Ok(())
    }

    /// `pg_recvlogical` drains the slot `copy` up to `end` with `options`,
    /// stopping on the marker after it; its output goes to a file in
    /// memory, which shows when the last change arrived.
    fn drain(
        &self,
        copy: &str,
        end: &str,
        options: &[&str],
        cpu: &ChildrenCpu,
    ) -> BenchResult<Drain> {
        let shm = Path::new("/dev/shm");
        let folder = if shm.is_dir() {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        };
        let output = tempfile::Builder::new()
            .prefix("wal2iceberg-bench-drain-")
            .tempfile_in(folder)?;
        let mut c = Command::new(self.bin.join("pg_recvlogical"));
        c.args(["-d", &self.url, "--slot", copy, "--start", "-E", end])
            .arg("-f")
            .arg(output.path())
            .args(["--no-loop", "-o", "messages=true"])
            .args(["-o", &format!("publication_names={PUBLICATION}")]);
        for o in options {
            c.args(["-o", o]);
        }
        let started = SystemTime::now();
        let (seconds, walsender_cpu) = cpu.spent(|| {
            let out = c.stdout(Stdio::null()).stderr(Stdio::piped()).output()?;
            if !out.status.success() {
                let stderr = String::from_utf8_lossy(&out.stderr);
                return Err(format!("{c:?} failed: {stderr}").into());
            }
            Ok(started.elapsed()?.as_secs_f64())
        })?;
        let last_byte = output
            .as_file()
            .metadata()?
            .modified()?
            .duration_since(started)?
            .as_secs_f64();
        Ok(Drain {
            seconds,
            last_byte,
            walsender_cpu,
        })
    }
}
