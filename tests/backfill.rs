//! The chunked backfill (docs/backfill.md): a table read in key-range
//! chunks beside the stream, each in a short transaction of its own,
//! checked by the audit-trigger oracle while a random workload writes.

use std::time::Duration;

use rand::{Rng, SeedableRng};

use crate::support::oracle::Oracle;
use crate::support::{assert_success, verify_lake};

/// The oracle's checks, and `verify`: bronze replayed, and silver, each
/// equal to the source (a read of a key changed inside its chunk's
/// window must not restate it in bronze after those changes).
async fn check(oracle: &mut Oracle) {
    let (changes, rows) = oracle.finish().await;
    assert!(changes > 50, "the workload ran: {changes} changes");
    assert!(rows > 0, "rows are left");
    let verified = verify_lake(
        &oracle.db,
        &oracle.slot,
        oracle.lake.path(),
        "public.accounts",
    )
    .await;
    assert_success(&verified);
}

/// The progress each run began its backfill at, in rows, from the log.
fn resumed_at(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("backfill reads the table in chunks"))
        .filter_map(|l| l.split(" rows=").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chunked_backfill_under_a_random_workload_and_kills_loses_and_doubles_nothing() {
    let mut oracle = Oracle::chunked(20_000, 1_000, Duration::from_millis(300)).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut run = oracle.spawn();
    oracle.wait_loaded(&mut run).await;
    oracle.start_workload();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1000..2500))).await;
        run.kill().await.unwrap();
        run = oracle.spawn();
    }
    run.kill().await.unwrap();
    let log = std::fs::read_to_string(oracle.lake.path().join("runs.log")).unwrap();
    check(&mut oracle).await;
    let dropped: usize = log
        .lines()
        .filter(|l| l.contains("backfill chunk taken"))
        .filter_map(|l| {
            l.split(" dropped=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert!(
        dropped > 0,
        "the workload changed keys inside chunks' windows:\n{log}"
    );
    let resumed = resumed_at(&log);
    assert!(
        resumed.iter().any(|&rows| rows > 0),
        "a run went on where the lake stood: {resumed:?}"
    );
}
