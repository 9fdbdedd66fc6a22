//! Blocking work (local disk, Parquet encoding and decoding) run so that
//! it never holds up the replication stream's task: on a multi-threaded
//! runtime the worker that runs it first hands its queued tasks to
//! another (`tokio::task::block_in_place`); on a runtime of one thread
//! (the tests' default) there is no other worker, and it runs as is.

use std::future::Future;

use tokio::runtime::{Handle, RuntimeFlavor};

fn may_block_in_place() -> bool {
    Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread)
}

/// Runs `f`, which blocks.
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match may_block_in_place() {
        true => tokio::task::block_in_place(f),
        false => f(),
    }
}

/// Awaits `work`, whose polls block (CPU-bound encoding, local file
/// writes), as [`blocking`] runs a closure.
pub(crate) async fn blocking_await<F: Future>(work: F) -> F::Output {
    match may_block_in_place() {
        true => tokio::task::block_in_place(|| Handle::current().block_on(work)),
        false => work.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a runtime of one worker, a task spawned from one that then
    /// blocks can run only if the worker hands its queue over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_task_queued_behind_blocking_work_runs_meanwhile() {
        let wait = std::time::Duration::from_secs(2);
        let closure = tokio::spawn(async move {
            let (tx, rx) = std::sync::mpsc::channel();
            tokio::spawn(async move { tx.send(()).unwrap() });
            blocking(|| rx.recv_timeout(wait).is_ok())
        });
        assert!(closure.await.unwrap(), "the queued task ran meanwhile");
        let future = tokio::spawn(async move {
            let (tx, rx) = std::sync::mpsc::channel();
            tokio::spawn(async move { tx.send(()).unwrap() });
            blocking_await(async move { rx.recv_timeout(wait).is_ok() }).await
        });
        assert!(future.await.unwrap(), "the queued task ran meanwhile");
        let nested = tokio::spawn(blocking_await(async { blocking(|| 5) }));
        assert_eq!(nested.await.unwrap(), 5, "blocking work may nest");
    }

    #[tokio::test]
    async fn on_one_thread_the_work_runs_as_is() {
        assert_eq!(blocking(|| 2 + 2), 4);
        assert_eq!(blocking_await(async { 3 }).await, 3);
    }
}
