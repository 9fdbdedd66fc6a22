//! `wal2iceberg run`: serves the metrics when asked to, then hands over to
//! the pipeline's front door, [`crate::apply::run`], and says what it did.

use std::net::SocketAddr;

use crate::apply::RunOptions;
use crate::error::Result;
use crate::pg::config::PgConfig;

/// Runs the pipeline until it ends; the line that sums it up.
pub async fn run(
    source: &PgConfig,
    options: &RunOptions,
    metrics_addr: Option<SocketAddr>,
) -> Result<String> {
    if let Some(addr) = metrics_addr {
        crate::metrics::serve(addr).await?;
    }
    let report = crate::apply::run(source, options).await?;
    Ok(format!(
        "applied {} changes in {} batches; confirmed {}",
        report.changes_applied, report.batches, report.confirmed
    ))
}
