//! The change-data-capture domain.
//!
//! - `value`, `temporal`: typed values from PostgreSQL's text output.
//! - `relation`: relation descriptions, their cache and catalog look-ups.
//! - `event`: transactions and row changes as the rest of the program sees them.
//! - `assembler`: pgoutput messages to events, streamed transactions spooled.
//! - `partition_rows`: attached and truncated partitions' rows, from the messages of their triggers.
//! - `snapshot`: the initial load from the slot's exported snapshot.
//! - `backfill`: a table read in key-range chunks beside the stream.
//! - `stream`: the running change stream and its confirmation rules.
//! - `capture`: preflight, publication and slot, then load or resume.
//! - `source`: what the pipeline asks of the source outside the stream.

pub mod assembler;
pub(crate) mod backfill;
pub mod capture;
pub mod event;
pub(crate) mod partition_rows;
pub mod relation;
pub(crate) mod snapshot;
pub(crate) mod source;
pub mod stream;
pub mod temporal;
pub mod value;
