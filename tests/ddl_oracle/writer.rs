//! The writer that keeps changing rows beside the scenario's own writes,
//! on a connection of its own: it moves a row's `k` (a key column while
//! the key is `(id, k)`), inserts rows of its own and deletes them, one
//! transaction at a time, each under the scenario's gate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::sync::RwLock;
use tokio::task::JoinHandle;

use crate::support::TestDb;

pub struct Writer {
    stop: Arc<AtomicBool>,
    task: JoinHandle<usize>,
}

impl Writer {
    pub async fn start(db: &TestDb, gate: Arc<RwLock<()>>, seed: u64) -> Writer {
        let db = TestDb::connect(db.config_url()).await;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (mut next, mut mine, mut written) = (1_000_000, Vec::new(), 0);
            while !stopped.load(Ordering::Relaxed) {
                let sql = match rng.random_range(0..4) {
                    0 => {
                        next += 1;
                        mine.push(next);
                        format!("INSERT INTO items (id, k) VALUES ({next}, 1)")
                    }
                    1 if !mine.is_empty() => {
                        let id = mine.swap_remove(rng.random_range(0..mine.len()));
                        format!("DELETE FROM items WHERE id = {id}")
                    }
                    _ => "UPDATE items SET k = k + 1 \
                          WHERE id = (SELECT id FROM items ORDER BY random() LIMIT 1)"
                        .to_owned(),
                };
                {
                    let _between_alters = gate.read().await;
                    db.exec(&sql).await;
                }
                written += 1;
                tokio::time::sleep(Duration::from_millis(rng.random_range(10..60))).await;
            }
            written
        });
        Writer { stop, task }
    }

    /// Stops it; how many transactions it wrote.
    pub async fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the writer's statements succeed")
    }
}
