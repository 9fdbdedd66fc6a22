//! Crash safety at chosen moments: crashes at the failpoints of
//! src/failpoint.rs, PostgreSQL restarts, an unwritable warehouse and a
//! second writer on the same Iceberg tables. Each scenario ends with the
//! oracle's check (tests/support/oracle.rs): silver equals the source and
//! bronze holds every audited change exactly once.

use std::process::Stdio;
use std::time::Duration;

use wal2iceberg::ops::scratch::{ScratchPostgres, StopMode};

use crate::support::oracle::{NAMESPACE, Oracle};
use crate::support::{TestDb, assert_reconciled, assert_success, cli, pyiceberg, tamper};

/// A crash at the `n`th pass through `point` while the workload runs, then
/// a run that picks up, and the check.
async fn crash_while_streaming(point: &str, n: u32) {
    let mut oracle = Oracle::new(500).await;
    if point == "between-bronze-and-silver" {
        oracle.table_by_table();
    }
    let mut crashing = oracle.spawn_crashing_at(point, n);
    oracle.wait_loaded(&mut crashing).await;
    oracle.start_workload();
    oracle.expect_crash(crashing, point).await;
    oracle.finish().await;
}

#[tokio::test]
async fn a_crash_after_the_data_files_before_the_catalog_commit_loses_and_repeats_nothing() {
    // The load commits bronze and silver at once (1), and so does each
    // streamed batch: this is the fourth batch's.
    crash_while_streaming("before-catalog-commit", 5).await;
}

#[tokio::test]
async fn a_crash_in_a_compaction_before_its_commit_loses_and_repeats_nothing() {
    // New files written, old ones not yet retired: the next run reads the
    // table as it was and compacts again.
    crash_while_streaming("compaction-written", 2).await;
}

#[tokio::test]
async fn a_crash_between_the_bronze_and_silver_commits_loses_and_repeats_nothing() {
    crash_while_streaming("between-bronze-and-silver", 3).await;
}

#[tokio::test]
async fn a_crash_after_the_commits_before_the_confirmation_loses_and_repeats_nothing() {
    crash_while_streaming("before-confirm", 2).await;
}

#[tokio::test]
async fn a_crash_between_the_schema_changes_of_bronze_and_silver_is_finished_by_the_next_run() {
    let mut oracle = Oracle::new(500).await;
    oracle.table_by_table();
    let mut crashing = oracle.spawn_crashing_at("mid-schema-change", 1);
    oracle.wait_loaded(&mut crashing).await;
    oracle.start_workload();
    tokio::time::sleep(Duration::from_millis(500)).await;
    oracle
        .db
        .exec("ALTER TABLE accounts ADD COLUMN rating int DEFAULT 3")
        .await;
    oracle.expect_crash(crashing, "mid-schema-change").await;
    // One writer at a time, so that audit order stays commit order.
    oracle.stop_workload().await;
    oracle.db.exec("UPDATE accounts SET rating = id % 7").await;
    oracle.start_workload();
    // The column came with a default, so silver is resynced once the next
    // run finished the schema change: the reconciliation covers every
    // source column, the new one too.
    oracle.reloaded = true;
    oracle.finish().await;
}

#[tokio::test]
async fn a_crash_during_the_initial_load_shows_readers_nothing_and_the_restart_loads_once() {
    // The crash comes after the second run of rows (64 Ki rows each), once
    // the first ones went to the data file writers.
    let mut oracle = Oracle::new(150_000).await;
    let crashing = oracle.spawn_crashing_at("initial-load", 2);
    oracle.expect_crash(crashing, "initial-load").await;
    assert_eq!(oracle.positions().await, [None, None]);
    for table in ["accounts", "accounts_changes"] {
        let rows = pyiceberg(oracle.lake.path(), &format!("{NAMESPACE}.{table}"), "rows").await;
        assert_eq!(rows.as_array().map(Vec::len), Some(0), "{table}");
    }
    oracle.drain().await;
    oracle.start_workload();
    oracle.finish().await;
}

