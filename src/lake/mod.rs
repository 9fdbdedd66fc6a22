//! Iceberg: what the change stream becomes (`apply::run` drives it).
//!
//! - `align`: a file's rows in its table's current schema, by field id.
//! - `arrow`: typed values to Arrow arrays of the mapped column types, and
//!   back.
//! - `bronze`: bronze rows, one per change, and the staged bronze batch.
//! - `catalog`: the embedded SQL catalog on SQLite and table creation.
//! - `compaction`: the compaction policy, and bronze's (silver's is in
//!   `silver`).
//! - `evolve`: following ADD, DROP and RENAME COLUMN and promotions.
//! - `expire`: snapshot expiry and the files only expired snapshots read.
//! - `gap`: unchanged TOAST values of changes bronze takes alone, after
//!   silver was loaded again at a later point.
//! - `key`: primary keys as bytes for silver's index.
//! - `key_index`: silver's index of live rows, spilling to sorted runs.
//! - `listing`: the files under a table's folder, local, on S3 or on GCS,
//!   with their ages, for the orphan sweep and drop-table.
//! - `lock`: one writing process per namespace of a lake.
//! - `position_deletes`: position delete files written, read and merged
//!   as streams of pairs.
//! - `rest_commit`, `rest_tables`: a REST catalog's commits, and its
//!   tables loaded with the credentials it vends.
//! - `row_delta`: the snapshot that adds data and position-delete files.
//! - `scan`: reading a table's rows, older files of evolved structs too.
//! - `silver`: the current-state table, its key index and staged batch.
//! - `schema`: the bronze and silver schemas and the type mapping.
//! - `staged_schema`: schema changes committed with the batch's rows.
//! - `sorted_run`: the key index's files on local disk.
//! - `storage`: where the files live: a folder, S3 or GCS, and their
//!   settings.
//! - `writer`: Parquet data files and the source position of a snapshot.

pub mod align;
pub mod arrow;
pub mod bronze;
pub mod catalog;
pub mod catalog_commit;
pub mod catalog_db;
pub mod catalog_uri;
pub mod compaction;
pub mod durable_fs;
pub mod evolve;
pub mod expire;
pub mod gap;
pub mod glue;
pub mod glue_commit;
pub mod key;
pub mod key_index;
pub mod listing;
pub mod lock;
pub mod position_deletes;
pub mod rest_commit;
pub mod rest_tables;
pub mod row_delta;
pub mod scan;
pub mod schema;
pub mod silver;
pub mod sorted_run;
pub mod staged_schema;
pub mod storage;
pub mod writer;

/// Runs `writes` (one per table: its files, manifests or metadata) at most
/// a few at a time, in order: on object storage each is a round trip a
/// flush would otherwise wait for in turn, and a flush of hundreds of
/// tables must not open hundreds of uploads at once.
pub async fn each_table<T, F>(writes: impl IntoIterator<Item = F>) -> crate::error::Result<Vec<T>>
where
    F: std::future::Future<Output = crate::error::Result<T>>,
{
    use futures_util::{StreamExt, TryStreamExt};
    // Collected first: a lazy iterator held across the awaits makes the
    // caller's future not `Send` (rust-lang/rust#102211).
    let writes: Vec<F> = writes.into_iter().collect();
    futures_util::stream::iter(writes)
        .buffered(8)
        .try_collect()
        .await
}

/// An error of the iceberg crates, retryable (an I/O error) when they say so.
pub(crate) fn iceberg_error(err: iceberg::Error, message: &str) -> crate::error::Error {
    use crate::error::{Error, ErrorKind};
    let kind = if err.retryable() {
        ErrorKind::Io
    } else {
        ErrorKind::Lake
    };
    Error::new(kind, message.to_owned()).with_source(err)
}

/// The location of the table's current metadata file.
pub fn current_location(table: &iceberg::table::Table) -> crate::error::Result<String> {
    use crate::error::{Error, ErrorKind};
    table.metadata_location().map(str::to_owned).ok_or_else(|| {
        Error::new(ErrorKind::Lake, "the table has no metadata location")
            .with_context("table", table.identifier())
    })
}
