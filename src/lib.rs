//! wal2iceberg: PostgreSQL logical replication (pgoutput) into Apache
//! Iceberg tables. Data flows Postgres wire -> change events -> Iceberg.
//!
//! - [`model`]: the words every layer shares: [`model::Lsn`] and
//!   [`model::TableName`]. Below everything; depends on nothing.
//! - [`pg`]: the wire only. Connections, replication protocol, pgoutput
//!   decoding, catalog queries, COPY framing.
//! - [`cdc`]: the domain. Typed values, relations, change events, the
//!   initial load and the change stream with its confirmation rules.
//! - [`lake`]: Iceberg: schemas, type mapping, files, commits, silver.
//! - [`apply`]: the pipeline between the two: batches, one sink per
//!   table, the initial load, compaction and expiry, confirmation.
//! - [`ops`]: what operators run: `run`, `tail`, `demo`, `show`, and the
//!   throwaway Postgres behind `demo` and the tests.
//! - [`config`]: settings from the config file, environment and flags.
//! - [`metrics`]: Prometheus metrics and their HTTP endpoint.
//! - [`error`]: the one error type and the retry decision.
//! - [`blocking`]: blocking work kept off the stream task's way.
//! - [`shutdown`]: the stop request from SIGINT and SIGTERM.
//! - [`failpoint`]: crash points, compiled into test builds only.
//! - [`terminal`]: progress bars on an interactive terminal.

#![forbid(unsafe_code)]

pub mod apply;
pub(crate) mod blocking;
pub mod cdc;
pub mod config;
pub mod error;
pub mod failpoint;
pub mod lake;
pub(crate) mod metrics;
pub mod model;
pub mod ops;
pub mod pg;
pub mod shutdown;
pub(crate) mod terminal;

pub use error::{Error, ErrorKind, Result};
