//! `wal2iceberg teardown`: drops what wal2iceberg created on the source,
//! the slot and (only if wal2iceberg created it and no other slot of the
//! database may read it) the publication, and on request the lake's
//! tables. A slot in use is never dropped. Each step reports what it did
//! or why it could not; the command exits non-zero when something it was
//! to drop is left.

use iceberg::NamespaceIdent;

use crate::apply::naming::{remove_state_folder, state_folder};
use crate::apply::table_set;
use crate::cdc::temporal::format_timestamp_utc;
use crate::error::{Error, ErrorKind, Result, postgres};
use crate::lake::catalog::{Lake, LakeLocation};
use crate::lake::iceberg_error;
use crate::ops::status::oldest_pending_commit;
use crate::pg::config::PgConfig;
use crate::pg::replication::quote_ident;
use crate::pg::source::{CREATED_BY_MARK, SourceClient};

pub struct TeardownOptions {
    pub slot: String,
    pub publication: String,
    /// The lake and its namespace: its tables that record the slot no
    /// longer claim it once it is dropped.
    pub lake: LakeLocation,
    pub namespace: NamespaceIdent,
    /// Also drop every table of the namespace, files included, and the
    /// namespace's folder of this state directory.
    pub drop_tables: Option<std::path::PathBuf>,
    /// Drop the slot even when it holds changes the kept lake lacks.
    pub force: bool,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct TeardownReport {
    pub slot_dropped: bool,
    /// The bronze tables kept that claimed the slot and no longer do.
    pub released: Vec<String>,
    pub publication: Publication,
    pub tables_dropped: Vec<String>,
}

/// What became of the publication.
#[derive(Debug, Default, PartialEq, Eq)]
pub enum Publication {
    #[default]
    DidNotExist,
    Dropped,
    /// Made by someone else: never wal2iceberg's to drop.
    NotOurs,
    /// Other logical slots of the database, which may read it.
    SharedWith(Vec<String>),
    /// The role may not drop it: the statement an owner runs.
    NotPermitted(String),
}

impl TeardownReport {
    /// Whether something teardown was to drop is left.
    pub fn incomplete(&self) -> bool {
        matches!(self.publication, Publication::NotPermitted(_))
    }

