//! wal2iceberg: PostgreSQL logical replication (pgoutput) into Apache
//! Iceberg tables. Data flows Postgres wire -> change events -> Iceberg.
//!
//! - [`pg`]: the wire only. Connections, replication protocol, pgoutput
//!   decoding, catalog queries, COPY framing.
//! - [`cdc`]: the domain. Typed values, relations, change events, the
//!   initial load and the change stream with its confirmation rules.
//! - [`lake`]: Iceberg: schemas and type mapping.
//! - [`ops`]: what operators run: `tail`, the throwaway Postgres behind
//!   `demo` and the tests.
//! - [`error`]: the one error type and the retry decision.

pub mod cdc;
pub mod error;
pub mod lake;
pub mod ops;
pub mod pg;

pub use error::{Error, ErrorKind, Result};
