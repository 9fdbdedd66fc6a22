//! What operators run.
//!
//! - `cli`: the command line, which `src/main.rs` runs.
//! - `compact`: compaction on demand, under the lake's writer lock.
//! - `demo`: the seed walkthrough against a throwaway PostgreSQL.
//! - `expire`: snapshot expiry on demand, under the lake's writer lock.
//! - `drop_table`: one source table out of the lake and the publication.
//! - `tail`: prints the decoded change stream as JSON lines.
//! - `resync`: asks for one table's silver to be reloaded beside a running run.
//! - `run`: the pipeline, change stream to bronze and silver tables,
//!   through its front door `apply::run`.
//! - `setup`: the source's role and publication, from `migrations/`.
//! - `show`: a lake table printed through our own reader.
//! - `status`: the slot and each lake table's position and lag.
//! - `teardown`: drops the slot, our publication and on request the tables.
//! - `verify`: compares the source with bronze and silver at one position.
//! - `scratch`: a throwaway PostgreSQL server for the demo and the tests.

pub mod cli;
pub mod compact;
pub mod demo;
pub mod drop_table;
pub mod expire;
pub mod resync;
pub mod run;
pub mod scratch;
pub mod setup;
pub mod show;
pub mod status;
pub mod tail;
pub mod teardown;
pub mod verify;
