//! Integration tests against a real PostgreSQL started by the harness.

mod support;

#[global_allocator]
static ALLOCATOR: support::alloc::ThreadCounting = support::alloc::ThreadCounting;

mod atomic_commits;
mod auth;
mod backfill;
mod before_images;
mod catalog_glue;
mod catalog_postgres;
mod catalog_rest;
mod chaos;
mod cli;
mod ddl_oracle;
mod faults;
mod feedback;
mod initial_load;
mod lag;
mod lake;
mod layering;
mod maintenance;
mod object_store;
mod packaging;
mod parallel_starts;
mod partitions;
mod pipeline;
mod preflight;
mod schema_changes;
mod schema_kinds;
mod seed_walkthrough;
mod slot_adoption;
mod slot_identity;
mod slow_lake;
mod storage_faults;
mod streaming;
mod types;
mod values;
mod verify;