/// A first run, committing table by table, that crashes after bronze's
/// load commit, before silver's.
async fn crash_between_the_load_commits(oracle: &Oracle) {
    let crashing = oracle
        .command(&["--atomic-commits=false"])
        .env(
            wal2iceberg::failpoint::VARIABLE,
            "between-bronze-and-silver:1",
        )
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    oracle
        .expect_crash(crashing, "between-bronze-and-silver")
        .await;
    let [bronze, silver] = oracle.positions().await;
    assert!(bronze.is_some() && silver.is_none());
}

#[tokio::test]
async fn a_crash_between_the_load_commits_of_bronze_and_silver_loads_silver_again_only() {
    let mut oracle = Oracle::new(500).await;
    crash_between_the_load_commits(&oracle).await;
    // Changes made now come after bronze's load; silver, loaded from it,
    // streams them too.
    oracle.start_workload();
    oracle.finish().await;
}

#[tokio::test]
async fn an_unchanged_toast_update_between_the_load_commits_reaches_bronze_with_its_value() {
    let oracle = Oracle::new(500).await;
    crash_between_the_load_commits(&oracle).await;
    // The notes (6,400 bytes, stored out of line) are left alone by the
    // updates after the first, so the server sends them as unchanged:
    // bronze must show their value, from a silver that starts where it does.
    oracle
        .db
        .exec("UPDATE accounts SET note = repeat(md5(id::text), 200) WHERE id <= 3")
        .await;
    oracle
        .db
        .exec("UPDATE accounts SET balance = balance + 1 WHERE id <= 3")
        .await;
    // Under its old key, the row held the value.
    oracle
        .db
        .exec("UPDATE accounts SET id = 100003 WHERE id = 3")
        .await;
    oracle.drain().await;
    let (changes, _) = oracle.check().await;
    assert_eq!(changes, 7);
}

#[tokio::test]
async fn postgres_restarts_fast_and_immediate_mid_stream_are_survived_by_one_run() {
    let pg = ScratchPostgres::start(&[], &[]).expect("a server of this test's own");
    let mut oracle = Oracle::in_db(TestDb::create_on(&pg).await, 500).await;
    let log = tempfile::NamedTempFile::new().unwrap();
    // Idle for longer than a restart takes: an idle exit meanwhile would
    // end the run before its reconnects.
    let mut run = oracle
        .command(&["--exit-when-idle", "15s"])
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .unwrap();
    oracle.wait_loaded(&mut run).await;
    oracle.start_workload();
    for mode in [StopMode::Fast, StopMode::Immediate, StopMode::Fast] {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        pg.restart(mode).expect("restart the server");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    oracle.stop_workload().await;
    let status = tokio::time::timeout(Duration::from_secs(120), run.wait())
        .await
        .expect("the run ends once the stream is quiet")
        .unwrap();
    let stderr = std::fs::read_to_string(log.path()).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.matches("reconnecting").count() >= 3,
        "each restart is a reconnect: {stderr}"
    );
    oracle.reconnect().await;
    let (changes, _) = oracle.check().await;
    assert!(changes > 0);
}

