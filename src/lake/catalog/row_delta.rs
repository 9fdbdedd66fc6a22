//! The commit iceberg-rust 0.10 lacks: one snapshot that adds data files
//! and positional-delete files. Its public transaction API only appends
//! data files, so this module writes the manifests and the manifest list
//! itself and plans the new table metadata, which `catalog_commit` makes
//! current only if the table is still the one it was planned on; the
//! snapshots of several tables at once too ([`commit_row_deltas`]).
//!
//! The same commit also rewrites (compaction): a snapshot that removes
//! live data and delete files while it adds new ones. It then writes the
//! manifests anew, one for data files and one for delete files, with every
//! file it keeps as an existing entry (its sequence numbers and snapshot
//! kept) and every file it removes as a deleted entry; so each compaction
//! also folds the manifests the commits before it left behind.
//!
//! Kept narrow on purpose (`commit_row_delta`), so that upstream row-delta
//! and rewrite-files actions can replace it.
//!
//! Spec: <https://iceberg.apache.org/spec/#snapshots>, "Manifests",
//! "Position Delete Files", "Sequence Numbers". New files get the new
//! snapshot's sequence number, and a positional delete applies to the
//! data files it names whose sequence number is at most its own: those of
//! earlier snapshots and those added with it, which silver relies on when
//! a batch deletes rows it has already written to a file.

use std::collections::{HashMap, HashSet};

use iceberg::TableIdent;
use iceberg::spec::{
    DataFile, MAIN_BRANCH, ManifestContentType, ManifestEntry, ManifestFile, ManifestListWriter,
    ManifestWriterBuilder, Operation, PartitionSpecRef, SchemaRef, Snapshot, SnapshotRef,
    SnapshotReference, SnapshotRetention, SnapshotSummaryCollector, Summary,
};
use iceberg::table::Table;

use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::catalog::commit::{Planned, commit_all};
use crate::lake::files::writer::ancestors;
use crate::lake::schema::staged::StagedSchema;
use crate::lake::{current_location, iceberg_error};

/// How often a commit is tried against a freshly loaded table before the
/// conflict is reported.
const MAX_ATTEMPTS: usize = 5;

/// What one snapshot adds, and removes.
#[derive(Debug, Default)]
pub struct RowDelta {
    pub data_files: Vec<DataFile>,
    pub delete_files: Vec<DataFile>,
    /// Paths of live data and delete files the snapshot removes: a
    /// rewrite, committed with [`commit_rewrite`].
    pub removed: HashSet<String>,
    /// The snapshot removes every file live in the table it is committed
    /// on: the table's rows are then the delta's alone (a truncate, a
    /// reload).
    pub replace_all: bool,
    /// Extra snapshot summary properties (the source position).
    pub properties: HashMap<String, String>,
    /// Schema changes the same commit makes, ahead of the snapshot: those
    /// of the changes whose rows it adds.
    pub schema: StagedSchema,
    /// The snapshot the writer's picture of where rows are (silver's key
    /// index) was built on. Another writer's snapshots after it may only
    /// have appended: one that may have removed data files (an overwrite,
    /// a delete, a compaction) moved rows the delta's position deletes, or
    /// later ones, name; the commit is then refused ([`built_on`]).
    pub built_on: Option<i64>,
}

/// The files a delta adds and their bytes, for a commit's log line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub(crate) files: usize,
    pub(crate) bytes: u64,
}

impl std::ops::AddAssign for Written {
    fn add_assign(&mut self, other: Written) {
        self.files += other.files;
        self.bytes += other.bytes;
    }
}

impl RowDelta {
    pub(crate) fn written(&self) -> Written {
        let files = self.data_files.iter().chain(&self.delete_files);
        Written {
            files: self.data_files.len() + self.delete_files.len(),
            bytes: files.map(DataFile::file_size_in_bytes).sum(),
        }
    }
}

/// Commits `delta` as one snapshot of `ident`, retrying on a concurrent
/// commit with the table reloaded (the new snapshot then builds on the
/// other writer's). Returns the table as committed.
pub async fn commit_row_delta(lake: &Lake, ident: &TableIdent, delta: &RowDelta) -> Result<Table> {
    let mut committed = commit_row_deltas(lake, &[(ident, delta)]).await?;
    Ok(committed.remove(0))
}

