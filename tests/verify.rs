//! `wal2iceberg verify`: equal while a writer and a run go on, a stop when
//! the lake lacks changes no run applies, and the key named when silver is
//! changed behind the tool's back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wal2iceberg::apply::run;
use wal2iceberg::failpoint::STALL_VARIABLE;
use wal2iceberg::pg::source::SourceClient;

use crate::support::oracle::{NAMESPACE, Oracle};
use crate::support::*;

/// `verify` with the oracle's settings: exit code, stdout, stderr.
async fn verify(oracle: &Oracle) -> (i32, String, String) {
    verify_stalled(oracle, None).await
}

/// [`verify`] with the stall points `stall` ([`STALL_VARIABLE`]).
async fn verify_stalled(oracle: &Oracle, stall: Option<&str>) -> (i32, String, String) {
    let mut args = oracle.run_args();
    args[0] = "verify".to_owned();
    args.extend(["--wait", "60s"].map(String::from));
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"));
    command.args(&args).env("RUST_LOG", "wal2iceberg=warn");
    if let Some(stall) = stall {
        command.env(STALL_VARIABLE, stall);
    }
    let out = command.output().await.unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The rows of the report's line that starts with `side` (`source`,
/// `silver`), and whether it ends equal.
fn line<'a>(report: &'a str, side: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{side} ")))
        .unwrap_or_else(|| panic!("no {side} line in {report}"))
}

fn rows(line: &str) -> u64 {
    let (_, after) = line.split_once(": ").unwrap();
    after.split(' ').next().unwrap().parse().unwrap()
}

/// A command with `args` at the oracle's source, slot, lake and namespace.
async fn at_oracle(oracle: &Oracle, args: &[&str]) -> std::process::Output {
    let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    all.extend(oracle.place_args());
    cli(&all).await
}

