//! A lake slow to commit does not cost the replication connection: the
//! stream's task answers the server whatever the apply side waits for.

use std::time::Duration;

use serde_json::Value;

use crate::support::oracle::{NAMESPACE, Oracle};
use crate::support::*;

#[tokio::test]
async fn commits_and_compactions_of_ten_seconds_keep_a_two_second_wal_sender_timeout() {
    let mut oracle = Oracle::new(200).await;
    let dbname = oracle.db.config.dbname.clone();
    oracle
        .db
        .exec(&format!(
            "ALTER DATABASE {dbname} SET wal_sender_timeout = '2s'"
        ))
        .await;
    oracle.set("--compact-after-files", "1");
    let mut run = oracle
        .command(&[])
        .env(
            wal2iceberg::failpoint::STALL_VARIABLE,
            "commit,compaction:10000",
        )
        .spawn()
        .expect("start wal2iceberg");
    oracle.wait_loaded(&mut run).await;
    oracle.db.wait_until_streaming(&oracle.slot).await;
    let holder = oracle.db.active_pid(&oracle.slot).await;
    assert!(holder.is_some());
    oracle.start_workload();
    // Batches of a bronze and a silver commit of ten seconds each, until a
    // compaction of ten seconds more landed too: one walsender all along.
    let give_up = std::time::Instant::now() + Duration::from_secs(180);
    while last_compaction(&oracle).await.is_none() {
        assert!(
            std::time::Instant::now() < give_up,
            "no compaction landed: {}",
            oracle.run_log()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            oracle.db.active_pid(&oracle.slot).await,
            holder,
            "the server dropped the stream: {}",
            oracle.run_log()
        );
    }
    assert!(run.try_wait().unwrap().is_none(), "the run goes on");
    oracle.stop_workload().await;
    run.kill().await.unwrap();
    let log = oracle.run_log();
    assert!(!log.contains("reconnecting"), "{log}");
    oracle.drain().await;
    oracle.check().await;
}

/// When bronze was last compacted, as `status` tells.
async fn last_compaction(oracle: &Oracle) -> Option<String> {
    let mut args = vec!["status".to_owned(), "--json".to_owned()];
    args.extend(oracle.place_args());
    let status = cli(&args).await;
    assert_success(&status);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let tables = status["tables"].as_array()?;
    let bronze = tables
        .iter()
        .find(|t| t["table"] == format!("{NAMESPACE}.accounts_changes"))?;
    bronze["last_compaction"].as_str().map(str::to_owned)
}
