//! Iceberg: what the change stream becomes (`apply::run` drives it).
//!
//! Each folder owns one concept and says what in its `mod.rs`:
//!
//! - `catalog`: the catalogs (SQL on SQLite or PostgreSQL, REST, Glue),
//!   table creation, and each backend's commit; `row_delta` is the one
//!   snapshot that adds data and position-delete files.
//! - `storage`: where the files live (a folder, S3 or GCS), the durable
//!   local file system, and listing a table's files.
//! - `files`: Arrow arrays of typed values, Parquet data files, position
//!   delete files, and reading files back in the current schema.
//! - `schema`: the bronze and silver schemas and the type mapping, their
//!   evolution, and schema changes committed with a batch.
//! - `table`: bronze, silver, silver's key index and its sorted runs, and
//!   bronze's unchanged-TOAST gap filling.
//! - `maintenance`: compaction's policy and bronze's compaction, snapshot
//!   expiry and the orphan sweep.
//! - `lock`: one writing process per namespace of a lake.

pub mod catalog;
pub mod files;
pub mod lock;
pub mod maintenance;
pub mod schema;
pub(crate) mod storage;
pub mod table;

/// Runs `writes` (one per table: its files, manifests or metadata) at most
/// a few at a time, in order: on object storage each is a round trip a
/// flush would otherwise wait for in turn, and a flush of hundreds of
/// tables must not open hundreds of uploads at once.
pub(crate) async fn each_table<T, F>(
    writes: impl IntoIterator<Item = F>,
) -> crate::error::Result<Vec<T>>
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
pub(crate) fn current_location(table: &iceberg::table::Table) -> crate::error::Result<String> {
    use crate::error::{Error, ErrorKind};
    table.metadata_location().map(str::to_owned).ok_or_else(|| {
        Error::new(ErrorKind::Lake, "the table has no metadata location")
            .with_context("table", table.identifier())
    })
}
