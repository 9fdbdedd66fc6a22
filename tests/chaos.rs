//! Crash safety under random kills: while the oracle's randomized workload
//! runs (tests/support/oracle.rs), `wal2iceberg run` is killed with
//! SIGKILL at random moments and started again, many times. `CHAOS_KILLS`
//! sets the number of kills (default 30; the longer runs of
//! docs/reliability.md use hundreds). The same with `--streaming`, whose
//! transactions the kills cut between streamed chunks.

use crate::support::oracle::Oracle;

#[tokio::test]
async fn random_kills_during_a_random_workload_lose_and_repeat_nothing() {
    let kills: usize = std::env::var("CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let mut oracle = Oracle::new(500).await;
    oracle.kill_at_random(kills, 7).await;
    oracle.stop_workload().await;
    oracle.drain().await;
    let (changes, rows) = oracle.check().await;
    println!(
        "chaos: {kills} kills, {} transactions, {changes} changes checked, {rows} live rows, no mismatch",
        oracle.transactions(),
    );
}

#[tokio::test]
async fn random_kills_while_transactions_stream_lose_and_repeat_nothing() {
    let mut oracle = Oracle::new(500).await;
    oracle.streaming();
    oracle.kill_at_random(10, 11).await;
    oracle.stop_workload().await;
    oracle.drain().await;
    let streamed = oracle.db.streamed_transactions(&oracle.slot).await;
    assert!(
        streamed > 0,
        "the server streamed no transaction: the runs did not exercise --streaming"
    );
    let (changes, rows) = oracle.check().await;
    println!(
        "chaos, streaming: {streamed} transactions streamed, {changes} changes checked, {rows} live rows, no mismatch",
    );
}
