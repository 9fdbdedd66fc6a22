//! The tables a lake replicates from a slot. The slot's position is one
//! for all of them: a run that confirmed past the changes of a table it
//! did not apply would lose them for good. So every bronze table records
//! its source table and slot (table properties), and a run applies every
//! table the lake holds from its slot, whether `--tables` names it or not
//! (docs/tables.md, The table set). A table leaves the set only when its
//! Iceberg tables are removed. The source table is known by its OID too,
//! so that one renamed is followed under its new name, and one dropped and
//! created again under the same name is told from the one the lake holds.

use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};

use crate::apply::naming::iceberg_name;
use crate::cdc::source::Source;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::{Lake, LakeLocation};
use crate::lake::files::writer::Position;
use crate::model::Lsn;
use crate::model::TableName;
use crate::pg::config::PgConfig;

/// Bronze's properties naming the source table and the slot it is
/// replicated from.
pub(crate) const SOURCE_TABLE: &str = "wal2iceberg.source-table";
pub const SOURCE_SLOT: &str = "wal2iceberg.slot";
/// The source table's OID (`pg_class.oid`), which a rename keeps.
pub(crate) const SOURCE_OID: &str = "wal2iceberg.source-oid";
/// The names the source table had before [`SOURCE_TABLE`]'s, a JSON
/// array: `--tables` may still name it by any of them.
pub(crate) const SOURCE_FORMER_NAMES: &str = "wal2iceberg.source-former-names";

/// Bronze's property recording a position of the slot the table holds
/// every change before, where no snapshot of its records it: the stream
/// passed it with nothing for the table (a keepalive, a transaction of
/// other tables). A run records it before it confirms the slot past its
/// tables' snapshots, so the slot never stands past what the lake records
/// and a start tells its slot from another of the same name.
pub(crate) const MARK: &str = "wal2iceberg.mark-lsn";

/// The position [`MARK`] records on `bronze`, if any.
pub fn mark(bronze: &Table) -> Option<Lsn> {
    bronze
        .metadata()
        .properties()
        .get(MARK)?
        .parse()
        .ok()
        .map(Lsn)
}

/// How far `bronze` records its slot's stream: its snapshots' position or
/// its mark, whichever is further.
pub(crate) fn recorded_position(bronze: &Table) -> Result<Option<Lsn>> {
    let position = Position::of(bronze)?.map(|p| p.end_lsn);
    Ok(position.max(mark(bronze)))
}

/// What a bronze table of the source table `table` (of OID `oid`)
/// replicated from `slot` records.
pub(crate) fn source_properties(
    table: &TableName,
    oid: u32,
    slot: &str,
) -> [(&'static str, String); 3] {
    [
        (SOURCE_TABLE, table.to_string()),
        (SOURCE_OID, oid.to_string()),
        (SOURCE_SLOT, slot.to_owned()),
    ]
}

/// A source table of the set.
#[derive(Debug)]
pub(crate) struct ReplicatedTable {
    /// Its name at the source now.
    pub(crate) table: TableName,
    /// Its Iceberg name (bronze's without `_changes`).
    pub(crate) iceberg: String,
    /// The names it had before, each with whether a table of that name
    /// exists at the source now.
    pub(crate) old_names: Vec<(TableName, bool)>,
    /// Whether its bronze holds history (a position) from the slot, not
    /// only the claim a run makes before it creates the slot.
    pub(crate) history: bool,
}

impl ReplicatedTable {
    /// A table under the name its bronze recorded.
    fn unrenamed(table: TableName, iceberg: String, history: bool) -> ReplicatedTable {
        ReplicatedTable {
            table,
            iceberg,
            old_names: Vec::new(),
            history,
        }
    }
}

/// What the lake's bronze tables say of a slot.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    /// The tables it holds from the slot.
    pub(crate) replicated: Vec<ReplicatedTable>,
    /// Source tables whose bronze holds history from another slot (one
    /// `teardown` dropped reads `<slot> (dropped)`), by their recorded
    /// name: their history cannot go on from this one.
    pub(crate) elsewhere: Vec<(String, String)>,
    /// The furthest position of the slot its tables record ([`recorded_position`]),
    /// when one of them records a [`MARK`]: the slot never stands past
    /// it. A lake whose tables record no mark yet (made before marks
    /// were) gives none.
    pub(crate) recorded_position: Option<Lsn>,
}

