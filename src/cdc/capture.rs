//! Opening a capture: preflight, publication, slot, then either an initial
//! load followed by streaming (new slot) or streaming where the slot left
//! off (existing slot).

use std::sync::Arc;

use super::assembler::Assembler;
use super::relation::{Catalog, RelationInfo};
use super::snapshot::SnapshotLoad;
use super::stream::ChangeStream;
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Lsn, SlotInfo, TableName};
use crate::pg::config::PgConfig;
use crate::pg::conn::ReplicationConnection;
use crate::pg::replication::{CreatedSlot, StartOptions};
use crate::pg::source::{self, CheckFailure, SourceClient};

/// How long a stream's start waits for the WAL of commits acknowledged
/// before it to be flushed (`exit_when_idle` waits for what was
/// committed before the stream began; `pg::source::flushed_wal_end`).
const FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Default names; one slot and one publication per wal2iceberg pipeline.
pub(crate) const DEFAULT_SLOT: &str = "wal2iceberg";
pub(crate) const DEFAULT_PUBLICATION: &str = "wal2iceberg";

#[derive(Debug, Clone)]
pub struct CaptureOptions {
    pub tables: Vec<TableName>,
    pub slot: String,
    pub publication: String,
    /// pgoutput protocol version, 1 or 2.
    pub proto_version: u32,
    /// Stream large transactions before they commit (needs version 2).
    pub streaming: bool,
    /// Also deliver logical decoding messages.
    pub(crate) messages: bool,
    /// Read each table whose key allows it by the chunked backfill
    /// (docs/backfill.md) rather than in a new slot's snapshot.
    pub(crate) backfill_chunked: bool,
    /// Tables read whole in a snapshot even so: reloads a schema change
    /// or a rewrite asked for, whose silver schema the reload rebuilds.
    pub(crate) reload_whole: Vec<TableName>,
    /// Create the slot as TEMPORARY (dropped when the connection closes).
    pub temporary_slot: bool,
    /// The tables the consumer already holds a complete copy of, or `None`
    /// when it keeps no copy (`tail`). With `Some`, a new slot is refused
    /// while any table is held (its copy would miss the changes between
    /// the old slot and the new one), and on an existing slot the tables
    /// not held are loaded from a temporary slot's snapshot.
    pub(crate) held_tables: Option<Vec<TableName>>,
    /// Whether the lake records tables from `slot` (its bronze tables name
    /// their slot): with `to_lake`, an existing slot it does not is
    /// another's, and refused before anything changes (docs/tables.md,
    /// The table set).
    pub(crate) claimed: bool,
    /// The tables the lake holds history of from `slot`: with `to_lake`,
    /// a slot that is gone under them is refused (a new one would start
    /// after a gap).
    pub(crate) history: Vec<TableName>,
    /// The furthest position of `slot` the lake records (its tables'
    /// positions and marks, docs/tables.md), when it records marks: with
    /// `to_lake`, an existing slot confirmed past it confirmed changes the
    /// lake never got, and is refused.
    pub(crate) recorded_position: Option<Lsn>,
    /// The lake claimed `slot` for a slot this start makes: finding it
    /// made meanwhile is a race another run won.
    pub(crate) new_slot: bool,
    /// Every table must have a primary key and no column named like the
    /// lake's own (`_cdc_*`): silver keeps rows in step by key. `run` and
    /// `check` need this; `tail` does not.
    pub to_lake: bool,
    /// Create the publication, add the tables to it, and install the
    /// partition triggers, as needed (`run`); without, the publication
    /// must publish the tables already (`tail`, which changes nothing).
    pub(crate) manage_publication: bool,
}

impl CaptureOptions {
    pub fn new(tables: Vec<TableName>) -> CaptureOptions {
        CaptureOptions {
            tables,
            slot: DEFAULT_SLOT.to_owned(),
            publication: DEFAULT_PUBLICATION.to_owned(),
            proto_version: 2,
            streaming: false,
            messages: true,
            backfill_chunked: false,
            reload_whole: Vec::new(),
            temporary_slot: false,
            held_tables: None,
            claimed: false,
            history: Vec::new(),
            recorded_position: None,
            new_slot: false,
            to_lake: false,
            manage_publication: true,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let config_error = |m: String| Err(Error::new(ErrorKind::Config, m));
        if self.tables.is_empty() {
            return config_error("no tables given: name at least one schema.table".into());
        }
        if !(1..=2).contains(&self.proto_version) {
            return config_error(format!(
                "proto_version {} is not supported: use 1 or 2",
                self.proto_version
            ));
        }
        if self.streaming && self.proto_version < 2 {
            return config_error("streaming needs proto_version 2".into());
        }
        for (what, name) in [("slot", &self.slot), ("publication", &self.publication)] {
            let valid = !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return config_error(format!(
                    "{what} name {name:?} must be 1 to 63 characters of a-z, 0-9 and _"
                ));
            }
        }
        Ok(())
    }
}

