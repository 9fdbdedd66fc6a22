//! The layers under the flags: the TOML file and the `WAL2ICEBERG_*`
//! environment variables, each read into a [`super::Raw`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::Raw;
use crate::error::{Error, ErrorKind, Result};

/// How a value is written in an environment variable.
pub(super) enum Kind {
    Text,
    List,
    Integer,
    Bool,
    Map,
}

pub(super) const KEYS: &[(&str, Kind)] = &[
    ("source", Kind::Text),
    ("tables", Kind::List),
    ("slot", Kind::Text),
    ("publication", Kind::Text),
    ("lake", Kind::Text),
    ("catalog", Kind::Text),
    ("catalog_type", Kind::Text),
    ("catalog_uri", Kind::Text),
    ("catalog_name", Kind::Text),
    ("warehouse", Kind::Text),
    ("catalog_property", Kind::List),
    ("namespace", Kind::Text),
    ("state_dir", Kind::Text),
    ("table_names", Kind::Map),
    ("flush_interval", Kind::Text),
    ("max_batch_rows", Kind::Integer),
    ("max_batch_bytes", Kind::Integer),
    ("atomic_commits", Kind::Bool),
    ("compact_after_files", Kind::Integer),
    ("load_connections", Kind::Integer),
    ("backfill", Kind::Text),
    ("backfill_chunk_rows", Kind::Integer),
    ("snapshot_retention", Kind::Text),
    ("retain_snapshots", Kind::Integer),
    ("exit_when_idle", Kind::Text),
    ("metrics_addr", Kind::Text),
    ("log_format", Kind::Text),
    ("proto_version", Kind::Integer),
    ("streaming", Kind::Bool),
    ("heartbeat_interval", Kind::Text),
    ("retained_wal_warn_bytes", Kind::Integer),
    ("storage_retry_deadline", Kind::Text),
];

/// Environment variables with the prefix that are not settings.
pub(super) const OTHER_VARIABLES: &[&str] = &[
    "WAL2ICEBERG_PG_BIN",
    #[cfg(feature = "failpoints")]
    crate::failpoint::VARIABLE,
    #[cfg(feature = "failpoints")]
    crate::failpoint::STALL_VARIABLE,
];

pub(super) const ENV_PREFIX: &str = "WAL2ICEBERG_";

pub(super) fn from_file(path: &Path) -> Result<Raw> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::new(ErrorKind::Config, "cannot read the config file")
            .with_context("file", path.display())
            .with_source(e)
    })?;
    toml::from_str(&text).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!("config file {}: {}", path.display(), e.message()),
        )
        .with_context(
            "line",
            e.span()
                .map_or(0, |s| text[..s.start].matches('\n').count() + 1),
        )
    })
}

/// The `WAL2ICEBERG_*` variables as a layer, and which variable set each key.
pub(super) fn from_env(
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<(Raw, BTreeMap<String, String>)> {
    let mut table = toml::Table::new();
    let mut names = BTreeMap::new();
    for (name, value) in vars {
        let Some(key) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if OTHER_VARIABLES.contains(&name.as_str()) {
            continue;
        }
        let key = key.to_ascii_lowercase();
        let Some((_, kind)) = KEYS.iter().find(|(k, _)| *k == key) else {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "environment variable {name} is not a wal2iceberg setting (docs/configuration.md lists them)"
                ),
            ));
        };
        let bad = |rule: &str| {
            Error::new(
                ErrorKind::Config,
                format!("environment variable {name} {rule}"),
            )
        };
        let value = match kind {
            Kind::Text => toml::Value::String(value),
            Kind::List => toml::Value::Array(
                value
                    .split(',')
                    .map(|s| toml::Value::String(s.trim().to_owned()))
                    .collect(),
            ),
            Kind::Integer => toml::Value::Integer(
                value
                    .trim()
                    .parse()
                    .map_err(|_| bad("must be a whole number"))?,
            ),
            Kind::Bool => toml::Value::Boolean(match value.trim() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return Err(bad("must be true or false")),
            }),
            Kind::Map => {
                let mut map = toml::Table::new();
                for pair in value.split(',').filter(|p| !p.trim().is_empty()) {
                    let (k, v) = pair
                        .split_once('=')
                        .ok_or_else(|| bad("must be source=name pairs separated by commas"))?;
                    map.insert(
                        k.trim().to_owned(),
                        toml::Value::String(v.trim().to_owned()),
                    );
                }
                toml::Value::Table(map)
            }
        };
        names.insert(key.clone(), name.clone());
        table.insert(key, value);
    }
    let raw = Raw::deserialize(table)
        .map_err(|e| Error::new(ErrorKind::Config, format!("environment: {}", e.message())))?;
    Ok((raw, names))
}
