//! What operators run.
//!
//! - `demo`: the seed walkthrough against a throwaway PostgreSQL.
//! - `tail`: prints the decoded change stream as JSON lines.
//! - `run`: the pipeline, change stream to bronze and silver tables.
//! - `scratch`: a throwaway PostgreSQL server for the demo and the tests.

pub mod demo;
pub mod run;
pub mod scratch;
pub mod tail;
