//! The chunked backfill (docs/backfill.md): a table read in key-range
//! chunks beside the stream, each in a short transaction of its own,
//! checked by the audit-trigger oracle while a random workload writes.

use crate::support::oracle::Oracle;

#[tokio::test(flavor = "multi_thread")]
async fn a_chunked_backfill_under_a_random_workload_and_kills_loses_and_doubles_nothing() {
    let mut oracle = Oracle::chunked(20_000, 500).await;
    oracle.kill_at_random(5, 7).await;
    let (changes, rows) = oracle.finish().await;
    assert!(changes > 50, "the workload ran: {changes} changes");
    assert!(rows > 0, "rows are left");
    let log = oracle.run_log();
    assert!(log.contains("backfill chunk taken"), "{log}");
}
