//! A load beside the stream. Once a run has streamed from its slot, the
//! tables a start must load (a resync's, one the lake lacks) are loaded
//! from a temporary slot's snapshot while the other tables keep streaming
//! (docs/tables.md, "Loads beside the stream"). The stream takes nothing
//! of the loading tables and confirms nothing past where the slot stood
//! when it began, so the WAL they need stays; once the load landed, the
//! stream ends at the next transaction boundary and the run starts over
//! from that position: the loaded tables take their changes since (each
//! skips what its snapshot holds), and every other table skips what it
//! already holds. Until then nothing else ends the stream but a stop or
//! an error: a resync asked for meanwhile waits for the start over, so a
//! long load is never thrown away for it.

use std::collections::HashSet;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::pipeline::{Beside, Load, Pipeline, StreamEnd};
use super::policy::Step;
use super::{RunOptions, RunReport};
use crate::cdc::snapshot::SnapshotLoad;
use crate::cdc::stream::ChangeStream;
use crate::error::Result;
use crate::lake::catalog::Lake;
use crate::model::TableName;
use crate::pg::config::PgConfig;

/// How long an idle stream waits for the server at least while a load
/// runs beside it, which an idle exit waits for.
const IDLE_WAIT: Duration = Duration::from_millis(250);

impl Pipeline<'_> {
    /// Whether `table` is loading beside the stream, which takes nothing
    /// of it until it starts over (also once the load landed: the start
    /// over gives it everything since).
    pub(crate) fn loading_beside(&self, table: Option<&TableName>) -> bool {
        self.beside
            .as_ref()
            .is_some_and(|b| table.is_some_and(|t| b.tables.contains(t)))
    }

    fn beside_load(&self) -> Option<Load> {
        self.beside.as_ref().map(|b| *b.load.borrow())
    }

    /// Whether a load runs beside the stream still: nothing but a stop or
    /// an error ends the stream meanwhile.
    pub(super) fn loading(&self) -> bool {
        self.beside_load() == Some(Load::Running)
    }

    /// Whether a load beside the stream landed: the stream ends at the
    /// next transaction boundary, to be read again from where it began.
    pub(super) fn landed_beside(&self) -> bool {
        self.beside_load() == Some(Load::Landed)
    }

    /// `step`, except that a stream idle while a load or a backfill runs
    /// beside it does not end: their tables are not done until they land.
    pub(super) fn beside_step(&self, step: Step) -> Step {
        let reading = self.loading() || self.backfilling();
        match step {
            Step::Exit if reading => Step::Wait,
            Step::FlushAndExit if reading => Step::Flush,
            step => step,
        }
    }

    /// `deadline`, or a little later while a load runs beside the stream:
    /// an idle stream waiting for it does not spin.
    pub(super) fn beside_deadline(&self, deadline: Instant, now: Instant) -> Instant {
        match self.loading() || self.backfilling() {
            true => deadline.max(now + IDLE_WAIT),
            false => deadline,
        }
    }

    /// Waits until the load beside the stream landed or stopped.
    pub(super) async fn load_ended(&self) {
        if let Some(beside) = &self.beside {
            let mut load = beside.load.clone();
            // A closed channel: the load is gone, and so is the wait.
            let _ = load.wait_for(|l| *l != Load::Running).await;
        }
    }

    /// Streams the tables `load` does not hold while a pipeline of its own
    /// loads them; how the stream ended, and whether the load failed (an
    /// error of the load is no progress of the stream). A stream that ends
    /// first, stopped or failed, drops the load (the next start does it
    /// again, or only records it done when its last commit landed).
    pub(crate) async fn stream_beside(
        &mut self,
        stream: &mut ChangeStream,
        load: SnapshotLoad,
        config: &PgConfig,
        options: &RunOptions,
    ) -> (Result<StreamEnd>, bool) {
        let tables: HashSet<TableName> = load.tables().iter().cloned().collect();
        let (state, receiver) = watch::channel(Load::Running);
        let names: Vec<String> = load.tables().iter().map(ToString::to_string).collect();
        tracing::info!(tables = ?names, "loading beside the stream: the other tables keep streaming");
        self.beside = Some(Beside {
            tables,
            load: receiver,
        });
        stream.hold();
        let lake = match Lake::open(&options.lake).await {
            Ok(lake) => lake,
            Err(e) => return (Err(e), true),
        };
        let mut report = RunReport::default();
        let end = {
            let mut loader = Pipeline::new(
                lake,
                self.namespace.clone(),
                self.names.clone(),
                options,
                &mut report,
            );
            loader.resyncing = std::mem::take(&mut self.resyncing);
            let loading = async {
                let loaded = loader.load(load, config, options).await;
                loader.persist_indexes();
                loaded
            };
            let streaming = self.stream(stream, options);
            tokio::pin!(loading, streaming);
            tokio::select! {
                end = &mut streaming => (end, false),
                loaded = &mut loading => match loaded {
                    Ok(landed) => {
                        if landed {
                            tracing::info!("the load beside the stream landed: the stream starts over to give its tables their changes since");
                        }
                        state.send_replace([Load::Stopped, Load::Landed][usize::from(landed)]);
                        (streaming.await, false)
                    }
                    Err(e) => (Err(e), true),
                },
            }
        };
        self.report.changes_applied += report.changes_applied;
        self.report.batches += report.batches;
        end
    }
}