/// Waits until the oracle's run has ended its stream to start over (the
/// slot idle).
async fn wait_for_start_over(oracle: &Oracle) {
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while oracle.db.active_pid(&oracle.slot).await.is_some() {
        assert!(
            std::time::Instant::now() < give_up,
            "the run never started over:\n{}",
            oracle.run_log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn tamper_accounts(oracle: &Oracle, args: &[&str]) {
    tamper(oracle.lake.path(), &format!("{NAMESPACE}.accounts"), args).await;
}

#[tokio::test]
async fn verify_holds_while_writers_go_on_and_names_the_keys_a_tamper_changed() {
    let mut oracle = Oracle::new(500).await;
    // Snapshots stay an hour here: verify reads bronze and silver while
    // the run commits, and a read needs its snapshot's files.
    oracle.set("--snapshot-retention", "1h");
    let mut run = oracle.spawn();
    oracle.wait_loaded(&mut run).await;
    oracle.start_workload();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (code, report, stderr) = verify(&oracle).await;
    assert_eq!(code, 0, "{report}{stderr}");
    assert!(report.contains("the lake matches the source"), "{report}");
    let source = line(&report, "source");
    assert!(source.ends_with(": equal"), "{report}");
    assert!(line(&report, "silver").ends_with(": equal"), "{report}");
    let busy = oracle.transactions();
    assert!(busy > 0, "the writer committed nothing");

    oracle.stop_workload().await;
    run.kill().await.unwrap();
    oracle.drain().await;
    // Two rows no run applies: verify cannot vouch for the lake and says so.
    let (gone, changed) = (1_000_000_000i64, 1_000_000_001i64);
    oracle
        .db
        .client
        .batch_execute(&format!(
            "INSERT INTO accounts VALUES ({gone}, 'to delete', 1, NULL), ({changed}, 'to change', 2, NULL)"
        ))
        .await
        .unwrap();
    let (code, report, stderr) = verify(&oracle).await;
    assert_ne!(code, 0, "{report}");
    assert!(
        stderr.contains("the lake lacks 2 changes") && stderr.contains("wal2iceberg run"),
        "{stderr}"
    );

    // Applied, and no run on the slot: the idle slot shows nothing is missing.
    oracle.drain().await;
    let (code, report, stderr) = verify(&oracle).await;
    assert_eq!(code, 0, "{report}{stderr}");
    let live: i64 = oracle
        .db
        .client
        .query_one("SELECT count(*) FROM accounts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows(line(&report, "source")), live as u64, "{report}");
    assert_eq!(rows(line(&report, "silver")), live as u64, "{report}");

    // A change the slot holds of a table the publication also publishes,
    // which the lake does not replicate: not one the lake lacks.
    oracle
        .db
        .exec(
            "CREATE TABLE elsewhere(id int PRIMARY KEY);
             ALTER PUBLICATION wal2iceberg ADD TABLE elsewhere;
             INSERT INTO elsewhere VALUES (1);",
        )
        .await;
    let (code, report, stderr) = verify(&oracle).await;
    assert_eq!(code, 0, "{report}{stderr}");
    // DDL the slot holds and no run took up: the lake is behind, not wrong.
    oracle
        .db
        .exec("ALTER TABLE accounts ADD COLUMN extra int DEFAULT 7")
        .await;
    let (code, report, stderr) = verify(&oracle).await;
    assert_ne!(code, 0, "{report}");
    assert!(stderr.contains("the lake lacks 1 changes"), "{stderr}");
    oracle.drain().await;
    let (code, report, stderr) = verify(&oracle).await;
    assert_eq!(code, 0, "{report}{stderr}");

    // Silver changed behind the tool's back, each change hidden under the
    // position silver had: bronze and the source still agree, silver not.
    tamper_accounts(&oracle, &["delete", &gone.to_string()]).await;
    tamper_accounts(
        &oracle,
        &["rewrite", &changed.to_string(), "owner", "tampered"],
    )
    .await;
    let (code, report, stderr) = verify(&oracle).await;
    assert_eq!(code, 1, "{report}{stderr}");
    assert!(line(&report, "source").ends_with(": equal"), "{report}");
    assert!(
        line(&report, "silver").ends_with(": 2 keys differ"),
        "{report}"
    );
    assert!(
        report.contains(&format!("id={gone}: in bronze only")),
        "{report}"
    );
    assert!(
        report.contains(&format!("id={changed}: values differ")),
        "{report}"
    );
    assert!(
        report.contains("the lake DIFFERS from the source"),
        "{report}"
    );
}

/// A verify whose snapshot comes between a column added with a default
/// and the run's reload for it (held up by the stall point `restart`),
/// and that reaches its comparison only once the reload is done (stall
/// point `verify`): bronze at the snapshot's position holds the rows
/// without the default, which come with the reload after it, so verify
/// goes again from a new snapshot and finds the lake equal.
#[tokio::test]
async fn a_verify_whose_snapshot_precedes_a_finished_reload_verifies_again() {
    let oracle = Oracle::new(200).await;
    oracle.drain().await;
    let mut run = oracle
        .command(&[])
        .env(STALL_VARIABLE, "restart:3000")
        .spawn()
        .unwrap();
    oracle.db.wait_until_active(&oracle.slot).await;
    oracle
        .db
        .exec("ALTER TABLE accounts ADD COLUMN tier int DEFAULT 7")
        .await;
    wait_for_start_over(&oracle).await;
    let (code, report, stderr) = verify_stalled(&oracle, Some("verify:8000")).await;
    assert_eq!(
        code,
        0,
        "{report}{stderr}\nthe run logged:\n{}",
        oracle.run_log()
    );
    assert!(
        stderr.contains("bronze holds a load read after"),
        "{stderr}"
    );
    assert!(line(&report, "source").ends_with(": equal"), "{report}");
    assert!(run.try_wait().unwrap().is_none(), "the run went on");
    run.kill().await.unwrap();
}

/// A run keeps the lake's writer lock from its first start to its end:
/// between two starts (here the one a resync asks for, held by the stall
/// point `restart`), a drop-table is refused as while it streams.
#[tokio::test]
async fn a_run_between_two_starts_keeps_the_lake_locked() {
    let mut oracle = Oracle::new(100).await;
    oracle.add_other_table().await;
    oracle.drain().await;
    let mut run = oracle
        .command(&[])
        .env(STALL_VARIABLE, "restart:30000")
        .spawn()
        .unwrap();
    oracle.db.wait_until_active(&oracle.slot).await;
    oracle.start_workload();
    assert_success(&at_oracle(&oracle, &["resync", "--table", "public.accounts"]).await);
    wait_for_start_over(&oracle).await;
    let out = at_oracle(&oracle, &["drop-table", "--table", "public.other", "--yes"]).await;
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lock"),
        "{out:?}"
    );
    assert!(run.try_wait().unwrap().is_none(), "the run went on");
    run.kill().await.unwrap();
    oracle.reloaded = true;
    oracle.finish().await;
}

#[tokio::test]
async fn resync_beside_a_running_run_under_writes_repairs_a_tampered_silver_and_loses_nothing() {
    let mut oracle = Oracle::new(500).await;
    oracle.set("--snapshot-retention", "1h");
    oracle.add_other_table().await;
    oracle.drain().await;
    // Silver wrong behind the tool's back: one row gone, one changed.
    tamper_accounts(&oracle, &["delete", "7"]).await;
    tamper_accounts(&oracle, &["rewrite", "8", "owner", "tampered"]).await;
    let (code, report, _) = verify(&oracle).await;
    assert_eq!(code, 1, "{report}");

    // Resynced while a run streams and the writer goes on; the run ends
    // its stream between two transactions, loads the table again, and
    // streams on.
    let mut run = oracle.spawn();
    oracle.db.wait_until_active(&oracle.slot).await;
    oracle.start_workload();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = at_oracle(
        &oracle,
        &["resync", "--table", "public.accounts", "--wait", "120s"],
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("public.accounts resynced"),
        "{out:?}\nthe runs logged:\n{}",
        oracle.run_log()
    );
    // drop-table beside it is refused: the run would apply the table again.
    let drop_other = ["drop-table", "--table", "public.other", "--yes"];
    let out = at_oracle(&oracle, &drop_other).await;
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lock"),
        "{out:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(run.try_wait().unwrap().is_none(), "the run went on");
    run.kill().await.unwrap();
    oracle.reloaded = true;
    let (changes, _) = oracle.finish().await;
    assert!(changes > 0);

    // Stopped, drop-table takes `other` out with its files; the rest stays
    // verified.
    let out = at_oracle(&oracle, &drop_other).await;
    assert_success(&out);
    let other = oracle.lake.path().join(format!("warehouse/{NAMESPACE}"));
    let left: Vec<String> = std::fs::read_dir(&other)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("other"))
        .collect();
    assert!(
        left.is_empty(),
        "files of the dropped table remain: {left:?}"
    );
    oracle.set("--tables", "public.accounts");
    let (code, report, stderr) = verify(&oracle).await;
    assert_eq!(code, 0, "{report}{stderr}");

    // What cannot be resynced is refused, naming why.
    let out = at_oracle(&oracle, &["resync", "--table", "public.nosuch"]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the lake does not hold it"),
        "{out:?}"
    );
}

/// A start that meets its slot held by a SQL function reading it waits
/// for it: `verify` peeks a slot no run streams, which a run restarting
/// (for a resync, or after a lost connection) leaves for a moment. Here
/// peeks come one after another while the run starts: the run neither
/// ends nor reports the slot in use, and takes every change.
#[tokio::test]
async fn a_start_meeting_its_slot_read_by_a_sql_function_waits_for_it() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE orders(id int PRIMARY KEY, qty int);
         INSERT INTO orders SELECT g, g FROM generate_series(1, 100) g;
         CREATE TABLE noise(id serial PRIMARY KEY, v text);",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("peeked");
    let options = run_options(&db, &["orders"], &slot, dir.path());
    run(&db.config, &options).await.unwrap();
    // WAL each peek decodes for a while, and changes for the run to take.
    db.exec("INSERT INTO noise(v) SELECT repeat('n', 100) FROM generate_series(1, 100000)")
        .await;
    db.exec("UPDATE orders SET qty = qty + 1 WHERE id <= 50")
        .await;

    let stop = Arc::new(AtomicBool::new(false));
    let peeker = {
        let (config, slot, stop) = (db.config.clone(), slot.clone(), stop.clone());
        let publication = options.capture.publication.clone();
        tokio::spawn(async move {
            let client = SourceClient::connect(&config).await.unwrap();
            let mut peeks = 0;
            while !stop.load(Ordering::SeqCst) {
                // Refused while the run streams from the slot.
                let peeked = client
                    .query(
                        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, \
                         NULL, 'proto_version', '1', 'publication_names', $2)",
                        &[&slot, &publication],
                    )
                    .await;
                peeks += usize::from(peeked.is_ok());
            }
            peeks
        })
    };
    while db.active_pid(&slot).await.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let running = {
        let (config, options) = (
            db.config.clone(),
            run_options(&db, &["orders"], &slot, dir.path()),
        );
        tokio::spawn(async move { run(&config, &options).await })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::SeqCst);
    let peeks = peeker.await.unwrap();
    assert!(peeks >= 2, "{peeks} peeks");
    let report = running.await.unwrap().expect("the run waited for the slot");
    assert_eq!(report.changes_applied, 50, "{report:?}");
    let verified = verify_lake(&db, &slot, dir.path(), "public.orders").await;
    assert_success(&verified);
}
