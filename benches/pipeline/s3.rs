//! The s3 phase: the same workload applied to a lake on the local disk
//! and to one on S3, and the requests the S3 apply sent per commit.

use std::path::Path;

use crate::s3_server::S3Server;
use crate::{Bench, BenchResult, IDLE_EXIT, timed};

impl Bench {
    /// N/2 inserts in transactions of 1,000 and N/4 updates in
    /// transactions of 100 applied by two lakes, each loaded first on a
    /// slot of its own: one on the local disk, one on S3. The S3 apply's
    /// speed against the local one, and the requests it sent per table
    /// commit (each commit writes one `metadata.json`), from the S3
    /// server's log.
    pub(crate) async fn s3(&mut self) -> BenchResult<()> {
        let n = (self.rows / 2_000).max(1) * 1_000;
        println!(
            "s3: {n} inserts and {} updates, local lake and S3 lake",
            n / 2
        );
        let server = S3Server::start()?;
        server.create_bucket("bench").await?;
        let local = tempfile::Builder::new()
            .prefix("wal2iceberg-bench-local-")
            .tempdir()?;
        let remote = tempfile::Builder::new()
            .prefix("wal2iceberg-bench-s3-")
            .tempdir()?;
        let endpoint = format!("s3.endpoint=http://{}", server.addr);
        let on_s3 = [
            "--warehouse",
            "s3://bench/lake",
            "--catalog-property",
            &endpoint,
            "--catalog-property",
            "s3.access-key-id=bench",
            "--catalog-property",
            "s3.secret-access-key=bench",
        ];
        let idle = format!("{}ms", IDLE_EXIT.as_millis());
        let lakes: [(&str, &Path, &[&str]); 2] = [
            ("bench_s3_local", local.path(), &[]),
            ("bench_s3_remote", remote.path(), &on_s3),
        ];
        for (slot, lake, extra) in lakes {
            let args = [&["--exit-when-idle", idle.as_str()][..], extra].concat();
            timed(&mut self.wal2iceberg_into(slot, lake, &args))?;
        }
        let max_id: i64 = self
            .client
            .query_one("SELECT coalesce(max(id), 0) FROM orders", &[])
            .await?
            .get(0);
        self.sql(&format!(
            "DO $$ DECLARE b bigint; BEGIN
               FOR b IN 0 .. {n} / 1000 - 1 LOOP
                 INSERT INTO orders SELECT {max_id} + b * 1000 + i, (i % 10000)::int, 'new',
                   i / 100.0, 'order note ' || i, now(), now() FROM generate_series(1, 1000) i;
                 COMMIT;
               END LOOP;
               FOR b IN 0 .. {n} / 2 / 100 - 1 LOOP
                 UPDATE orders SET status = 'paid', amount = amount + 1, updated_at = now()
                   WHERE id IN (SELECT {max_id} + b * 100 + i FROM generate_series(1, 100) i);
                 COMMIT;
               END LOOP;
             END $$;"
        ))
        .await?;
        let apply = |slot: &str, lake: &Path, extra: &[&str]| -> BenchResult<f64> {
            let args = [&["--exit-when-idle", idle.as_str()][..], extra].concat();
            let run = timed(&mut self.wal2iceberg_into(slot, lake, &args))?;
            Ok(run.seconds - IDLE_EXIT.as_secs_f64())
        };
        let local_seconds = apply(lakes[0].0, lakes[0].1, lakes[0].2)?;
        let before = (server.requests()?, server.cpu_seconds()?);
        let s3_seconds = apply(lakes[1].0, lakes[1].1, lakes[1].2)?;
        let after = (server.requests()?, server.cpu_seconds()?);
        let (all, commits) = (after.0.0 - before.0.0, after.0.1 - before.0.1);
        let server_cpu = after.1 - before.1;
        for (slot, _, _) in lakes {
            self.sql(&format!("SELECT pg_drop_replication_slot('{slot}')"))
                .await?;
        }
        let seconds = [local_seconds, s3_seconds];
        let changes = (n + n / 2) as f64;
        let on_s3 = format!("on S3 ({})", server.name());
        let r = &mut self.report;
        for (what, s) in [("on the local disk", seconds[0]), (&on_s3, seconds[1])] {
            r.figure(
                &format!("apply, lake {what}"),
                format!("{:.0} changes/s ({s:.1} s)", changes / s),
            );
        }
        let ratio = seconds[0] / seconds[1];
        r.check(
            "S3 apply speed against the local lake's",
            format!("{ratio:.2}"),
            ">= 0.80".into(),
            ratio >= 0.8,
        );
        r.figure(
            "S3 server's CPU during the S3 apply (it shares the cores)",
            format!("{server_cpu:.1} s"),
        );
        r.figure(
            "a 4 KB GET on a kept-alive connection, mean (see ack_relay.rs)",
            match server.round_trips() {
                Ok((relayed, direct)) => {
                    format!("{relayed:.1} ms as used, {direct:.1} ms without the relay")
                }
                Err(e) => format!("not measured (curl 7.75 or later signs requests): {e}"),
            },
        );
        r.figure(
            "object-store requests per table commit (S3 apply)",
            format!(
                "{:.1} ({all} requests, {commits} table commits)",
                all as f64 / commits.max(1) as f64
            ),
        );
        Ok(())
    }
}