#[tokio::test]
async fn a_resync_that_finds_no_free_slot_waits_for_one_and_the_run_goes_on() {
    // Room for the run's slot and one more: a resync's temporary slot.
    let pg = ScratchPostgres::start(&[("max_replication_slots", "2")], &[])
        .expect("a server of this test's own");
    let mut oracle = Oracle::in_db(TestDb::create_on(&pg).await, 500).await;
    let mut run = oracle
        .command(&["--exit-when-idle", "600s"])
        .spawn()
        .unwrap();
    oracle.wait_loaded(&mut run).await;
    oracle
        .db
        .exec("SELECT pg_create_logical_replication_slot('squatter', 'pgoutput')")
        .await;
    oracle.start_workload();
    let mut resync = oracle.place_args();
    resync.splice(
        0..0,
        ["resync", "--table", "public.accounts", "--wait", "5m"].map(String::from),
    );
    let resynced = tokio::spawn(async move { cli(&resync).await });

    // The run ends its stream for the resync, finds no slot for the load,
    // and says so while it waits; it neither exits nor resyncs meanwhile.
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while !oracle.run_log().contains("no free replication slot") {
        assert!(std::time::Instant::now() < give_up, "{}", oracle.run_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!resynced.is_finished(), "{}", oracle.run_log());

    // A slot freed, the resync lands and the run streams on.
    oracle
        .db
        .exec("SELECT pg_drop_replication_slot('squatter')")
        .await;
    let out = resynced.await.unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("public.accounts resynced"),
        "{out:?}\n{}",
        oracle.run_log()
    );
    assert!(run.try_wait().unwrap().is_none(), "the run went on");
    run.kill().await.unwrap();
    oracle.reloaded = true;
    let (changes, _) = oracle.finish().await;
    assert!(changes > 0);
}

/// Runs `program` with `args`; it must succeed.
fn shell(program: &str, args: &[&str]) {
    let status = std::process::Command::new(program)
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "{program} {args:?}");
}

