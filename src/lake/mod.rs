//! Iceberg: what the change stream becomes. Not yet wired into a `run`
//! command: the pieces are tested one by one against pyiceberg.
//!
//! - `arrow`: typed values to Arrow arrays of the mapped column types.
//! - `bronze`: bronze rows, one per change, as record batches.
//! - `catalog`: the embedded SQL catalog on SQLite and table creation.
//! - `row_delta`: the snapshot that adds data and position-delete files.
//! - `silver`: the current-state table, its key index and batch apply.
//! - `schema`: the bronze and silver schemas and the type mapping.
//! - `writer`: Parquet data files and the append commit with its LSN.

pub mod arrow;
pub mod bronze;
pub mod catalog;
pub mod row_delta;
pub mod schema;
pub mod silver;
pub mod writer;
