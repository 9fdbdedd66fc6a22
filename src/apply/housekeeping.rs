//! Housekeeping after commits: compaction while the stream is quiet,
//! snapshot expiry, and the lake's file counts in the metrics.

use super::EXPIRE_EVERY_COMMITS;
use super::pipeline::Pipeline;
use super::sink::TableSink;
use crate::error::Result;
use crate::lake::catalog::Lake;
use crate::lake::files::writer::summary_total;
use crate::lake::maintenance::compaction::{Merge, merge_small_files};
use crate::lake::maintenance::expire::{Retention, expire_snapshots};
use crate::metrics::metrics;
use crate::model::TableName;

impl TableSink {
    /// After a commit or an idle compaction: the metrics, and snapshot
    /// expiry for both tables once silver compacted or
    /// [`EXPIRE_EVERY_COMMITS`] commits went by. An expiry that fails
    /// (another writer kept committing) costs nothing but time and runs
    /// again later.
    pub(super) async fn housekeeping(
        &mut self,
        lake: &Lake,
        table: &TableName,
        compacted: bool,
        retention: Retention,
    ) {
        let m = metrics();
        if compacted || self.commits_since_expiry >= EXPIRE_EVERY_COMMITS {
            let mut expired_all = true;
            for ident in self.idents() {
                match expire_snapshots(lake, ident, retention).await {
                    Ok(expired) => {
                        m.snapshots_expired.inc_by(expired.snapshots as u64);
                    }
                    Err(e) => {
                        expired_all = false;
                        tracing::warn!(table = %ident, error = %e, "snapshot expiry failed; it runs again later");
                    }
                }
            }
            if expired_all {
                m.expired();
            }
            self.commits_since_expiry = 0;
            for ident in self.idents() {
                match lake.catalog_table(ident).await {
                    Ok(t) => {
                        let total = |key: &str| summary_total(&t, key);
                        m.set_lake_table(
                            &ident.to_string(),
                            total("total-data-files"),
                            total("total-delete-files"),
                            total("total-files-size"),
                        );
                    }
                    Err(e) => {
                        tracing::warn!(table = %ident, error = %e, "cannot read the table's file counts for the metrics")
                    }
                }
            }
        }
        // Counted once the tables' figures above are current, so that a
        // scrape that sees the compaction sees what it left.
        if compacted {
            m.compacted();
        }
        if let Some(silver) = &self.silver {
            let (data, deletes) = silver.file_counts();
            m.set_silver_files(&table.to_string(), data, deletes);
        }
    }
}

impl Pipeline<'_> {
    /// One round of full compaction of each table, as `wal2iceberg
    /// compact` does, while the stream is quiet and nothing is staged:
    /// every small file merged and every deleted row dropped, so readers
    /// of a table that stopped changing scan no delete at all. True when
    /// a table was compacted (another round may follow).
    pub(super) async fn compact_idle(&mut self) -> Result<bool> {
        let mut any = false;
        for (table, sink) in &mut self.sinks {
            if !sink.loaded() {
                continue;
            }
            let mut compacted = merge_small_files(&self.lake, sink.bronze.ident(), Merge::All)
                .await?
                .is_some();
            if let Some(silver) = &mut sink.silver {
                compacted |= silver.compact_now(&self.lake, Merge::All).await?.is_some();
            }
            if compacted {
                tracing::info!(table = %table, "compacted while the stream is quiet");
                sink.housekeeping(&self.lake, table, true, self.retention)
                    .await;
            }
            any |= compacted;
        }
        Ok(any)
    }
}