#[tokio::test]
async fn an_unwritable_warehouse_stops_the_run_clearly_and_a_restart_loses_nothing() {
    let mut oracle = Oracle::new(500).await;
    let lake = oracle.lake.path().display().to_string();
    // Root ignores file modes: the run goes as the postgres user then.
    let as_root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    let mut command = if as_root {
        shell("chown", &["-R", "postgres:", &lake]);
        let mut c = tokio::process::Command::new("runuser");
        c.args(["-u", "postgres", "--", env!("CARGO_BIN_EXE_wal2iceberg")]);
        c
    } else {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
    };
    let mut run = command
        .args(oracle.run_args())
        .env("RUST_LOG", "wal2iceberg=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    oracle.wait_loaded(&mut run).await;
    oracle.start_workload();
    tokio::time::sleep(Duration::from_secs(1)).await;
    shell("chmod", &["-R", "a-w", &lake]);
    let out = tokio::time::timeout(Duration::from_secs(60), run.wait_with_output())
        .await
        .expect("the run stops")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // Whichever write meets the read-only lake first: a file (permission
    // denied) or, when the mode changes between a commit's metadata file
    // and its catalog swap, the SQLite catalog (a readonly database, or a
    // journal it cannot delete: a disk I/O error).
    assert!(
        (stderr.contains("ermission denied") || stderr.contains("the catalog database refused"))
            && stderr.contains("table"),
        "the error says what and where: {stderr}"
    );
    shell("chmod", &["-R", "u+w", &lake]);
    // The slot may have moved past the lake's last position, but only
    // over WAL without a committed change of the table (a transaction
    // still running, other databases): had it moved past a change the
    // lake lacks, no run could stream it again and the check would fail.
    oracle.finish().await;
}

#[tokio::test]
async fn a_second_writer_on_the_same_tables_makes_commits_retry_and_nothing_is_lost() {
    let mut oracle = Oracle::new(500).await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut run = oracle
        .command(&[])
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .unwrap();
    oracle.wait_loaded(&mut run).await;
    oracle.start_workload();
    let script = format!(
        "{}/tests/support/busy_writer.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let lake = oracle.lake.path().display().to_string();
    let out = tokio::process::Command::new(crate::support::python())
        .args([&script, &lake, "8"])
        .args(["accounts", "accounts_changes"].map(|t| format!("{NAMESPACE}.{t}")))
        .output()
        .await
        .unwrap();
    assert_success(&out);
    let commits: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    oracle.stop_workload().await;
    run.kill().await.unwrap();
    let stderr = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        stderr.contains("commit conflict; retrying"),
        "no commit ever conflicted ({commits}): {stderr}"
    );
    oracle.drain().await;
    oracle.check().await;
}

#[tokio::test]
async fn another_engine_rewriting_silvers_files_under_a_run_makes_it_start_again_and_no_row_returns()
 {
    let mut oracle = Oracle::new(500).await;
    let mut run = oracle.spawn();
    oracle.wait_loaded(&mut run).await;
    oracle.start_workload();
    tokio::time::sleep(Duration::from_secs(2)).await;
    oracle.stop_workload().await;
    // Rows the changes below surely meet (the workload may have ended
    // with a truncate), in silver before another engine moves them.
    let before = oracle.positions().await;
    oracle
        .db
        .exec("INSERT INTO accounts SELECT i, 'late ' || i, i, NULL FROM generate_series(900000, 900299) i")
        .await;
    let give_up = std::time::Instant::now() + Duration::from_secs(120);
    while oracle.positions().await[1] == before[1] {
        assert!(std::time::Instant::now() < give_up, "{}", oracle.run_log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An overwrite of every row with itself replaces silver's files: the
    // rows move, and a delete by their old place would miss them. Then
    // changes of many rows, with no truncate after, while the run streams.
    let lake = oracle.lake.path().to_owned();
    tamper(&lake, &format!("{NAMESPACE}.accounts"), &["touch", "1"]).await;
    oracle
        .db
        .exec(
            "UPDATE accounts SET owner = owner || '!' WHERE id % 3 = 0;
             DELETE FROM accounts WHERE id % 5 = 0;",
        )
        .await;
    // The run's next silver commit meets the rewrite and starts again,
    // however long a loaded machine takes to get there.
    let give_up = std::time::Instant::now() + Duration::from_secs(120);
    while !oracle
        .run_log()
        .contains("another writer rewrote or deleted data files")
    {
        assert!(std::time::Instant::now() < give_up, "{}", oracle.run_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(run.try_wait().unwrap().is_none(), "{}", oracle.run_log());
    run.kill().await.unwrap();
    oracle.drain().await;
    let (changes, _) = oracle.check().await;
    assert!(changes > 0);
}

#[tokio::test]
async fn another_engines_commit_on_top_of_either_table_keeps_its_position_and_nothing_reloads() {
    let mut oracle = Oracle::new(500).await;
    oracle.drain().await;
    let held = oracle.positions().await;
    // Another engine overwrites one key's rows with themselves in both
    // tables: its snapshots carry no wal2iceberg position.
    let lake = oracle.lake.path().to_owned();
    for table in ["accounts", "accounts_changes"] {
        let ident = format!("{NAMESPACE}.{table}");
        tamper(&lake, &ident, &["touch", "7"]).await;
        let summary = pyiceberg(&lake, &ident, "summary").await;
        assert!(
            summary.get("wal2iceberg.end-lsn").is_none(),
            "the current snapshot is the other engine's: {summary}"
        );
    }
    assert_eq!(
        oracle.positions().await,
        held,
        "read through the foreign snapshots"
    );
    // Restarted beside a workload, nothing is loaded again: bronze holds
    // the initial load once.
    oracle.start_workload();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (changes, _) = oracle.finish().await;
    assert!(changes > 0);
}

#[tokio::test]
async fn an_invalidated_slot_stops_the_run_and_the_documented_recovery_reloads() {
    let pg = ScratchPostgres::start(&[("max_slot_wal_keep_size", "'1MB'")], &[])
        .expect("a server of this test's own");
    let oracle = Oracle::in_db(TestDb::create_on(&pg).await, 500).await;
    oracle.drain().await;
    let loaded = oracle.positions().await;
    // Stopped, the slot holds WAL back until PostgreSQL gives up on it.
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    for round in 0.. {
        let first = 100_000 + round * 2_000;
        oracle
            .db
            .exec(&format!(
                "INSERT INTO accounts SELECT i, 'late', 1, NULL FROM generate_series({first}, {first} + 1999) i; \
                 SELECT pg_switch_wal(); CHECKPOINT;"
            ))
            .await;
        let status: Option<String> = oracle
            .db
            .client
            .query_one(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1",
                &[&oracle.slot],
            )
            .await
            .unwrap()
            .get(0);
        if status.as_deref() == Some("lost") {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the slot stayed {status:?}"
        );
    }
    let out = oracle.run_until_idle("1s").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("invalidated") && stderr.contains("new initial load"),
        "{stderr}"
    );
    assert_eq!(oracle.positions().await, loaded, "the lake is untouched");

    // docs/operations.md: remove the cause (a limit this small would
    // invalidate the new slot too, e.g. once autovacuum cleans up after the
    // loop above), drop what the lake holds and load again.
    oracle
        .db
        .exec("ALTER SYSTEM SET max_slot_wal_keep_size = -1")
        .await;
    oracle.db.exec("SELECT pg_reload_conf()").await;
    let mut args = vec!["teardown".to_owned()];
    args.extend(oracle.place_args());
    args.extend(["--tables", "public.accounts", "--drop-tables", "--yes"].map(String::from));
    let teardown = cli(&args).await;
    assert!(
        teardown.status.success(),
        "{}",
        String::from_utf8_lossy(&teardown.stderr)
    );
    oracle.drain().await;
    assert_reconciled(
        &oracle.db,
        "accounts",
        oracle.lake.path(),
        &format!("{NAMESPACE}.accounts"),
    )
    .await;
}

#[tokio::test]
async fn a_second_run_on_the_same_slot_stops_clearly_and_the_first_loses_nothing() {
    let mut oracle = Oracle::new(500).await;
    let mut first = oracle.spawn();
    oracle.wait_loaded(&mut first).await;
    oracle.db.wait_until_active(&oracle.slot).await;
    oracle.start_workload();
    let out = oracle.run_until_idle("1s").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // The preflight, which runs before the lake is touched, finds the slot
    // held; the lake's lock would say the same of the lake.
    assert!(
        stderr.contains(&format!(
            "replication slot {:?} is in use by a wal2iceberg run",
            oracle.slot
        )),
        "the error names the cause, the slot in use: {stderr}"
    );
    assert!(first.try_wait().unwrap().is_none(), "the first run goes on");
    first.kill().await.unwrap();
    oracle.finish().await;
}

#[tokio::test]
async fn a_slot_another_lake_reads_is_refused_and_one_a_crash_left_unloaded_is_taken_up() {
    let mut oracle = Oracle::new(100).await;
    // A crash right after the slot was made, before any row was loaded:
    // the lake's bronze tables recorded the slot before it was made, so
    // the next run takes it up and loads.
    let crashing = oracle.spawn_crashing_at("slot-created", 1);
    oracle.expect_crash(crashing, "slot-created").await;
    assert!(oracle.db.confirmed_flush(&oracle.slot).await.is_some());
    assert_eq!(oracle.positions().await, [None, None], "nothing loaded yet");
    oracle.drain().await;
    assert!(oracle.positions().await.iter().all(Option::is_some));

    // A mistyped slot for the same lake: refused before it makes the slot
    // or records anything, so the lake's own slot still serves it.
    let own = oracle.slot.clone();
    let typo = crate::support::unique("typo");
    oracle.set("--slot", &typo);
    let out = oracle.run_until_idle("1s").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("history from replication slot {own:?}")),
        "{stderr}"
    );
    assert_eq!(oracle.db.confirmed_flush(&typo).await, None);
    oracle.set("--slot", &own);

    // Another lake on the same slot: refused by check and run alike,
    // before anything is made or published, and the slot is not moved.
    oracle
        .db
        .exec("CREATE TABLE other(id int PRIMARY KEY); INSERT INTO other VALUES (1)")
        .await;
    let first_lake = oracle.lake.path().display().to_string();
    let other_lake = tempfile::tempdir().unwrap();
    oracle.set("--lake", &other_lake.path().display().to_string());
    oracle.set("--tables", "public.other");
    let confirmed = oracle.db.confirmed_flush(&oracle.slot).await;
    let refusal = format!(
        "replication slot {:?} exists, and this lake records no table from it",
        oracle.slot
    );
    let mut check = oracle.run_args();
    check[0] = "check".to_owned();
    let out = cli(&check).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout.contains("[slot_not_this_lakes]") && stdout.contains(&refusal),
        "{stdout}"
    );
    let out = oracle.run_until_idle("1s").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&refusal) && stderr.contains("--slot"),
        "{stderr}"
    );
    assert_eq!(oracle.db.confirmed_flush(&oracle.slot).await, confirmed);
    assert_eq!(oracle.db.publishing("other").await, 0, "nothing published");
    assert!(
        !other_lake.path().join("warehouse").exists(),
        "no Iceberg table was made"
    );

    // The first lake goes on from where it was, nothing lost.
    oracle.set("--lake", &first_lake);
    oracle.set("--tables", "public.accounts");
    oracle.start_workload();
    oracle.finish().await;
}

