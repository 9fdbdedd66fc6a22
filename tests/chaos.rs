//! Crash safety under random kills: while the oracle's randomized workload
//! runs (tests/support/oracle.rs), `wal2iceberg run` is killed with
//! SIGKILL at random moments and started again, many times. `CHAOS_KILLS`
//! sets the number of kills (default 30; the longer runs of
//! docs/reliability.md use hundreds).

use std::time::Duration;

use rand::{Rng, SeedableRng};

use crate::support::oracle::Oracle;

#[tokio::test]
async fn random_kills_during_a_random_workload_lose_and_repeat_nothing() {
    let kills: usize = std::env::var("CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let mut oracle = Oracle::new(500).await;

    // The first run loads; the workload starts once the load landed, so
    // that every audited change must appear in bronze as a change (a table
    // whose load a kill interrupts is loaded again from a later snapshot,
    // which then holds the changes made before it).
    let mut first = oracle.spawn();
    oracle.wait_loaded().await;
    oracle.start_workload();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
    first.kill().await.unwrap();
    for _ in 1..kills {
        let mut child = oracle.spawn();
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
        child.kill().await.unwrap();
    }
    oracle.stop_workload().await;
    oracle.drain().await;
    let (changes, rows) = oracle.check().await;
    println!(
        "chaos: {kills} kills, {} transactions, {changes} changes checked, {rows} live rows, no mismatch",
        oracle.transactions(),
    );
}