/// How a capture starts.
pub enum Capture {
    /// The slot was just created: load every table at its consistent point,
    /// confirm that point once the load is durable, then stream.
    Fresh {
        load: SnapshotLoad,
        pending: PendingStream,
        /// The tables left out of the load for the chunked backfill.
        chunked: Vec<TableName>,
    },
    /// The slot existed: load the tables the consumer lacks (from a
    /// temporary slot's snapshot, a later position than the slot's), then
    /// stream from the slot's confirmed position. The consumer skips, for
    /// a table loaded so, the transactions that ended at or before the
    /// load's consistent point.
    Resume {
        load: Option<SnapshotLoad>,
        pending: PendingStream,
        /// The tables the consumer lacks left to the chunked backfill.
        chunked: Vec<TableName>,
    },
}

/// A replication connection waiting, idle, until the initial load is done.
pub struct PendingStream {
    connection: ReplicationConnection,
    start: StartOptions,
    catalog: Catalog,
    tables: Vec<TableName>,
}

impl PendingStream {
    /// The tables as the catalog describes them now, so a consumer can get
    /// ready for them (slow work, like rebuilding an index) before the
    /// stream starts: a started stream must be read within the server's
    /// `wal_sender_timeout`, an idle replication connection need not.
    pub(crate) async fn describe_tables(&mut self) -> Result<Vec<RelationInfo>> {
        describe_in(&mut self.catalog, &self.tables).await
    }

    /// Starts streaming at the consistent point. Call after the load has
    /// been read to its end: this ends the exported snapshot.
    /// Where the stream starts: the slot's confirmed position, or a new
    /// slot's consistent point.
    pub(crate) fn start_lsn(&self) -> Lsn {
        self.start.start_lsn
    }

    pub async fn start(self) -> Result<ChangeStream> {
        start_stream(self, false).await
    }

    /// [`PendingStream::start`] for a run that ends when idle: its end of
    /// the source's WAL holds every commit acknowledged before the call,
    /// an asynchronous one not yet flushed too
    /// ([`source::flushed_wal_end`]), which can take three
    /// `wal_writer_delay`s: a wait a run that goes on need not make.
    pub(crate) async fn start_to_end_when_idle(self) -> Result<ChangeStream> {
        start_stream(self, true).await
    }
}

/// `tables` as the catalog describes them now.
pub(crate) async fn describe(config: &PgConfig, tables: &[TableName]) -> Result<Vec<RelationInfo>> {
    let client = Arc::new(SourceClient::connect(config).await?);
    describe_in(&mut Catalog::new(client), tables).await
}

async fn describe_in(catalog: &mut Catalog, tables: &[TableName]) -> Result<Vec<RelationInfo>> {
    let client = catalog.client().clone();
    let mut relations = Vec::with_capacity(tables.len());
    for table in tables {
        let described = source::describe_table(&client, table).await?;
        relations.push(catalog.relation_from_table(&described).await?);
    }
    Ok(relations)
}

/// Whether replication slot `slot` exists.
pub(crate) async fn slot_exists(config: &PgConfig, slot: &str) -> Result<bool> {
    let client = SourceClient::connect(config).await?;
    Ok(source::slot_info(&client, slot).await?.is_some())
}

/// The tables to capture: those given, or else every table the existing
/// publication publishes.
pub async fn resolve_tables(config: &PgConfig, options: &mut CaptureOptions) -> Result<()> {
    if !options.tables.is_empty() {
        return Ok(());
    }
    let client = SourceClient::connect(config).await?;
    options.tables = source::published_tables(&client, &options.publication).await?;
    if options.tables.is_empty() {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "tables: none given, and publication {:?} publishes none (or does not exist): \
                 name the tables (--tables) or an existing publication (--publication)",
                options.publication
            ),
        ));
    }
    tracing::info!(
        publication = %options.publication,
        tables = ?options.tables.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "capturing the publication's tables"
    );
    Ok(())
}

