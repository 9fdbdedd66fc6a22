//! What silver records of its table's backfill, and how it is staged
//! into a batch's commits.

use std::collections::VecDeque;

use iceberg::TableUpdate;
use serde::{Deserialize, Serialize};

use crate::apply::pipeline::Pipeline;
use crate::apply::resync;
use crate::cdc::backfill::{Bound, Range};
use crate::error::Result;
use crate::lake::catalog::Lake;
use crate::lake::table::silver::SilverTable;

/// Silver's property recording its table's backfill ([`Progress`]): in
/// the commit that holds the rows of the ranges it names.
pub(crate) const PROGRESS: &str = "wal2iceberg.backfill";

/// Silver's property while its backfill is not done.
pub(crate) const INCOMPLETE: (&str, &str) = ("wal2iceberg.incomplete", "backfill");

/// What silver records of its table's backfill, in the commit of each
/// chunk's rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Progress {
    /// The ranges silver holds, in key order.
    pub(crate) applied: Vec<Range>,
    /// Rows read into the lake so far.
    pub(crate) rows: u64,
    /// The source's estimate of the table's rows when the last chunk was
    /// read (`pg_class.reltuples`), once the table was ever analyzed.
    #[serde(default)]
    pub(crate) estimate: Option<u64>,
    pub(crate) chunk_rows: u64,
    pub(crate) done: bool,
}

impl Progress {
    pub(crate) fn of(table: &iceberg::table::Table) -> Option<Progress> {
        let text = table.metadata().properties().get(PROGRESS)?;
        serde_json::from_str(text).ok()
    }

    /// Rows read as a share of the estimate, in percent (at most 100).
    pub(crate) fn percent(&self) -> Option<f64> {
        self.estimate
            .filter(|&e| e > 0)
            .map(|e| (self.rows as f64 * 100.0 / e as f64).min(100.0))
    }

    /// The ranges not applied yet, in key order, the last one (to the
    /// table's end) apart: where the reader plans chunks from.
    pub(super) fn left(&self) -> (VecDeque<Range>, Option<Option<Bound>>) {
        let mut gaps = VecDeque::new();
        // Where the next applied range should start; `None` past the end.
        let mut cursor: Option<Option<Bound>> = Some(None);
        for range in &self.applied {
            let Some(at) = cursor else { break };
            if at != range.after {
                gaps.push_back(Range {
                    after: at,
                    upto: range.after.clone(),
                });
            }
            cursor = range.upto.clone().map(Some);
        }
        (gaps, cursor)
    }
}

/// Ends a backfill not done for a reload of the whole table (a resync):
/// its commit records the backfill done and silver complete.
pub(in crate::apply) async fn end_with_reload(
    lake: &Lake,
    silver: &mut SilverTable,
    progress: Progress,
) -> Result<()> {
    let done = Progress {
        done: true,
        ..progress
    };
    stage_progress(lake, silver, &done).await
}

/// Stages `progress` into silver's properties, and once it is done the
/// end of its mark.
pub(super) async fn stage_progress(
    lake: &Lake,
    silver: &mut SilverTable,
    progress: &Progress,
) -> Result<()> {
    let text = serde_json::to_string(progress).expect("progress serializes");
    let mut updates = vec![TableUpdate::SetProperties {
        updates: [(PROGRESS.to_owned(), text)].into(),
    }];
    if progress.done {
        updates.push(TableUpdate::RemoveProperties {
            removals: vec![INCOMPLETE.0.to_owned()],
        });
    }
    let table = silver.table(lake).await?;
    silver.stage_schema(&table, updates);
    Ok(())
}

impl Pipeline<'_> {
    /// Stages every backfill's progress that changed into the open batch,
    /// with silver's mark gone once it is complete, and a resync the
    /// backfill does recorded done in bronze.
    pub(in crate::apply) async fn stage_backfill_progress(&mut self) -> Result<()> {
        for sink in self.sinks.values_mut() {
            let (Some(backfill), Some(silver)) = (sink.backfill.as_mut(), sink.silver.as_mut())
            else {
                continue;
            };
            if let Some(id) = backfill.request.take() {
                let bronze = sink.bronze.table(&self.lake).await?;
                sink.bronze.stage_schema(
                    &bronze,
                    vec![TableUpdate::SetProperties {
                        updates: [(resync::DONE.to_owned(), id)].into(),
                    }],
                );
                sink.bronze_dirty = true;
            }
            if !std::mem::take(&mut backfill.changed) {
                continue;
            }
            stage_progress(&self.lake, silver, &backfill.progress).await?;
            sink.silver_dirty = true;
            if backfill.progress.done {
                sink.backfill = None;
            }
        }
        Ok(())
    }
}