/// The former names `properties` record ([`SOURCE_FORMER_NAMES`]).
fn former_names(properties: &std::collections::HashMap<String, String>) -> Vec<TableName> {
    properties
        .get(SOURCE_FORMER_NAMES)
        .and_then(|text| serde_json::from_str::<Vec<String>>(text).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(|name| TableName::parse(name).ok())
        .collect()
}

/// The Iceberg name of `table` in `namespace`: that of the bronze table
/// recording it as its source, or its default name. Given the table's
/// `oid`, the bronze recording that OID is its (a table renamed since the
/// last run), and one recording its name with another OID is not (the
/// name passed to another table since).
pub(crate) async fn recorded_name(
    lake: &Lake,
    namespace: &NamespaceIdent,
    table: &TableName,
    oid: Option<u32>,
) -> Result<String> {
    if lake.has_namespace(namespace).await? {
        let wanted = table.to_string();
        let mut by_name = None;
        for ident in lake.tables(namespace.first().map(String::as_str)).await? {
            let Some(name) = ident.name().strip_suffix("_changes") else {
                continue;
            };
            let bronze = lake.catalog_table(&ident).await?;
            let properties = bronze.metadata().properties();
            let recorded_oid = properties
                .get(SOURCE_OID)
                .and_then(|o| o.parse::<u32>().ok());
            match (oid, recorded_oid) {
                (Some(oid), Some(recorded)) if oid == recorded => return Ok(name.to_owned()),
                (Some(_), Some(_)) => {}
                _ if properties.get(SOURCE_TABLE) == Some(&wanted) => {
                    by_name = Some(name.to_owned());
                }
                _ => {}
            }
        }
        if let Some(name) = by_name {
            return Ok(name);
        }
    }
    Ok(iceberg_name(table))
}

/// Records `table`, its `oid` and `slot` on `bronze` if it does not say
/// them yet (a table made before they were recorded, or renamed since).
pub(crate) async fn record_source(
    lake: &Lake,
    bronze: &Table,
    table: &TableName,
    oid: u32,
    slot: &str,
) -> Result<()> {
    let properties = source_properties(table, oid, slot);
    let recorded = bronze.metadata().properties();
    // History from another slot cannot go on from this one (`settle`
    // refuses it first; a claim's empty bronze may take a new slot).
    if let Some(other) = recorded.get(SOURCE_SLOT).filter(|s| *s != slot)
        && Position::of(bronze)?.is_some()
    {
        return Err(Error::new(
            ErrorKind::Preflight,
            "the table's bronze holds history from another replication slot, which cannot go on \
             from this one",
        )
        .with_context("table", table)
        .with_context("recorded_slot", other)
        .with_context("slot", slot));
    }
    if let Some(other) = recorded.get(SOURCE_OID).filter(|o| **o != oid.to_string()) {
        return Err(Error::new(
            ErrorKind::Preflight,
            "another source table reached Iceberg tables that hold a different one's rows",
        )
        .with_context("table", table)
        .with_context("relation_oid", oid)
        .with_context("recorded_oid", other)
        .with_context("bronze", bronze.identifier()));
    }
    if properties.iter().all(|(k, v)| recorded.get(*k) == Some(v)) {
        return Ok(());
    }
    let mut properties = properties.to_vec();
    // Renamed: the name recorded before joins the former ones.
    if let Some(before) = recorded
        .get(SOURCE_TABLE)
        .and_then(|t| TableName::parse(t).ok())
        .filter(|before| before != table)
    {
        let mut former = former_names(recorded);
        former.push(before);
        former.retain(|name| name != table);
        former.dedup();
        let names: Vec<String> = former.iter().map(ToString::to_string).collect();
        let text = serde_json::to_string(&names).map_err(|e| {
            Error::new(ErrorKind::Lake, "cannot record the table's former names").with_source(e)
        })?;
        properties.push((SOURCE_FORMER_NAMES, text));
    }
    lake.set_properties(bronze, &properties).await
}

/// What [`release_slot`] appends to the slot a bronze table records.
const RELEASED: &str = " (dropped)";

/// The slot `bronze` records it is replicated from, unless released.
pub(crate) fn source_slot(bronze: &Table) -> Option<String> {
    let slot = bronze.metadata().properties().get(SOURCE_SLOT)?;
    (!is_released(slot)).then(|| slot.clone())
}

/// Whether `recorded`, a slot a bronze table records, was released.
pub(crate) fn is_released(recorded: &str) -> bool {
    recorded.ends_with(RELEASED)
}

/// Whether a bronze table in `namespace` records `slot`.
pub(crate) async fn namespace_replicates_slot(
    lake: &Lake,
    namespace: &NamespaceIdent,
    slot: &str,
) -> Result<bool> {
    Ok(!recording(lake, namespace, slot).await?.is_empty())
}

/// The bronze tables in `namespace` that record `slot`.
pub(super) async fn recording(
    lake: &Lake,
    namespace: &NamespaceIdent,
    slot: &str,
) -> Result<Vec<Table>> {
    let mut found = Vec::new();
    for ident in lake.tables(namespace.first().map(String::as_str)).await? {
        if !ident.name().ends_with("_changes") {
            continue;
        }
        let bronze = lake.catalog_table(&ident).await?;
        if source_slot(&bronze).as_deref() == Some(slot) {
            found.push(bronze);
        }
    }
    Ok(found)
}

/// Hands the recorded position of `bronze`, about to be dropped, to another bronze
/// table in `namespace` of its slot, as its mark, unless one reaches as
/// far: what the lake records of the slot must not fall behind where the
/// slot stands ([`MARK`]).
pub(crate) async fn pass_on_recorded_position(
    lake: &Lake,
    namespace: &NamespaceIdent,
    bronze: &Table,
) -> Result<()> {
    let (Some(slot), Some(reached)) = (source_slot(bronze), recorded_position(bronze)?) else {
        return Ok(());
    };
    let mut others = recording(lake, namespace, &slot).await?;
    others.retain(|other| other.identifier() != bronze.identifier());
    for other in &others {
        if recorded_position(other)? >= Some(reached) {
            return Ok(());
        }
    }
    if let Some(heir) = others.first() {
        lake.update_properties(heir.identifier(), &[(MARK, reached.0.to_string())])
            .await?;
    }
    Ok(())
}

/// Whether the lake at `location`, if there is one, records `slot` in
/// `namespace`: its changes are the lake's to consume.
pub(crate) async fn lake_replicates_slot(
    location: &LakeLocation,
    namespace: &NamespaceIdent,
    slot: &str,
) -> Result<bool> {
    match with_namespace(location, namespace).await? {
        Some(lake) => namespace_replicates_slot(&lake, namespace, slot).await,
        None => Ok(false),
    }
}

/// The lake at `location`, when it exists and holds `namespace`; opening
/// it creates nothing.
async fn with_namespace(
    location: &LakeLocation,
    namespace: &NamespaceIdent,
) -> Result<Option<Lake>> {
    if !location.catalog.may_exist() {
        return Ok(None);
    }
    let lake = Lake::open_existing(location).await?;
    Ok(lake.has_namespace(namespace).await?.then_some(lake))
}

/// Releases the lake's claim on `slot`, which is being dropped: each
/// bronze table in `namespace` recording it records it dropped instead,
/// so a slot made later under that name is not taken for theirs
/// (docs/tables.md, The table set). The bronze tables released.
pub(crate) async fn release_slot(
    location: &LakeLocation,
    namespace: &NamespaceIdent,
    slot: &str,
) -> Result<Vec<TableIdent>> {
    let Some(lake) = with_namespace(location, namespace).await? else {
        return Ok(Vec::new());
    };
    let mut released = Vec::new();
    for bronze in recording(&lake, namespace, slot).await? {
        let dropped = format!("{slot}{RELEASED}");
        lake.set_properties(&bronze, &[(SOURCE_SLOT, dropped)])
            .await?;
        released.push(bronze.identifier().clone());
    }
    Ok(released)
}

/// The source tables the lake at `location` replicates from `slot` in
/// `namespace`, by the properties their bronze tables record. A bronze
/// table that records none (made before they were recorded) counts when
/// its name is the Iceberg name (`table_names`, else the default) of a
/// table the publication holds. A table renamed since is found by its OID;
/// one whose name now belongs to another table (dropped and created
/// again) is refused before anything changes, since its Iceberg tables
/// hold the old one's rows.
pub(crate) async fn replicated_tables(
    config: &PgConfig,
    location: &LakeLocation,
    namespace: &NamespaceIdent,
    slot: &str,
    publication: &str,
    table_names: &std::collections::BTreeMap<TableName, String>,
) -> Result<Recorded> {
    let mut found = Recorded::default();
    if !location.catalog.may_exist() {
        return Ok(found);
    }
    let lake = Lake::open_existing(location).await?;
    if !lake.has_namespace(namespace).await? {
        return Ok(found);
    }
    let mut recorded = Vec::new();
    let mut unrecorded = Vec::new();
    let mut marked = false;
    let mut reached = None;
    for ident in lake.tables(namespace.first().map(String::as_str)).await? {
        let Some(name) = ident.name().strip_suffix("_changes") else {
            continue;
        };
        let bronze = lake.catalog_table(&ident).await?;
        let position = Position::of(&bronze)?.map(|p| p.end_lsn);
        let history = position.is_some();
        let properties = bronze.metadata().properties();
        match (properties.get(SOURCE_TABLE), properties.get(SOURCE_SLOT)) {
            (Some(table), Some(recorded_slot)) if recorded_slot == slot => {
                marked |= mark(&bronze).is_some();
                reached = reached.max(position.max(mark(&bronze)));
                let oid = properties
                    .get(SOURCE_OID)
                    .and_then(|o| o.parse::<u32>().ok());
                let former = former_names(properties);
                recorded.push((
                    TableName::parse(table)?,
                    oid,
                    name.to_owned(),
                    former,
                    history,
                ));
            }
            (Some(table), Some(other)) => {
                if history {
                    found.elsewhere.push((table.clone(), other.clone()));
                }
            }
            _ => unrecorded.push((name.to_owned(), history)),
        }
    }
    found.recorded_position = reached.filter(|_| marked);
    if recorded.is_empty() && unrecorded.is_empty() {
        return Ok(found);
    }
    let source = Source::connect(config).await?;
    let held = &mut found.replicated;
    for (table, oid, iceberg, former, history) in recorded {
        let Some(oid) = oid else {
            held.push(ReplicatedTable::unrenamed(table, iceberg, history));
            continue;
        };
        let mut old_names = Vec::new();
        match source.table_of_oid(oid).await? {
            Some(now) => {
                if now != table {
                    tracing::warn!(
                        from = %table, to = %now, oid,
                        "the source table was renamed: followed under its new name; its Iceberg tables keep theirs (docs/tables.md, Schema changes)"
                    );
                }
                for old in former.into_iter().chain(Some(table)) {
                    if old != now && !old_names.iter().any(|(o, _)| *o == old) {
                        let taken = source.table_exists(&old).await?;
                        old_names.push((old, taken));
                    }
                }
                held.push(ReplicatedTable {
                    table: now,
                    iceberg,
                    old_names,
                    history,
                });
            }
            None if source.table_exists(&table).await? => {
                return Err(Error::new(
                    ErrorKind::Preflight,
                    "the source table was dropped and created again since the lake loaded it: its Iceberg tables hold the old table's rows; drop them (`wal2iceberg drop-table --table <table>`) and run again to load the new one",
                )
                .with_context("table", &table)
                .with_context("recorded_oid", oid));
            }
            // Dropped: the preflight names it.
            None => held.push(ReplicatedTable::unrenamed(table, iceberg, history)),
        }
    }
    if !unrecorded.is_empty() {
        for table in source.published_tables(publication).await? {
            let name = table_names
                .get(&table)
                .cloned()
                .unwrap_or_else(|| iceberg_name(&table));
            if let Some((_, history)) = unrecorded.iter().find(|(n, _)| *n == name) {
                held.push(ReplicatedTable::unrenamed(table, name, *history));
            }
        }
    }
    Ok(found)
}
