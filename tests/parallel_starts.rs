//! Runs started together on one database install wal2iceberg's helper
//! objects once, under one advisory lock, and all go on.

use tokio::task::JoinSet;
use wal2iceberg::apply::run;

use crate::support::*;

const RUNS: usize = 8;

#[tokio::test]
async fn eight_runs_started_at_once_on_a_fresh_database_all_load_and_stream() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE items (id int PRIMARY KEY, name text);
         INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 50) g;
         CREATE TABLE events (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
         CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
         INSERT INTO events SELECT g, '2026-03-01' FROM generate_series(1, 20) g;",
    )
    .await;
    let tables = ["public.items", "public.events"];
    let mut lakes = Vec::new();
    let mut runs = JoinSet::new();
    let mut stops = Vec::new();
    for i in 0..RUNS {
        let lake = tempfile::tempdir().unwrap();
        let mut opts = run_options(&db, &tables, &unique("slot"), lake.path());
        // Half share one publication, half make their own: both race.
        if i % 2 == 1 {
            opts.capture.publication = format!("pub_{i}");
        }
        // Stopped once all confirmed the streamed changes: an idle exit
        // could end a run before the slowest of eight started.
        opts.run.exit_when_idle = None;
        stops.push(opts.shutdown.clone());
        let config = db.config.clone();
        lakes.push((
            lake,
            opts.capture.slot.clone(),
            opts.capture.publication.clone(),
        ));
        runs.spawn(async move { run(&config, &opts).await });
    }
    for (_, slot, _) in &lakes {
        // A run that fails while the others start says why at once.
        tokio::select! {
            () = db.wait_until_streaming(slot) => {}
            Some(ended) = runs.join_next() => {
                panic!("a run ended before all streamed: {:?}", ended.unwrap().err());
            }
        }
    }
    db.exec(
        "INSERT INTO items VALUES (51, 'streamed');
         UPDATE items SET name = 'changed' WHERE id = 1;
         INSERT INTO events VALUES (21, '2026-04-01');",
    )
    .await;
    let streamed = db.wal_insert_lsn().await;
    for (_, slot, _) in &lakes {
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while db.confirmed_flush(slot).await < Some(streamed) {
            assert!(
                std::time::Instant::now() < give_up,
                "{slot} never confirmed the changes"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    for stop in &stops {
        stop.request();
    }
    while let Some(ended) = runs.join_next().await {
        if let Err(e) = ended.unwrap() {
            panic!("a run started beside seven others failed: {e}");
        }
    }
    for (lake, slot, publication) in &lakes {
        // A slot decodes a publication as its snapshot saw it: verify reads
        // through the run's own.
        assert_success(
            &cli(&[
                "verify",
                "--source",
                &db.config_url(),
                "--slot",
                slot,
                "--publication",
                publication,
                "--lake",
                &lake.path().display().to_string(),
                "--namespace",
                "shop",
                "--tables",
                &tables.join(","),
            ])
            .await,
        );
        let silver = pyiceberg(lake.path(), "shop.items", "rows").await;
        assert_eq!(silver.as_array().unwrap().len(), 51, "{slot}: every item");
        let events = pyiceberg(lake.path(), "shop.events", "rows").await;
        assert_eq!(events.as_array().unwrap().len(), 21, "{slot}: every event");
    }
    let counts = db
        .client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'wal2iceberg%'),
                    (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'wal2iceberg%'
                        AND tgrelid = 'events'::regclass),
                    (SELECT count(*) FROM pg_namespace WHERE nspname = 'wal2iceberg')",
            &[],
        )
        .await
        .unwrap();
    let (event_triggers, root_triggers, schemas): (i64, i64, i64) =
        (counts.get(0), counts.get(1), counts.get(2));
    assert_eq!(
        (event_triggers, root_triggers, schemas),
        (3, 3, 1),
        "each helper object once"
    );
}
