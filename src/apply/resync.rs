//! Resync requests: a table's silver reloaded from a new snapshot while
//! the stream goes on (`wal2iceberg resync`, `crate::ops::resync`, or the
//! run itself when a schema change asks for it); bronze keeps its history
//! and gets the reload's rows as reads at the snapshot's position.
//!
//! A request is recorded on T's bronze table (table properties, so it
//! works beside a running run and without one). A run that streams looks
//! for requests every [`POLL`]; seeing one, it commits what it holds at a
//! transaction boundary and starts over, and the start loads T from a
//! temporary slot's snapshot, as it loads a table the lake lacks. That load
//! commits silver first, with every row it held before deleted in the same
//! snapshot, so readers see the old rows or the new ones, never neither;
//! then bronze, the reload's rows at the snapshot's position with bronze's
//! own position left where it was, so the changes between that and the
//! snapshot still reach bronze (their unchanged TOAST values filled from
//! bronze's history, `lake::table::gap`). Bronze's commit records the request
//! (snapshot summary [`RESYNCED`]) and then the table [`DONE`]: a crash
//! before bronze's commit does the whole resync again, one after it only
//! records it done.

use std::time::Duration;

use iceberg::TableIdent;
use iceberg::table::Table;

use crate::error::Result;
use crate::lake::catalog::Lake;
use crate::lake::files::writer::ancestors;
use crate::lake::schema::{HISTORY_ONLY, KEYED, RETIRED, history_only};

/// Bronze's properties: the latest request, and the latest one done.
pub(crate) const REQUESTED: &str = "wal2iceberg.resync-requested";
pub(crate) const DONE: &str = "wal2iceberg.resync-done";
/// Bronze's property: the latest request a run under `--backfill chunked`
/// may do by the chunked backfill (docs/backfill.md). Only the user's
/// requests are: those a schema change or a rewrite makes need silver's
/// schema rebuilt by a reload's one commit.
pub(crate) const IN_CHUNKS: &str = "wal2iceberg.resync-in-chunks";
/// The snapshot summary property of bronze's commit of a reload's rows.
pub(crate) const RESYNCED: &str = "wal2iceberg.resynced";

/// How often a streaming run looks for requests.
pub const POLL: Duration = Duration::from_secs(5);

/// The request pending on `bronze`: one not done yet; none for a table
/// without silver, which no request can reload.
pub(crate) fn pending(bronze: &Table) -> Option<String> {
    if history_only(bronze) {
        return None;
    }
    let properties = bronze.metadata().properties();
    let requested = properties.get(REQUESTED)?;
    (properties.get(DONE) != Some(requested)).then(|| requested.clone())
}

/// Whether bronze's commit of request `id`'s rows landed: a crash came
/// before it was recorded done.
pub(crate) fn committed(bronze: &Table, id: &str) -> bool {
    ancestors(bronze).any(|s| {
        s.summary()
            .additional_properties
            .get(RESYNCED)
            .map(String::as_str)
            == Some(id)
    })
}

/// Records a new request on the bronze table `ident`; its id.
pub(crate) async fn request_on(lake: &Lake, ident: &TableIdent) -> Result<String> {
    request(lake, ident, &[REQUESTED]).await
}

/// Records the user's request on the bronze table `ident`, which may be
/// done in chunks ([`IN_CHUNKS`]); its id.
pub(crate) async fn request_by_user(lake: &Lake, ident: &TableIdent) -> Result<String> {
    request(lake, ident, &[REQUESTED, IN_CHUNKS]).await
}

/// A new request's id, recorded under each of `keys` on `ident`.
async fn request(lake: &Lake, ident: &TableIdent, keys: &[&'static str]) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    let values: Vec<_> = keys.iter().map(|&k| (k, id.clone())).collect();
    lake.update_properties(ident, &values).await?;
    Ok(id)
}

/// Whether request `id` on `bronze` may be done in chunks.
pub(crate) fn in_chunks(bronze: &Table, id: &str) -> bool {
    bronze
        .metadata()
        .properties()
        .get(IN_CHUNKS)
        .map(String::as_str)
        == Some(id)
}

/// Records on the bronze table `ident` of a table without a primary key
/// until now that it has one, and a request that loads its new silver
/// table in the same commit; the request's id. Bronze keeps its history.
pub(crate) async fn request_silver(lake: &Lake, ident: &TableIdent) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    let keyed = (HISTORY_ONLY.0, KEYED.to_owned());
    lake.update_properties(ident, &[keyed, (REQUESTED, id.clone())])
        .await?;
    Ok(id)
}

/// Records on the bronze table `ident` that its source table has no
/// primary key any more: the table is its history only again, and the
/// next start drops its silver; a request pending is done, as there is no
/// silver left to reload.
pub(crate) async fn retire_silver(lake: &Lake, ident: &TableIdent) -> Result<()> {
    let mut values = vec![(HISTORY_ONLY.0, RETIRED.to_owned())];
    values.extend(pending(&lake.catalog_table(ident).await?).map(|id| (DONE, id)));
    lake.update_properties(ident, &values).await
}

/// Records on the bronze table `ident` that the silver table it retired
/// is gone.
pub(crate) async fn silver_dropped(lake: &Lake, ident: &TableIdent) -> Result<()> {
    lake.update_properties(ident, &[(HISTORY_ONLY.0, HISTORY_ONLY.1.to_owned())])
        .await
}

/// Records request `id` done on the bronze table `ident`.
pub(crate) async fn mark_done(lake: &Lake, ident: &TableIdent, id: &str) -> Result<()> {
    lake.update_properties(ident, &[(DONE, id.to_owned())])
        .await
}
