//! Iceberg: schemas and type mapping (more to come: Arrow batches, the
//! bronze and silver writers, commits).
//!
//! - `catalog`: the embedded SQL catalog on SQLite and table creation.
//! - `schema`: the bronze and silver schemas and the type mapping.

pub mod catalog;
pub mod schema;