#[tokio::test]
async fn a_claim_that_loses_the_race_for_a_new_slot_is_withdrawn() {
    let mut oracle = Oracle::new(100).await;
    oracle
        .db
        .exec("CREATE TABLE other(id int PRIMARY KEY); INSERT INTO other VALUES (1)")
        .await;
    let first_lake = oracle.lake.path().display().to_string();
    let other_lake = tempfile::tempdir().unwrap();
    oracle.set("--lake", &other_lake.path().display().to_string());
    oracle.set("--tables", "public.other");
    // The other lake claims the slot, then waits before making it ...
    let late = oracle
        .command(&[])
        .env(wal2iceberg::failpoint::STALL_VARIABLE, "slot-create:20000")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let claimed = other_lake
        .path()
        .join("warehouse")
        .join(NAMESPACE)
        .join("other_changes");
    let give_up = std::time::Instant::now() + Duration::from_secs(120);
    while !claimed.exists() {
        assert!(
            std::time::Instant::now() < give_up,
            "the claim was never made"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ... while the first lake makes it and loads.
    oracle.set("--lake", &first_lake);
    oracle.set("--tables", "public.accounts");
    oracle.drain().await;
    let out = late.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("was made by another run while this one started")
            && stderr.contains("claim on it (its new, empty tables) was withdrawn"),
        "{stderr}"
    );
    assert!(!claimed.exists(), "the claim's tables are gone");
    // Its next run is refused as on any slot that is another lake's.
    oracle.set("--lake", &other_lake.path().display().to_string());
    oracle.set("--tables", "public.other");
    let out = oracle.run_until_idle("1s").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("this lake records no table from it"),
        "{stderr}"
    );
    oracle.set("--lake", &first_lake);
    oracle.set("--tables", "public.accounts");
    oracle.start_workload();
    oracle.finish().await;
}