/// Preflight failures as one error listing each problem and its fix.
pub(crate) fn preflight_error(failures: &[CheckFailure]) -> Error {
    let list = failures
        .iter()
        .map(|f| format!("\n  {f}"))
        .collect::<String>();
    Error::new(
        ErrorKind::Preflight,
        format!("the source is not ready for replication:{list}"),
    )
}

/// Runs the preflight checks; every failure is reported at once. For a
/// lake, a slot that is gone under its `history` is one, and so is one
/// that is another's ([`open`] refuses both).
pub async fn check(config: &PgConfig, options: &CaptureOptions) -> Result<Vec<CheckFailure>> {
    options.validate()?;
    let client = SourceClient::connect(config).await?;
    let mut failures = preflight(&client, options).await?;
    let existing = source::slot_info(&client, &options.slot).await?;
    if let Some(failure) = slot_failure(options, existing.as_ref()) {
        // Another lake's run holding the slot is no reason to stop it.
        failures.retain(|f| f.check != source::SLOT_HELD_BY_RUN);
        failures.push(failure);
    }
    Ok(failures)
}

/// What is wrong with the slot for a lake, given the one that `exists`:
/// gone under the lake's `history` (a new slot would start after a gap),
/// there and another's (its confirmations would lose the other consumer's
/// changes), or confirmed past what the lake records (changes the lake
/// never got).
fn slot_failure(options: &CaptureOptions, exists: Option<&SlotInfo>) -> Option<CheckFailure> {
    if !options.to_lake {
        return None;
    }
    let slot = &options.slot;
    // Judged only while no consumer streams from the slot: a run of this
    // lake that streams records and confirms while the two are read, one
    // after the other (and the slot in use stops the start anyway).
    if let (Some(confirmed), Some(reach)) = (
        exists.and_then(|i| i.confirmed_flush_lsn),
        options.recorded_position,
    ) && options.claimed
        && !exists.is_some_and(|i| i.streamed)
        && confirmed > reach
    {
        return Some(CheckFailure {
            check: "slot_past_lake",
            problem: format!(
                "replication slot {slot:?} stands at {confirmed}, past {reach}, the furthest \
                     position this lake records from it: it was confirmed past changes the lake \
                     never got (another consumer read it, such as pg_recvlogical or tail \
                     --consume, or it was dropped and made again under the same name), and \
                     going on from it would leave a gap in the tables' history."
            ),
            fix: format!(
                "Load the lake's tables afresh: drop them (wal2iceberg drop-table --table \
                     ..., or choose another --namespace) and run again, with a slot of the \
                     lake's own: if another consumer owns slot {slot:?} now, give this lake \
                     another (--slot, --publication); if no one reads it, drop it first \
                     (SELECT pg_drop_replication_slot('{slot}'))"
            ),
        });
    }
    match (exists.is_some(), options.history.first()) {
        (false, Some(table)) => Some(CheckFailure {
            check: "slot_lost",
            problem: format!(
                "replication slot {slot:?} does not exist, but the lake already holds {table}: \
                 a new slot would start after a gap in its history."
            ),
            fix: "If the slot was dropped on purpose, remove the lake's tables (or choose \
                  another lake or namespace) and run again to load from a new snapshot"
                .to_owned(),
        }),
        (true, _) if !options.claimed => Some(CheckFailure {
            check: "slot_not_this_lakes",
            problem: format!(
                "replication slot {slot:?} exists, and this lake records no table from it: \
                 it serves another lake (another --lake, catalog, catalog name or \
                 namespace), was made outside wal2iceberg, or outlived this lake's tables \
                 (drop-table, teardown), and confirming it from here would lose what its \
                 reader has not read."
            ),
            fix: format!(
                "Give this lake a slot and a publication of its own (--slot, --publication); \
                 if no one reads slot {slot:?}, drop it (wal2iceberg teardown --slot {slot}, \
                 or SELECT pg_drop_replication_slot('{slot}')) and run again"
            ),
        }),
        _ => None,
    }
}

/// The preflight checks of `options`, on `client`.
async fn preflight(client: &SourceClient, options: &CaptureOptions) -> Result<Vec<CheckFailure>> {
    source::preflight(
        client,
        &options.tables,
        &options.slot,
        &options.publication,
        options.to_lake,
    )
    .await
}

