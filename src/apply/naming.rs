//! Which Iceberg tables a source table lands in.

use std::collections::{BTreeMap, HashMap};

use iceberg::TableIdent;

use crate::error::{Error, ErrorKind, Result};
use crate::model::TableName;

/// The default Iceberg name of a source table: `customers` (and
/// `customers_changes`) for `public.customers`; `sales__orders` for
/// `sales.orders`. `table_names` in the settings can choose others.
pub fn iceberg_name(table: &TableName) -> String {
    if table.schema == "public" {
        table.name.clone()
    } else {
        format!("{}__{}", table.schema, table.name)
    }
}

/// The folder of the state directory where a silver table's key index is
/// kept between runs: `<state_dir>/<namespace>/<table>`; the namespace's
/// when `silver` is `None`.
pub(crate) fn state_folder(
    state_dir: &std::path::Path,
    namespace: &iceberg::NamespaceIdent,
    silver: Option<&str>,
) -> std::path::PathBuf {
    let folder = state_dir.join(namespace.to_url_string());
    match silver {
        Some(table) => folder.join(table),
        None => folder,
    }
}

/// Removes a state folder of [`state_folder`] and all in it, if it exists.
pub(crate) fn remove_state_folder(folder: &std::path::Path) -> Result<()> {
    match std::fs::remove_dir_all(folder) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::new(ErrorKind::Io, "cannot delete the state folder")
            .with_context("folder", folder.display())
            .with_source(e)),
    }
}

/// Bronze and silver of `table`, named as `names` (from `names`) says.
pub(crate) fn idents(
    namespace: &iceberg::NamespaceIdent,
    names: &HashMap<TableName, String>,
    table: &TableName,
) -> (TableIdent, TableIdent) {
    let name = names
        .get(table)
        .cloned()
        .unwrap_or_else(|| iceberg_name(table));
    (
        TableIdent::new(namespace.clone(), format!("{name}_changes")),
        TableIdent::new(namespace.clone(), name),
    )
}

/// The Iceberg name of each table; two source tables must never land in
/// one Iceberg table.
pub(crate) fn names(
    tables: &[TableName],
    chosen: &BTreeMap<TableName, String>,
) -> Result<HashMap<TableName, String>> {
    let mut seen: BTreeMap<String, &TableName> = BTreeMap::new();
    let mut names = HashMap::new();
    for table in tables {
        let name = chosen
            .get(table)
            .cloned()
            .unwrap_or_else(|| iceberg_name(table));
        let bronze = format!("{name}_changes");
        for taken in [&name, &bronze] {
            if let Some(other) = seen.get(taken.as_str()) {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("tables {other} and {table} would both use Iceberg table {taken}"),
                ));
            }
        }
        seen.insert(name.clone(), table);
        seen.insert(bronze, table);
        names.insert(table.clone(), name);
    }
    Ok(names)
}
