//! `wal2iceberg compact`: the compaction a run does by itself
//! (src/lake/maintenance/compaction.rs, src/lake/table/silver/compaction.rs), on demand and
//! to the end: every small file is merged, not just the newest size tier,
//! in rounds until nothing is left to merge. It holds the lake's writer lock, so it never runs beside
//! a run on the same namespace.

use iceberg::TableIdent;

use crate::error::Result;
use crate::lake::catalog::{Lake, LakeLocation};
use crate::lake::lock::WriterLock;
use crate::lake::maintenance::compaction::{Compacted, Merge, merge_small_files};
use crate::lake::table::silver::SilverTable;

/// Rounds per table at most: each merges one size tier, and tiers grow
/// geometrically, so a few dozen cover any table.
const MAX_ROUNDS: usize = 32;

/// Compacts each table of `idents` (bronze or silver, told apart by
/// bronze's `_cdc_op` column); what each compaction did, summed per table.
pub async fn compact(
    lake: &Lake,
    location: &LakeLocation,
    idents: &[TableIdent],
) -> Result<Vec<(TableIdent, Compacted)>> {
    let _locks = WriterLock::acquire_all(location, idents).await?;
    let mut done = Vec::new();
    for ident in idents {
        let table = lake.catalog_table(ident).await?;
        let bronze = table
            .metadata()
            .current_schema()
            .field_by_name("_cdc_op")
            .is_some();
        let mut total = Compacted::default();
        let mut silver = if bronze {
            None
        } else {
            Some(SilverTable::open_existing(lake, ident.clone()).await?)
        };
        for _ in 0..MAX_ROUNDS {
            let round = match silver.as_mut() {
                Some(silver) => silver.compact_now(lake, Merge::All).await?,
                None => merge_small_files(lake, ident, Merge::All).await?,
            };
            let Some(round) = round else {
                break;
            };
            total += round;
        }
        done.push((ident.clone(), total));
    }
    Ok(done)
}
