//! Iceberg: schemas and type mapping (more to come: Arrow batches, the
//! bronze and silver writers, commits).
//!
//! - `arrow`: typed values to Arrow arrays of the mapped column types.
//! - `bronze`: bronze rows, one per change, as record batches.
//! - `catalog`: the embedded SQL catalog on SQLite and table creation.
//! - `row_delta`: the snapshot that adds data and position-delete files.
//! - `schema`: the bronze and silver schemas and the type mapping.
//! - `writer`: Parquet data files and the append commit with its LSN.

pub mod arrow;
pub mod bronze;
pub mod catalog;
pub mod row_delta;
pub mod schema;
pub mod writer;
