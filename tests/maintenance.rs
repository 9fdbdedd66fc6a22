//! Table maintenance on demand: `wal2iceberg compact` refused beside a run,
//! then compacting a lake a run left uncompacted without changing what it
//! reads, and runs going on correctly after it.

use std::time::Duration;

use serde_json::Value;
use wal2iceberg::cdc::temporal::format_timestamp_utc;

use crate::support::oracle::{NAMESPACE, Oracle};
use crate::support::*;

/// `compact` of both tables, named one way and the other.
async fn compact(oracle: &Oracle) -> std::process::Output {
    let lake = oracle.lake.path().display().to_string();
    cli(&[
        "compact",
        "accounts",
        "--table",
        "accounts_changes",
        "--lake",
        &lake,
        "--namespace",
        NAMESPACE,
    ])
    .await
}

/// Live data and delete files of a table, from its snapshot summary.
async fn files(oracle: &Oracle, table: &str) -> (u64, u64) {
    let summary = pyiceberg(
        oracle.lake.path(),
        &format!("{NAMESPACE}.{table}"),
        "summary",
    )
    .await;
    let count = |key: &str| -> u64 {
        summary[key]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {summary}"))
    };
    (count("total-data-files"), count("total-delete-files"))
}

fn rows(value: &Value) -> usize {
    value.as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn compact_is_refused_beside_a_run_and_afterwards_changes_no_row() {
    let mut oracle = Oracle::new(500).await;
    oracle.set("--compact-after-files", "0");
    let mut run = oracle.spawn();
    oracle.wait_loaded(&mut run).await;
    oracle.start_workload();
    tokio::time::sleep(Duration::from_secs(5)).await;

    let beside = compact(&oracle).await;
    let stderr = String::from_utf8_lossy(&beside.stderr);
    assert!(!beside.status.success(), "{stderr}");
    assert!(
        stderr.contains("another wal2iceberg process") && stderr.contains("namespace=shop"),
        "{stderr}"
    );
    assert!(run.try_wait().unwrap().is_none(), "the run goes on");
    // So is a manual expiry, at once, rather than losing every race to
    // the run's commits.
    let lake = oracle.lake.path().display().to_string();
    let expire = cli(&[
        "expire-snapshots",
        "--older-than",
        "1s",
        "--lake",
        &lake,
        "--namespace",
        NAMESPACE,
    ])
    .await;
    let stderr = String::from_utf8_lossy(&expire.stderr);
    assert!(
        !expire.status.success() && stderr.contains("another wal2iceberg process"),
        "{stderr}"
    );

    oracle.stop_workload().await;
    run.kill().await.unwrap();
    oracle.drain().await;
    let (silver_data, silver_deletes) = files(&oracle, "accounts").await;
    let (bronze_data, _) = files(&oracle, "accounts_changes").await;
    // Silver's count depends on the workload's last TRUNCATE, whose commit
    // removes every file; bronze keeps every change's.
    assert!(
        bronze_data > 5,
        "no compaction left many files: bronze {bronze_data}"
    );
    let bronze_rows = rows(
        &pyiceberg(
            oracle.lake.path(),
            &format!("{NAMESPACE}.accounts_changes"),
            "rows",
        )
        .await,
    );

    let out = compact(&oracle).await;
    assert_success(&out);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains(&format!("{NAMESPACE}.accounts:")),
        "{printed}"
    );
    let (data, deletes) = files(&oracle, "accounts").await;
    let (bronze_after, _) = files(&oracle, "accounts_changes").await;
    assert!(
        data <= 2 && deletes <= 1 && bronze_after <= 2,
        "silver {silver_data} data and {silver_deletes} delete files became {data} and {deletes}, \
         bronze {bronze_data} became {bronze_after}: {printed}"
    );
    assert_eq!(
        rows(
            &pyiceberg(
                oracle.lake.path(),
                &format!("{NAMESPACE}.accounts_changes"),
                "rows"
            )
            .await
        ),
        bronze_rows
    );
    oracle.check().await;

    // status tells when each table was last compacted and expired.
    let lake = oracle.lake.path().display().to_string();
    let expire = cli(&[
        "expire-snapshots",
        "--lake",
        &lake,
        "--namespace",
        NAMESPACE,
        "--older-than",
        "0s",
        "--retain-last",
        "1",
    ])
    .await;
    assert_success(&expire);
    let mut args = vec!["status".to_owned(), "--json".to_owned()];
    args.extend(oracle.place_args());
    let status = cli(&args).await;
    assert_success(&status);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    // Timestamps in one format compare as text.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let (since, until) = (
        format_timestamp_utc(now - 600_000_000),
        format_timestamp_utc(now + 1_000_000),
    );
    // A silver the workload's last TRUNCATE left as one file without
    // deletes had nothing to compact.
    let silver_compacted = silver_data > 1 || silver_deletes > 0;
    for t in status["tables"].as_array().unwrap() {
        let is_silver = t["table"] == format!("{NAMESPACE}.accounts");
        for when in ["last_compaction", "last_expiry"] {
            if when == "last_compaction" && is_silver && !silver_compacted {
                assert!(t[when].is_null(), "{t}");
                continue;
            }
            let at = t[when].as_str().unwrap_or_else(|| panic!("{when} of {t}"));
            assert!(
                since.as_str() < at && at < until.as_str(),
                "{when} {at} not in the last minutes"
            );
        }
        assert_eq!(t["snapshots"], 1, "{t}");
    }

    // A run after it rebuilds its index on the compacted files.
    oracle.start_workload();
    oracle.finish().await;
}

#[tokio::test]
async fn a_quiet_stream_gets_a_full_compaction_and_reads_the_same() {
    let mut oracle = Oracle::new(500).await;
    let mut run = oracle.spawn();
    oracle.wait_loaded(&mut run).await;
    oracle.start_workload();
    tokio::time::sleep(Duration::from_secs(3)).await;
    oracle.stop_workload().await;
    // Five flush intervals (1 s here) after the last change, the run
    // compacts fully: no delete file left, small files merged.
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    let (data, bronze) = loop {
        let (data, deletes) = files(&oracle, "accounts").await;
        let (bronze, _) = files(&oracle, "accounts_changes").await;
        if deletes == 0 && data <= 1 && bronze <= 1 {
            break (data, bronze);
        }
        assert!(
            std::time::Instant::now() < give_up,
            "still {data} data and {deletes} delete files in silver, {bronze} in bronze"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(run.try_wait().unwrap().is_none(), "the run goes on");
    run.kill().await.unwrap();
    assert!(data <= 1 && bronze <= 1);
    oracle.drain().await;
    oracle.check().await;
}
