//! What operators run.
//!
//! - `tail`: prints the decoded change stream as JSON lines.
//! - `scratch`: a throwaway PostgreSQL server for the demo and the tests.

pub mod scratch;
pub mod tail;
