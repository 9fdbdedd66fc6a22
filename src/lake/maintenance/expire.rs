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

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use iceberg::TableIdent;
use iceberg::spec::SnapshotRef;
use iceberg::table::Table;

use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::catalog::commit::commit_metadata;
use crate::lake::storage::listing::files_under;
use crate::lake::{current_location, iceberg_error};

/// Which snapshots to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Snapshots younger than this are kept.
    pub older_than: Duration,
    /// The newest this many snapshots are kept, however old.
    pub retain_last: usize,
}

/// The table property recording when an expiry last removed snapshots,
/// milliseconds since the Unix epoch (`wal2iceberg status` shows it).
pub(crate) const LAST_EXPIRY_PROPERTY: &str = "wal2iceberg.last-expiry-ms";

/// What an expiry did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expired {
    pub snapshots: usize,
    pub files_deleted: usize,
    /// Files nothing referred to (see [`remove_orphan_files`]).
    pub orphans_deleted: usize,
}

/// A file nothing refers to is deleted only once it is this old, or as
/// old as the retention if that is longer: a writer between writing a file
/// and committing it (another process, on another namespace's lock or none)
/// must never lose it.
pub(crate) const ORPHAN_MIN_AGE: Duration = Duration::from_secs(3600);

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
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let older_than_ms = i64::try_from(retention.older_than.as_millis()).unwrap_or(i64::MAX);
    let cutoff = now_ms.saturating_sub(older_than_ms);
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
    let failed = |e| iceberg_error(e, "cannot expire snapshots").with_context("table", ident);
    let built = metadata
        .clone()
        .into_builder(Some(current_location(&table)?))
        .remove_snapshots(&ids)
        .set_properties(HashMap::from([(
            LAST_EXPIRY_PROPERTY.to_owned(),
            now_ms.to_string(),
        )]))
        .map_err(failed)?
        .build()
        .map_err(failed)?;
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
    // The expiry landed: a sweep that cannot list the files (a role
    // without s3:ListBucket) leaves the orphans for the next one.
    let orphans = sweep(lake, ident, needed, retention.older_than)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(table = %ident, error = %e, "cannot sweep orphan files");
            0
        });
    tracing::info!(table = %ident, snapshots = ids.len(), files = deleted, orphans, "snapshots expired");
    Ok(Some(Expired {
        snapshots: ids.len(),
        files_deleted: deleted,
        orphans_deleted: orphans,
    }))
}

/// Deletes the files in the table's `data` and `metadata` folders that no
/// snapshot and no metadata file of the table refers to, once they are
/// older than `older_than` (and at least [`ORPHAN_MIN_AGE`]): what a crash
/// between writing files and committing them left, or a commit that lost
/// its race. [`expire_snapshots`] does it whenever it expired something;
/// this is the same on its own. On a local folder, S3 and GCS; a table
/// stored elsewhere is left as it is.
pub async fn remove_orphan_files(
    lake: &Lake,
    ident: &TableIdent,
    older_than: Duration,
) -> Result<usize> {
    let table = lake.catalog_table(ident).await?;
    let referenced = reachable(&table, table.metadata().snapshots()).await?;
    sweep(lake, ident, referenced, older_than).await
}

async fn sweep(
    lake: &Lake,
    ident: &TableIdent,
    mut referenced: HashSet<String>,
    older_than: Duration,
) -> Result<usize> {
    // The table as it is now: its current metadata file and those the
    // metadata log still lists are referred to as well.
    let table = lake.catalog_table(ident).await?;
    referenced.extend(table.metadata_location().map(str::to_owned));
    referenced.extend(
        table
            .metadata()
            .metadata_log()
            .iter()
            .map(|m| m.metadata_file.clone()),
    );
    // Statistics files other engines wrote beside the metadata.
    let metadata = table.metadata();
    referenced.extend(
        metadata
            .statistics_iter()
            .map(|s| s.statistics_path.clone()),
    );
    referenced.extend(
        metadata
            .partition_statistics_iter()
            .map(|s| s.statistics_path.clone()),
    );
    let referenced: HashSet<&str> = referenced.iter().map(|p| local_path(p)).collect();
    let cutoff = std::time::SystemTime::now() - older_than.max(ORPHAN_MIN_AGE);
    let root = table.metadata().location().trim_end_matches('/');
    let props = table.file_io().config().props();
    let mut deleted = 0;
    for folder in ["data", "metadata"] {
        let Some(files) = files_under(&format!("{root}/{folder}"), props).await? else {
            return Ok(0);
        };
        for file in files {
            // An object whose listing gives no time is kept: its age is
            // unknown.
            if referenced.contains(local_path(&file.location))
                || file.modified.is_none_or(|m| m > cutoff)
            {
                continue;
            }
            match table.file_io().delete(&file.location).await {
                Ok(()) => deleted += 1,
                Err(e) => {
                    tracing::warn!(table = %ident, file = %file.location, error = %e, "cannot delete an orphan file")
                }
            }
        }
    }
    Ok(deleted)
}

/// The local path of a `file://` location (the location itself otherwise).
fn local_path(location: &str) -> &str {
    location.strip_prefix("file://").unwrap_or(location)
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
