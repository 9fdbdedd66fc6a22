//! `wal2iceberg resync --table T`: records a request for T's silver to be
//! reloaded from a new snapshot (`crate::apply::resync`), and waits for a
//! run to do it when asked.

use std::time::Duration;

use iceberg::{NamespaceIdent, TableIdent};

use crate::apply::backfill::INCOMPLETE;
use crate::apply::resync::{DONE, request_by_user};
use crate::apply::table_set;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::{Lake, LakeLocation};
use crate::lake::files::writer::Position;
use crate::lake::schema::history_only;
use crate::model::TableName;

pub struct ResyncOptions {
    pub table: TableName,
    /// The Iceberg name settings chose for it, if any.
    pub name: Option<String>,
    pub lake: LakeLocation,
    pub namespace: NamespaceIdent,
    /// Wait this long for a run to do it.
    pub wait: Option<Duration>,
}

/// What became of the request.
#[derive(Debug, PartialEq, Eq)]
pub enum Resync {
    /// Recorded; a run does it.
    Requested { id: String, bronze: TableIdent },
    /// Recorded and done within the wait.
    Done { id: String, bronze: TableIdent },
}

/// Records a resync request for `options.table`, refused for a table the
/// lake does not hold loaded or that has no silver.
pub async fn request(options: &ResyncOptions) -> Result<Resync> {
    let lake = Lake::open_existing(&options.lake).await?;
    let name = match &options.name {
        Some(name) => name.clone(),
        None => table_set::recorded_name(&lake, &options.namespace, &options.table, None).await?,
    };
    let ident = TableIdent::new(options.namespace.clone(), format!("{name}_changes"));
    let silver_ident = TableIdent::new(options.namespace.clone(), name);
    let refused = |why: &str| {
        Error::new(
            ErrorKind::Config,
            format!("cannot resync {}: {why}", options.table),
        )
        .with_context("table", &ident)
    };
    let bronze = lake
        .table_if_exists(&ident)
        .await?
        .ok_or_else(|| refused("the lake does not hold it; a run that names it loads it"))?;
    if history_only(&bronze) {
        return Err(refused(
            "it has no primary key, so the lake keeps its history only, which a new snapshot \
             cannot redo",
        ));
    }
    if Position::of(&bronze)?.is_none() {
        return Err(refused("its initial load has not landed yet"));
    }
    let id = request_by_user(&lake, &ident).await?;
    let Some(wait) = options.wait else {
        return Ok(Resync::Requested { id, bronze: ident });
    };
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let bronze = lake.catalog_table(&ident).await?;
        if bronze.metadata().properties().get(DONE) != Some(&id) {
            continue;
        }
        // A resync in chunks is done once its backfill is.
        let silver = lake.catalog_table(&silver_ident).await?;
        if !silver.metadata().properties().contains_key(INCOMPLETE.0) {
            return Ok(Resync::Done { id, bronze: ident });
        }
    }
    Err(Error::new(
        ErrorKind::Slot,
        format!(
            "resync of {} requested, not done within {wait:?}: no run is streaming, or it is \
             busy; the request stays, and the next run does it",
            options.table
        ),
    )
    .with_context("request", &id))
}