/// Commits each delta as one snapshot of its table, all in one catalog
/// commit, so a reader sees all of them or none; on a concurrent commit
/// to any of the tables, all are planned again on the tables reloaded.
/// Returns the tables as committed, in the order of `deltas`.
pub(crate) async fn commit_row_deltas(
    lake: &Lake,
    deltas: &[(&TableIdent, &RowDelta)],
) -> Result<Vec<Table>> {
    crate::failpoint::stall("commit").await;
    let metrics = crate::metrics::metrics();
    let started = std::time::Instant::now();
    let names = || {
        let names: Vec<String> = deltas.iter().map(|(ident, _)| ident.to_string()).collect();
        names.join(", ")
    };
    for attempt in 1..=MAX_ATTEMPTS {
        // Each table's reads and writes at once: on object storage they
        // are round trips.
        let planned = crate::lake::each_table(deltas.iter().map(|(ident, delta)| async move {
            plan(&lake.catalog_table(ident).await?, delta).await
        }))
        .await?;
        if commit_all(lake, planned).await? {
            metrics.observe_commit_duration(started.elapsed());
            metrics.iceberg_commits.inc_by(deltas.len() as u64);
            return crate::lake::each_table(
                deltas.iter().map(|(ident, _)| lake.catalog_table(ident)),
            )
            .await;
        }
        metrics.iceberg_commit_retries.inc();
        tracing::warn!(tables = %names(), attempt, "commit conflict; retrying on the new table state");
    }
    Err(
        Error::new(ErrorKind::Lake, "the table kept changing under the commit")
            .with_context("table", names())
            .with_context("attempts", MAX_ATTEMPTS),
    )
}

/// Commits a rewrite (`delta.removed` not empty) on `base`, the table as it
/// was when the rewrite chose what to remove and what to keep: the table
/// as committed, or `None`, and nothing committed, when another commit
/// came after `base`. It is never retried on a newer table: what it
/// removes might have changed there.
pub(crate) async fn commit_rewrite(
    lake: &Lake,
    base: &Table,
    delta: &RowDelta,
) -> Result<Option<Table>> {
    crate::failpoint::stall("compaction").await;
    let started = std::time::Instant::now();
    if !commit_all(lake, vec![plan(base, delta).await?]).await? {
        return Ok(None);
    }
    let metrics = crate::metrics::metrics();
    metrics.observe_commit_duration(started.elapsed());
    metrics.iceberg_commits.inc();
    Ok(Some(lake.catalog_table(base.identifier()).await?))
}

/// The snapshot of `delta` on `base`: its manifests and manifest list
/// written, the new metadata planned.
async fn plan(base: &Table, delta: &RowDelta) -> Result<Planned> {
    let context = context(base);
    if let Some(snapshot) = delta.built_on {
        built_on(base, snapshot)?;
    }
    // The manifests and the snapshot are of the schema the commit makes.
    let evolved = delta.schema.over(base)?;
    let metadata = evolved.metadata();
    let parent = metadata.current_snapshot();
    let new = NewSnapshot {
        table: &evolved,
        snapshot_id: unique_snapshot_id(&evolved),
        sequence_number: metadata.next_sequence_number(),
        commit_uuid: uuid::Uuid::new_v4(),
        schema: metadata.current_schema().clone(),
        spec: metadata.default_partition_spec().clone(),
    };
    let (mut manifests, kept) = new.read_parent(parent, delta).await?;
    let mut summary = SnapshotSummaryCollector::default();
    new.write_manifests(kept, delta, &mut summary, &mut manifests)
        .await?;
    let list_path = new.write_manifest_list(parent, manifests).await?;

    let mut properties = delta.properties.clone();
    let changed = summary.build();
    properties.extend(totals(parent.map(|s| s.summary()), &changed));
    properties.extend(changed);
    let snapshot = Snapshot::builder()
        .with_manifest_list(list_path)
        .with_snapshot_id(new.snapshot_id)
        .with_parent_snapshot_id(parent.map(|s| s.snapshot_id()))
        .with_sequence_number(new.sequence_number)
        .with_summary(Summary {
            operation: delta.operation(),
            additional_properties: properties,
        })
        .with_schema_id(metadata.current_schema_id())
        .with_timestamp_ms(now_ms())
        .build();

    let current_location = current_location(base)?;
    let built = delta
        .schema
        .apply(
            base,
            base.metadata().clone().into_builder(Some(current_location)),
        )?
        .add_snapshot(snapshot)
        .and_then(|b| {
            b.set_ref(
                MAIN_BRANCH,
                SnapshotReference::new(
                    new.snapshot_id,
                    SnapshotRetention::branch(None, None, None),
                ),
            )
        })
        .and_then(|b| b.build())
        .map_err(context)?;
    Ok(Planned {
        table: base.clone(),
        built,
    })
}

