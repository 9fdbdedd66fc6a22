//! A batch's tables become visible together (`atomic_commits`, the
//! default): a reader polling two tables, while every source transaction
//! writes the same key to both, never sees a key in one and not in the
//! other, whichever it reads first; nor silver ahead of bronze.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::process::Command;

use crate::support::readers::read_with_env;
use crate::support::*;

/// Streams transactions that write one key to both `a` and `b` while a
/// reader with `readers`' settings polls the silver tables, then bronze
/// against silver, through a run with `catalog` flags; asserts no poll was
/// torn and that the polls saw the tables grow.
pub async fn two_tables_are_seen_together(catalog: &[&str], readers: Vec<(&'static str, String)>) {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE a(id int PRIMARY KEY, v int); CREATE TABLE b(id int PRIMARY KEY, v int);",
    )
    .await;
    let lake = tempfile::tempdir().unwrap();
    let lake_arg = lake.path().display().to_string();
    let slot = unique("atomic");
    let url = db.config_url();
    let mut run = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(["run", "--source", &url, "--tables", "public.a,public.b"])
        .args(["--slot", &slot, "--lake", &lake_arg, "--namespace", "shop"])
        .args(["--flush-interval", "100ms"])
        .args(catalog)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    db.wait_until_active(&slot).await;
    // Transactions go on until both pairs were polled.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let db = TestDb::connect(db.config_url()).await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                db.exec(&format!(
                    "BEGIN; INSERT INTO a VALUES ({i}, {i}); INSERT INTO b VALUES ({i}, {i}); COMMIT;"
                ))
                .await;
                i += 1;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    for pair in [["shop.a", "shop.b"], ["shop.a", "shop.a_changes"]] {
        // A machine so loaded that the run committed less than three
        // times in a round of polls gets another round, and one more.
        let mut grew = false;
        for _ in 0..3 {
            let polled = read_with_env(
                "poll_pairs.py",
                &[&lake_arg, "5", pair[0], pair[1]],
                &readers,
            )
            .await;
            assert_eq!(polled["torn"], 0, "{pair:?}: {polled}");
            grew = polled["polls"].as_u64().unwrap() >= 5
                && polled["sizes"].as_array().unwrap().len() >= 3;
            if grew {
                break;
            }
            println!("{pair:?}: the polls saw the tables grow too little, polling again: {polled}");
        }
        assert!(grew, "{pair:?}: the polls did not see the tables grow");
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    run.kill().await.unwrap();
}

#[tokio::test]
async fn a_readers_polls_never_see_one_table_of_a_transaction_without_the_other() {
    two_tables_are_seen_together(&[], Vec::new()).await;
}