    /// What became of each thing `options` named, a line each.
    pub fn to_text(&self, options: &TeardownOptions) -> String {
        let (slot, publication) = (&options.slot, &options.publication);
        let mut text = format!(
            "slot {slot}: {}\n",
            if self.slot_dropped {
                "dropped"
            } else {
                "did not exist"
            }
        );
        for table in &self.released {
            text += &format!(
                "table {table}: kept; it no longer claims slot {slot}, so a slot made later \
                 under that name is not taken for its own (its history cannot go on from a new \
                 slot)\n"
            );
        }
        let fate = match &self.publication {
            Publication::Dropped => "dropped".to_owned(),
            Publication::DidNotExist => "did not exist".to_owned(),
            Publication::NotOurs => "kept (not created by wal2iceberg)".to_owned(),
            Publication::SharedWith(slots) => format!(
                "kept: other slots of this database may read it ({}); a teardown of the last one \
                 drops it",
                slots.join(", ")
            ),
            Publication::NotPermitted(sql) => format!(
                "NOT dropped: only its owner or a superuser may; as one, run teardown again or: \
                 {sql}"
            ),
        };
        text += &format!("publication {publication}: {fate}\n");
        for table in &self.tables_dropped {
            text += &format!("table {table}: dropped\n");
        }
        text
    }
}

pub async fn teardown(config: &PgConfig, options: &TeardownOptions) -> Result<TeardownReport> {
    let client = SourceClient::connect(config).await?;
    let mut report = TeardownReport::default();
    let slot = client
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&options.slot],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_replication_slots"))?;
    if let Some(pid) = slot.as_ref().and_then(|row| row.get::<_, Option<i32>>(0)) {
        return Err(Error::new(
            ErrorKind::Slot,
            format!(
                "replication slot {:?} is in use: the server's walsender process {pid} \
                 serves it to a client (a wal2iceberg run, whose own process this is not); \
                 stop that client first",
                options.slot
            ),
        ));
    }
    // A kept lake that takes its changes from the slot would never get
    // what the slot still holds for it.
    if slot.is_some()
        && options.drop_tables.is_none()
        && !options.force
        && table_set::lake_replicates_slot(&options.lake, &options.namespace, &options.slot).await?
        && let Some(held) = unconfirmed(&client, &options.slot, &options.publication).await?
    {
        return Err(Error::new(
            ErrorKind::Slot,
            format!(
                "replication slot {:?} holds {held}; dropping it loses them for good: run the \
                 pipeline until it caught up (wal2iceberg run --exit-when-idle 10s), or pass \
                 --force to drop it anyway (--drop-tables drops the lake too); nothing dropped",
                options.slot
            ),
        ));
    }
    // Released before the drop (and when someone dropped it already): a
    // lake that still claims no slot is refused, never wrongly resumed.
    if options.drop_tables.is_none() {
        report.released = table_set::release_slot(&options.lake, &options.namespace, &options.slot)
            .await?
            .iter()
            .map(ToString::to_string)
            .collect();
    }
    if slot.is_some() {
        client
            .execute("SELECT pg_drop_replication_slot($1)", &[&options.slot])
            .await
            .map_err(|e| {
                postgres(e, "cannot drop the replication slot").with_context("slot", &options.slot)
            })?;
        report.slot_dropped = true;
    }
    let publication = client
        .query_opt(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
            &[&options.publication],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_publication"))?;
    if let Some(row) = publication {
        report.publication = if row.get::<_, Option<String>>(0).as_deref() != Some(CREATED_BY_MARK)
        {
            Publication::NotOurs
        } else {
            let others: Vec<String> = client
                .query(
                    "SELECT slot_name::text FROM pg_replication_slots \
                     WHERE slot_type = 'logical' AND plugin = 'pgoutput' \
                       AND database = current_database() AND slot_name <> $1 \
                     ORDER BY 1",
                    &[&options.slot],
                )
                .await
                .map_err(|e| postgres(e, "cannot read pg_replication_slots"))?
                .iter()
                .map(|r| r.get(0))
                .collect();
            if others.is_empty() {
                drop_publication(&client, &options.publication).await?
            } else {
                Publication::SharedWith(others)
            }
        };
    }
    if let Some(state_dir) = &options.drop_tables {
        report.tables_dropped = drop_tables(&options.lake, &options.namespace).await?;
        remove_state_folder(&state_folder(state_dir, &options.namespace, None))?;
    }
    Ok(report)
}

/// What `slot` holds that the lake has not confirmed, when that includes
/// a transaction of the publication (or cannot be told): the bytes of WAL
/// past its confirmed position, and the oldest such commit.
async fn unconfirmed(
    client: &SourceClient,
    slot: &str,
    publication: &str,
) -> Result<Option<String>> {
    let bytes: Option<i64> = client
        .query_opt(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_replication_slots"))?
        .and_then(|row| row.get(0));
    let Some(bytes) = bytes.filter(|b| *b > 0) else {
        return Ok(None);
    };
    Ok(
        match oldest_pending_commit(client, slot, false, publication).await {
            Ok(None) => None,
            Ok(Some(commit)) => Some(format!(
                "{bytes} bytes of WAL past what the lake confirmed, with changes the lake lacks \
                 (the oldest committed at {})",
                format_timestamp_utc(commit)
            )),
            Err(e) => Some(format!(
                "{bytes} bytes of WAL past what the lake confirmed, which may hold changes the \
                 lake lacks ({})",
                postgres(e, "cannot peek at them")
            )),
        },
    )
}

async fn drop_publication(client: &SourceClient, publication: &str) -> Result<Publication> {
    let sql = format!("DROP PUBLICATION {}", quote_ident(publication));
    match client.batch_execute(&sql).await {
        Ok(()) => Ok(Publication::Dropped),
        Err(e) if e.code().map(|c| c.code()) == Some("42501") => {
            Ok(Publication::NotPermitted(format!("{sql};")))
        }
        Err(e) => {
            Err(postgres(e, "cannot drop the publication").with_context("publication", publication))
        }
    }
}

/// Drops every table of the namespace from the catalog and deletes its
/// folder.
async fn drop_tables(lake: &LakeLocation, namespace: &NamespaceIdent) -> Result<Vec<String>> {
    if !lake.catalog.may_exist() {
        return Ok(Vec::new());
    }
    let lake = Lake::open(lake).await?;
    let catalog = lake.catalog();
    if !catalog
        .namespace_exists(namespace)
        .await
        .map_err(|e| iceberg_error(e, "cannot read the catalog"))?
    {
        return Ok(Vec::new());
    }
    let mut dropped = Vec::new();
    for ident in catalog
        .list_tables(namespace)
        .await
        .map_err(|e| iceberg_error(e, "cannot list the lake's tables"))?
    {
        lake.drop_with_files(&ident).await?;
        dropped.push(ident.to_string());
    }
    Ok(dropped)
}