/// The error of a snapshot of `table` that could not be written.
fn context(table: &Table) -> impl Fn(iceberg::Error) -> Error + Copy + '_ {
    move |e| iceberg_error(e, "cannot write the snapshot").with_context("table", table.identifier())
}

impl RowDelta {
    /// The snapshot's operation, as readers tell what it did.
    fn operation(&self) -> Operation {
        if self.replace_all {
            Operation::Overwrite
        } else if !self.removed.is_empty() {
            Operation::Replace
        } else if self.delete_files.is_empty() {
            Operation::Append
        } else {
            Operation::Overwrite
        }
    }
}

/// The snapshot being written on `table` (of the schema the commit makes).
struct NewSnapshot<'a> {
    table: &'a Table,
    snapshot_id: i64,
    sequence_number: i64,
    commit_uuid: uuid::Uuid,
    schema: SchemaRef,
    spec: PartitionSpecRef,
}

impl NewSnapshot<'_> {
    /// The parent's manifests the snapshot keeps as they are, and, when
    /// `delta` removes files, the live entries of the others, data and
    /// deletes, to be written again without them.
    async fn read_parent(
        &self,
        parent: Option<&SnapshotRef>,
        delta: &RowDelta,
    ) -> Result<(Vec<ManifestFile>, [Vec<ManifestEntry>; 2])> {
        let context = context(self.table);
        let mut manifests = Vec::new();
        let mut kept: [Vec<ManifestEntry>; 2] = [Vec::new(), Vec::new()];
        let listed = match parent {
            Some(s) => self
                .table
                .manifest_list_reader(s)
                .load()
                .await
                .map_err(context)?
                .entries()
                .to_vec(),
            None => Vec::new(),
        };
        for manifest in listed {
            if delta.removed.is_empty() && !delta.replace_all {
                manifests.push(manifest);
                continue;
            }
            let side = usize::from(manifest.content == ManifestContentType::Deletes);
            let (entries, _) = manifest
                .load_manifest(self.table.file_io())
                .await
                .map_err(context)?
                .into_parts();
            kept[side].extend(
                entries
                    .iter()
                    .filter(|e| e.is_alive())
                    .map(|e| e.as_ref().clone()),
            );
        }
        Ok((manifests, kept))
    }

    /// A data and a delete manifest, as needed: the `kept` entries (those
    /// `delta` removes marked deleted) and the files it adds, each
    /// counted into `summary`.
    async fn write_manifests(
        &self,
        mut kept: [Vec<ManifestEntry>; 2],
        delta: &RowDelta,
        summary: &mut SnapshotSummaryCollector,
        manifests: &mut Vec<ManifestFile>,
    ) -> Result<()> {
        let context = context(self.table);
        let (schema, spec) = (&self.schema, &self.spec);
        let mut found = 0;
        for (side, (added, content)) in [
            (&delta.data_files, ManifestContentType::Data),
            (&delta.delete_files, ManifestContentType::Deletes),
        ]
        .into_iter()
        .enumerate()
        {
            if added.is_empty() && kept[side].is_empty() {
                continue;
            }
            let path = format!(
                "{}/metadata/{}-m{}.avro",
                self.table.metadata().location(),
                self.commit_uuid,
                manifests.len()
            );
            let output = self.table.file_io().new_output(path).map_err(context)?;
            let builder = ManifestWriterBuilder::new(
                output,
                Some(self.snapshot_id),
                schema.clone(),
                spec.as_ref().clone(),
            );
            let mut writer = match content {
                ManifestContentType::Data => builder.build_v2_data(),
                ManifestContentType::Deletes => builder.build_v2_deletes(),
            };
            for entry in std::mem::take(&mut kept[side]) {
                let sequence = entry.sequence_number.unwrap_or_default();
                if delta.replace_all || delta.removed.contains(entry.file_path()) {
                    found += 1;
                    summary.remove_file(&entry.data_file, schema.clone(), spec.clone());
                    writer
                        .add_delete_file(entry.data_file, sequence, entry.file_sequence_number)
                        .map_err(context)?;
                } else {
                    let added_by = entry.snapshot_id.unwrap_or(self.snapshot_id);
                    writer
                        .add_existing_file(
                            entry.data_file,
                            added_by,
                            sequence,
                            entry.file_sequence_number,
                        )
                        .map_err(context)?;
                }
            }
            for file in added {
                summary.add_file(file, schema.clone(), spec.clone());
                writer
                    .add_file(file.clone(), self.sequence_number)
                    .map_err(context)?;
            }
            manifests.push(writer.write_manifest_file().await.map_err(context)?);
        }
        if !delta.replace_all && found != delta.removed.len() {
            return Err(Error::new(
                ErrorKind::Lake,
                "a file the rewrite removes is no longer live in the table",
            )
            .with_context("table", self.table.identifier()));
        }
        Ok(())
    }

    /// The manifest list of `manifests`; its path.
    async fn write_manifest_list(
        &self,
        parent: Option<&SnapshotRef>,
        manifests: Vec<ManifestFile>,
    ) -> Result<String> {
        let context = context(self.table);
        let list_path = format!(
            "{}/metadata/snap-{}-1-{}.avro",
            self.table.metadata().location(),
            self.snapshot_id,
            self.commit_uuid
        );
        let list_output = self
            .table
            .file_io()
            .new_output(list_path.clone())
            .map_err(context)?;
        let mut list = ManifestListWriter::v2(
            list_output.writer().await.map_err(context)?,
            self.snapshot_id,
            parent.map(|s| s.snapshot_id()),
            self.sequence_number,
        );
        list.add_manifests(manifests.into_iter()).map_err(context)?;
        list.close().await.map_err(context)?;
        Ok(list_path)
    }
}

