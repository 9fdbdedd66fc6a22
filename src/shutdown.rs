//! A request to stop, from SIGINT or SIGTERM (or a test): the pipeline
//! checks it between events and at least every quarter second while idle,
//! then stops without committing part of a transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    /// A shutdown requested by SIGINT or SIGTERM.
    pub fn on_signals() -> std::io::Result<Shutdown> {
        use tokio::signal::unix::{SignalKind, signal};
        let shutdown = Shutdown::default();
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let flag = shutdown.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            tracing::info!(signal = name, "shutting down at the next safe point");
            flag.request();
        });
        Ok(shutdown)
    }

    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
