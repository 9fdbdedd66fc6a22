//! The tables a lake replicates from a slot. The slot's position is one
//! for all of them: a run that confirmed past the changes of a table it
//! did not apply would lose them for good. So every bronze table records
//! its source table and slot (table properties), and a run applies every
//! table the lake holds from its slot, whether `--tables` names it or not
//! (docs/tables.md, The table set). A table leaves the set only when its
//! Iceberg tables are removed.

use iceberg::NamespaceIdent;
use iceberg::table::Table;

use super::run::iceberg_name;
use crate::error::Result;
use crate::lake::catalog::{Lake, LakeLocation};
use crate::pg::config::PgConfig;
use crate::pg::source::{self, SourceClient, TableName};

/// Bronze's properties naming the source table and the slot it is
/// replicated from.
pub const SOURCE_TABLE: &str = "wal2iceberg.source-table";
pub const SOURCE_SLOT: &str = "wal2iceberg.slot";

/// What a bronze table of a source table replicated from `slot` records.
pub fn source_properties(table: &TableName, slot: &str) -> [(&'static str, String); 2] {
    [
        (SOURCE_TABLE, table.to_string()),
        (SOURCE_SLOT, slot.to_owned()),
    ]
}

/// The Iceberg name of `table` in `namespace`: that of the bronze table
/// recording it as its source, or its default name.
pub async fn recorded_name(
    lake: &Lake,
    namespace: &NamespaceIdent,
    table: &TableName,
) -> Result<String> {
    if lake.has_namespace(namespace).await? {
        let wanted = table.to_string();
        for ident in lake.tables(namespace.first().map(String::as_str)).await? {
            let Some(name) = ident.name().strip_suffix("_changes") else {
                continue;
            };
            let bronze = lake.catalog_table(&ident).await?;
            if bronze.metadata().properties().get(SOURCE_TABLE) == Some(&wanted) {
                return Ok(name.to_owned());
            }
        }
    }
    Ok(iceberg_name(table))
}

/// Records `table` and `slot` on `bronze` if it does not say them yet (a
/// table made before they were recorded).
pub async fn record_source(
    lake: &Lake,
    bronze: &Table,
    table: &TableName,
    slot: &str,
) -> Result<()> {
    let properties = source_properties(table, slot);
    let recorded = bronze.metadata().properties();
    if properties.iter().all(|(k, v)| recorded.get(*k) == Some(v)) {
        return Ok(());
    }
    lake.set_properties(bronze, &properties).await
}

/// The source tables the lake at `location` replicates from `slot` in
/// `namespace`, with their Iceberg names, by the properties their bronze
/// tables record. A bronze table that records none (made before they were
/// recorded) counts when its name is the default name of a table the
/// publication holds.
pub async fn held(
    config: &PgConfig,
    location: &LakeLocation,
    namespace: &NamespaceIdent,
    slot: &str,
    publication: &str,
) -> Result<Vec<(TableName, String)>> {
    if !location.catalog.is_file() {
        return Ok(Vec::new());
    }
    let lake = Lake::open_existing(location).await?;
    if !lake.has_namespace(namespace).await? {
        return Ok(Vec::new());
    }
    let mut held = Vec::new();
    let mut unrecorded = Vec::new();
    for ident in lake.tables(namespace.first().map(String::as_str)).await? {
        let Some(name) = ident.name().strip_suffix("_changes") else {
            continue;
        };
        let bronze = lake.catalog_table(&ident).await?;
        let properties = bronze.metadata().properties();
        match (properties.get(SOURCE_TABLE), properties.get(SOURCE_SLOT)) {
            (Some(table), Some(recorded)) if recorded == slot => {
                held.push((TableName::parse(table)?, name.to_owned()));
            }
            (Some(_), Some(_)) => {}
            _ => unrecorded.push(name.to_owned()),
        }
    }
    if !unrecorded.is_empty() {
        let client = SourceClient::connect(config).await?;
        for table in source::published_tables(&client, publication).await? {
            let name = iceberg_name(&table);
            if unrecorded.contains(&name) {
                held.push((table, name));
            }
        }
    }
    Ok(held)
}