pub async fn open(config: &PgConfig, options: &CaptureOptions) -> Result<Capture> {
    options.validate()?;
    let client = Arc::new(SourceClient::connect(config).await?);
    // Before the preflight, which would find the slot another run made
    // (and holds) a fault of its own.
    if options.new_slot && source::slot_info(&client, &options.slot).await?.is_some() {
        return Err(lost_race(&options.slot));
    }
    let failures = preflight(&client, options).await?;
    if !failures.is_empty() {
        return Err(preflight_error(&failures));
    }
    // Before anything is created: a lake that holds tables from a slot
    // that is gone cannot go on from a new one, nor one from a slot that
    // is another's.
    let existing = source::slot_info(&client, &options.slot).await?;
    let held = options.held_tables.as_deref();
    if let Some(failure) = slot_failure(options, existing.as_ref()) {
        return Err(Error::new(
            ErrorKind::Slot,
            format!("{} {}", failure.problem, failure.fix),
        ));
    }
    if options.manage_publication {
        source::installing(&client, async {
            source::ensure_publication(&client, &options.publication, &options.tables).await?;
            source::ensure_partition_rows(&client, &options.tables).await?;
            source::ensure_ddl_triggers(&client).await
        })
        .await?;
    } else {
        let missing = source::unpublished(&client, &options.publication, &options.tables).await?;
        if !missing.is_empty() {
            return Err(Error::new(
                ErrorKind::Preflight,
                format!(
                    "publication {:?} does not publish {}, and this command changes no \
                     publication: name one that does (--publication), or publish them with \
                     wal2iceberg setup --tables ...",
                    options.publication,
                    missing
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let catalog = Catalog::new(client);
    let mut connection = ReplicationConnection::connect(config).await?;
    let identity = connection.identify_system().await?;
    tracing::info!(
        system_id = %identity.system_id,
        timeline = identity.timeline,
        wal_position = %identity.xlogpos,
        "replication connection ready"
    );
    let start = StartOptions {
        slot: options.slot.clone(),
        start_lsn: Lsn::ZERO,
        proto_version: options.proto_version,
        publications: vec![options.publication.clone()],
        messages: options.messages,
        streaming: options.streaming,
    };
    if let Some(info) = existing {
        tracing::info!(
            slot = %options.slot,
            confirmed_flush_lsn = %info.confirmed_flush_lsn.unwrap_or_default(),
            "resuming from the existing slot"
        );
        let missing: Vec<TableName> = match held {
            None => Vec::new(),
            Some(held) => options
                .tables
                .iter()
                .filter(|t| !held.contains(t))
                .cloned()
                .collect(),
        };
        let (chunked, missing) = chunked_or_snapshot(&catalog, options, missing).await?;
        let load = if missing.is_empty() {
            None
        } else {
            let names = missing.iter().map(ToString::to_string).collect::<Vec<_>>();
            let load = read_now(config, &catalog, &options.slot, missing).await?;
            tracing::info!(
                tables = ?names,
                consistent_point = %load.consistent_point(),
                "loading tables the lake lacks, or is told to resync, from a temporary slot's snapshot"
            );
            Some(load)
        };
        // From where the slot stands (the server starts there for any
        // lower position): what the stream reports confirmed starts there.
        let start_lsn = info.confirmed_flush_lsn.unwrap_or_default();
        return Ok(Capture::Resume {
            load,
            chunked,
            pending: PendingStream {
                connection,
                start: StartOptions { start_lsn, ..start },
                catalog,
                tables: options.tables.clone(),
            },
        });
    }
    crate::failpoint::stall("slot-create").await;
    let created = connection
        .create_slot(&options.slot, options.temporary_slot)
        .await
        .map_err(|e| match e.sqlstate() {
            Some(DUPLICATE_OBJECT) if options.new_slot => lost_race(&options.slot).with_source(e),
            _ => e,
        })?;
    crate::failpoint::hit("slot-created");
    tracing::info!(
        slot = %created.slot_name,
        consistent_point = %created.consistent_point,
        "created replication slot; starting the initial load"
    );
    let (chunked, snapshot) =
        chunked_or_snapshot(&catalog, options, options.tables.clone()).await?;
    let load = begin_load(config, &catalog, &created, snapshot, None).await?;
    Ok(Capture::Fresh {
        chunked,
        load,
        pending: PendingStream {
            connection,
            start: StartOptions {
                start_lsn: created.consistent_point,
                ..start
            },
            catalog,
            tables: options.tables.clone(),
        },
    })
}

/// `tables` parted into those the chunked backfill reads (with
/// `backfill_chunked`, each whose key allows it and that no reload
/// needs whole)
/// and those read in a snapshot; each of the latter says why.
async fn chunked_or_snapshot(
    catalog: &Catalog,
    options: &CaptureOptions,
    tables: Vec<TableName>,
) -> Result<(Vec<TableName>, Vec<TableName>)> {
    let mut chunked = Vec::new();
    let mut snapshot = Vec::new();
    for table in tables {
        if options.backfill_chunked && !options.reload_whole.contains(&table) {
            let described = source::describe_table(catalog.client(), &table).await?;
            match source::chunk::chunk_key(catalog.client(), &described).await? {
                Ok(_) => {
                    chunked.push(table);
                    continue;
                }
                Err(why) => {
                    tracing::info!(%table, reason = %why, "read in a snapshot, not in chunks");
                }
            }
        }
        snapshot.push(table);
    }
    Ok((chunked, snapshot))
}

/// SQLSTATE of CREATE_REPLICATION_SLOT for a slot that exists, which
/// [`open`] gives too when a slot it was to make exists.
pub(crate) const DUPLICATE_OBJECT: &str = "42710";

/// The slot a lake claimed was made by another run first.
fn lost_race(slot: &str) -> Error {
    Error::new(
        ErrorKind::Slot,
        format!(
            "replication slot {slot:?} was made by another run while this one started; this \
             lake's claim on it (its new, empty tables) was withdrawn. If that run is another \
             lake's, give this lake a slot and a publication of its own (--slot, --publication)"
        ),
    )
    .with_sqlstate(DUPLICATE_OBJECT)
}

/// `tables` as they are now, read in the snapshot a new temporary slot
/// (named after `slot`) exports; the slot goes when the load ends. Its
/// consistent point is the position the read shows.
pub(crate) async fn read_now(
    config: &PgConfig,
    catalog: &Catalog,
    slot: &str,
    tables: Vec<TableName>,
) -> Result<SnapshotLoad> {
    let mut exporter = ReplicationConnection::connect(config).await?;
    let created = exporter.create_slot(&load_slot_name(slot), true).await?;
    begin_load(config, catalog, &created, tables, Some(exporter)).await
}

/// A temporary slot's name: unique per run, within the 63 characters.
fn load_slot_name(slot: &str) -> String {
    temporary_slot_name(&format!(
        "{}_load",
        slot.chars().take(40).collect::<String>()
    ))
}

/// `prefix` and a unique suffix, a valid slot name if `prefix` is.
pub(crate) fn temporary_slot_name(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

async fn begin_load(
    config: &PgConfig,
    catalog: &Catalog,
    created: &CreatedSlot,
    tables: Vec<TableName>,
    exporter: Option<ReplicationConnection>,
) -> Result<SnapshotLoad> {
    let load_client = SourceClient::connect(config).await?;
    SnapshotLoad::begin(
        load_client,
        Catalog::new(catalog.client().clone()),
        &created.snapshot_name,
        created.consistent_point,
        tables,
        exporter,
    )
    .await
}

async fn start_stream(pending: PendingStream, settle: bool) -> Result<ChangeStream> {
    let PendingStream {
        mut connection,
        start,
        catalog,
        tables,
    } = pending;
    let start_lsn = start.start_lsn;
    let mut oids = Vec::with_capacity(tables.len());
    for table in &tables {
        oids.push((
            source::table_oid(catalog.client(), table).await?,
            table.clone(),
        ));
    }
    let source_end = if settle {
        source::flushed_wal_end(catalog.client(), FLUSH_WAIT)
            .await
            .map_err(|e| crate::error::postgres(e, "cannot read where the source's WAL ends"))?
    } else {
        connection.identify_system().await?.xlogpos
    };
    let replication = connection.start_replication(&start).await?;
    Ok(ChangeStream::new(
        replication,
        Assembler::new(catalog, &tables).with_oids(oids),
        start_lsn,
        source_end,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(confirmed: u64, streamed: bool) -> SlotInfo {
        SlotInfo {
            plugin: Some("pgoutput".into()),
            database: Some("db".into()),
            active_pid: streamed.then_some(4242),
            streamed,
            confirmed_flush_lsn: Some(Lsn(confirmed)),
            wal_status: Some("reserved".into()),
        }
    }

    #[test]
    fn a_slot_past_the_lake_is_judged_only_while_nothing_streams_from_it() {
        let mut options = CaptureOptions::new(Vec::new());
        (options.to_lake, options.claimed, options.recorded_position) =
            (true, true, Some(Lsn(100)));
        let check = |info| slot_failure(&options, Some(&info)).map(|f| f.check);
        assert_eq!(check(slot(200, false)), Some("slot_past_lake"));
        assert_eq!(check(slot(100, false)), None);
        // A run of the lake streaming confirms between the two reads.
        assert_eq!(check(slot(200, true)), None);
    }
}
