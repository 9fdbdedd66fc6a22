//! The `wal2iceberg` command line (src/ops/cli).

#![forbid(unsafe_code)]

use std::process::ExitCode;

/// mimalloc 2, not the system allocator: glibc's per-thread arenas kept
/// freed batches and Parquet buffers, so a load of 10^7 rows with a
/// 92 MB heap peaked at 231 MB resident; with mimalloc 2 at 160 MB.
/// mimalloc 3 (the crate's default) holds freed memory for 10 s before
/// it returns it, and peaked at 213 to 228 MB (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    wal2iceberg::ops::cli::main().await
}
