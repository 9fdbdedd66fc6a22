//! `wal2iceberg expire-snapshots`: the expiry a run does by itself after
//! its commits (src/lake/maintenance/expire.rs), on demand and with a
//! retention of the operator's, then the orphan files of a table that had
//! no snapshot to expire. It holds the lake's writer lock: beside a run,
//! that run's commits would win every race, for nothing.

use iceberg::TableIdent;

use crate::error::Result;
use crate::lake::catalog::{Lake, LakeLocation};
use crate::lake::lock::WriterLock;
use crate::lake::maintenance::expire::{Expired, Retention, expire_snapshots, remove_orphan_files};

/// Expires the snapshots of each table of `idents` that `retention` lets
/// go; what was deleted, per table.
pub async fn expire(
    lake: &Lake,
    location: &LakeLocation,
    idents: Vec<TableIdent>,
    retention: Retention,
) -> Result<Vec<(TableIdent, Expired)>> {
    let _locks = WriterLock::acquire_all(location, &idents).await?;
    let mut done = Vec::new();
    for ident in idents {
        let mut expired = expire_snapshots(lake, &ident, retention).await?;
        if expired.snapshots == 0 {
            expired.orphans_deleted =
                remove_orphan_files(lake, &ident, retention.older_than).await?;
        }
        done.push((ident, expired));
    }
    Ok(done)
}
