//! Snapshot expiry: snapshots past the retention leave the table metadata,
//! and the files only they needed leave the disk.
//!
//! A snapshot is kept when it is current, among the `retain_last` newest,
//! or younger than `older_than`. A file is deleted when an expired snapshot
//! reaches it (its manifest list, its manifests, the live entries of those)
//! and no kept snapshot does; a file a kept snapshot reads is never
//! deleted. The metadata without the expired snapshots is committed first
//! (compare-and-swap, tried once); files are deleted only after, so a
//! crash in between leaves unreferenced files, never a reference to a
//! missing one.

use std::collections::HashSet;
use std::time::Duration;

use iceberg::TableIdent;
use iceberg::spec::SnapshotRef;
use iceberg::table::Table;

use super::catalog::{Lake, iceberg_error};
use super::row_delta::{commit_metadata, current_location};
use crate::error::{Error, ErrorKind, Result};

/// Which snapshots to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Snapshots younger than this are kept.
    pub older_than: Duration,
    /// The newest this many snapshots are kept, however old.
    pub retain_last: usize,
}

/// Default retention of the automatic expiry.
pub const DEFAULT_RETENTION: Retention = Retention {
    older_than: Duration::from_secs(3600),
    retain_last: 10,
};

/// What an expiry did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expired {
    pub snapshots: usize,
    pub files_deleted: usize,
}

/// How often an expiry is worked out again when another commit won the
/// race.
const MAX_ATTEMPTS: usize = 5;

/// Expires the snapshots of `ident` that `retention` does not keep; worked
/// out again on the new table state when another writer committed first.
pub async fn expire_snapshots(
    lake: &Lake,
    ident: &TableIdent,
    retention: Retention,
) -> Result<Expired> {
    for attempt in 1..=MAX_ATTEMPTS {
        if let Some(expired) = try_expire(lake, ident, retention).await? {
            return Ok(expired);
        }
        tracing::warn!(table = %ident, attempt, "the table changed during snapshot expiry; working it out again");
    }
    Err(Error::new(
        ErrorKind::Lake,
        "the table kept changing while its snapshots were being expired",
    )
    .with_context("table", ident)
    .with_context("attempts", MAX_ATTEMPTS))
}

/// One attempt; `None` when another commit got there first.
async fn try_expire(
    lake: &Lake,
    ident: &TableIdent,
    retention: Retention,
) -> Result<Option<Expired>> {
    let table = lake.catalog_table(ident).await?;
    let metadata = table.metadata();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let cutoff = now_ms.saturating_sub(retention.older_than.as_millis() as i64);
    let current = metadata.current_snapshot_id();
    let referenced = referenced_snapshots(&table)?;
    let mut snapshots: Vec<&SnapshotRef> = metadata.snapshots().collect();
    snapshots.sort_by_key(|s| std::cmp::Reverse((s.timestamp_ms(), s.sequence_number())));
    let (kept, expired): (Vec<_>, Vec<_>) =
        snapshots.into_iter().enumerate().partition(|(i, s)| {
            *i < retention.retain_last
                || s.timestamp_ms() >= cutoff
                || Some(s.snapshot_id()) == current
                || referenced.contains(&s.snapshot_id())
        });
    if expired.is_empty() {
        return Ok(Some(Expired::default()));
    }
    let needed = reachable(&table, kept.iter().map(|(_, s)| *s)).await?;
    let gone: Vec<String> = reachable(&table, expired.iter().map(|(_, s)| *s))
        .await?
        .into_iter()
        .filter(|path| !needed.contains(path))
        .collect();
    let ids: Vec<i64> = expired.iter().map(|(_, s)| s.snapshot_id()).collect();
    let built = metadata
        .clone()
        .into_builder(Some(current_location(&table)?))
        .remove_snapshots(&ids)
        .build()
        .map_err(|e| iceberg_error(e, "cannot expire snapshots").with_context("table", ident))?;
    if !commit_metadata(lake, &table, built).await? {
        return Ok(None);
    }
    let mut deleted = 0;
    for path in &gone {
        match table.file_io().delete(path).await {
            Ok(()) => deleted += 1,
            Err(e) => {
                tracing::warn!(table = %ident, file = %path, error = %e, "cannot delete an expired file")
            }
        }
    }
    tracing::info!(table = %ident, snapshots = ids.len(), files = deleted, "snapshots expired");
    Ok(Some(Expired {
        snapshots: ids.len(),
        files_deleted: deleted,
    }))
}

/// The snapshots a branch or tag points at (someone else's tags
/// included). iceberg-rust 0.10 has no accessor for all refs, so they are
/// read from the metadata as the spec writes it.
fn referenced_snapshots(table: &Table) -> Result<HashSet<i64>> {
    let json = serde_json::to_value(table.metadata()).map_err(|e| {
        Error::new(ErrorKind::Lake, "cannot read the table's branches and tags")
            .with_context("table", table.identifier())
            .with_source(e)
    })?;
    Ok(json["refs"]
        .as_object()
        .into_iter()
        .flat_map(|refs| refs.values())
        .filter_map(|r| r["snapshot-id"].as_i64())
        .collect())
}

/// Every file the snapshots read: manifest lists, manifests and the live
/// entries of those.
async fn reachable(
    table: &Table,
    snapshots: impl Iterator<Item = &SnapshotRef>,
) -> Result<HashSet<String>> {
    let context = |e: iceberg::Error| {
        iceberg_error(e, "cannot read the table's manifests")
            .with_context("table", table.identifier())
    };
    let mut files = HashSet::new();
    let mut manifests_seen = HashSet::new();
    for snapshot in snapshots {
        files.insert(snapshot.manifest_list().to_owned());
        let list = table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .map_err(context)?;
        for manifest in list.entries() {
            if !manifests_seen.insert(manifest.manifest_path.clone()) {
                continue;
            }
            files.insert(manifest.manifest_path.clone());
            let loaded = manifest
                .load_manifest(table.file_io())
                .await
                .map_err(context)?;
            files.extend(
                loaded
                    .entries()
                    .iter()
                    .filter(|e| e.is_alive())
                    .map(|e| e.file_path().to_owned()),
            );
        }
    }
    Ok(files)
}