/// Checks that every snapshot of `base` after `snapshot` only appended;
/// a [`ErrorKind::Concurrent`] error names the first that may have
/// removed data files, or says `snapshot` is no longer in the history.
fn built_on(base: &Table, snapshot: i64) -> Result<()> {
    for s in ancestors(base) {
        if s.snapshot_id() == snapshot {
            return Ok(());
        }
        if s.summary().operation != Operation::Append {
            return Err(Error::new(
                ErrorKind::Concurrent,
                "another writer rewrote or deleted data files of the table since this run's last \
                 commit, so the rows the open batch deletes may have moved; it starts again and \
                 reads where the rows are now",
            )
            .with_context("table", base.identifier())
            .with_context("snapshot", s.snapshot_id()));
        }
    }
    Err(Error::new(
        ErrorKind::Concurrent,
        "the snapshot this run last committed is no longer in the table's history (another \
         writer replaced it); it starts again and reads where the rows are now",
    )
    .with_context("table", base.identifier())
    .with_context("snapshot", snapshot))
}

/// `total-*` of the new snapshot: the parent's totals plus what is added,
/// less what is removed.
fn totals(parent: Option<&Summary>, changed: &HashMap<String, String>) -> HashMap<String, String> {
    let triples = [
        ("total-records", "added-records", "deleted-records"),
        ("total-files-size", "added-files-size", "removed-files-size"),
        ("total-data-files", "added-data-files", "deleted-data-files"),
        (
            "total-delete-files",
            "added-delete-files",
            "removed-delete-files",
        ),
        (
            "total-position-deletes",
            "added-position-deletes",
            "removed-position-deletes",
        ),
        (
            "total-equality-deletes",
            "added-equality-deletes",
            "removed-equality-deletes",
        ),
    ];
    let number = |map: Option<&HashMap<String, String>>, key: &str| -> u64 {
        map.and_then(|m| m.get(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    triples
        .iter()
        .map(|(total, add, remove)| {
            let value = (number(parent.map(|s| &s.additional_properties), total)
                + number(Some(changed), add))
            .saturating_sub(number(Some(changed), remove));
            ((*total).to_owned(), value.to_string())
        })
        .collect()
}

fn unique_snapshot_id(table: &Table) -> i64 {
    loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) & (i64::MAX as u64)) as i64;
        if id != 0 && !table.metadata().snapshots().any(|s| s.snapshot_id() == id) {
            return id;
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
