//! The PostgreSQL wire: no Iceberg or domain types in here.
//!
//! - `config`: connection settings by libpq's conventions.
//! - `tls`: rustls settings for each `sslmode`.
//! - `conn`: the replication connection (startup, auth, framing).
//! - `replication`: replication commands and the CopyBoth stream, on a
//!   task of its own that owns the connection.
//! - `pgoutput`: pgoutput messages decoded over `Bytes`.
//! - `copy`: binary COPY rows split out of the byte stream.
//! - `source`: the ordinary connection: preflight, publication, catalog.
//! - `lsn`: the `Lsn` newtype.
//! - `wire`: the bounds-checked reader every decoder here reads through.

pub mod config;
pub mod conn;
pub mod copy;
pub mod pgoutput;
pub mod replication;
pub mod source;
pub(crate) mod tls;
pub(crate) mod wire;