#[tokio::test]
async fn a_second_run_on_a_held_lake_refuses_before_it_creates_a_slot() {
    let mut oracle = Oracle::new(100).await;
    let mut first = oracle.spawn();
    oracle.wait_loaded(&mut first).await;
    oracle.db.wait_until_active(&oracle.slot).await;
    // Another table, so that nothing of the lake stops the second run
    // before it would create its slot and publish its table.
    oracle
        .db
        .exec("CREATE TABLE other(id int PRIMARY KEY)")
        .await;
    let first_slot = oracle.slot.clone();
    let other = crate::support::unique("other");
    oracle.set("--slot", &other);
    oracle.set("--tables", "public.other");
    let out = oracle.run_until_idle("1s").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("another wal2iceberg process") && stderr.contains("lock"),
        "the error names the lake's lock: {stderr}"
    );
    assert_eq!(
        oracle.db.confirmed_flush(&other).await,
        None,
        "no slot {other} was created"
    );
    let published: i64 = oracle
        .db
        .client
        .query_one(
            "SELECT count(*) FROM pg_publication_tables WHERE tablename = 'other'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(published, 0, "no publication gained the table");
    assert!(first.try_wait().unwrap().is_none(), "the first run goes on");
    first.kill().await.unwrap();
    oracle.set("--slot", &first_slot);
    oracle.set("--tables", "public.accounts");
    oracle.start_workload();
    oracle.finish().await;
}
