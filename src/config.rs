//! Settings: defaults, then a TOML file (`--config`), then `WAL2ICEBERG_*`
//! environment variables, then flags, each overriding the one before. Every
//! value is checked before anything connects, and an error names the
//! option, where it came from and the rule it broke; unknown keys are
//! errors. docs/configuration.md lists every option.

mod duration;
mod layers;
mod raw;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use self::duration::parse_duration;
use self::layers::{from_env, from_file};
pub(crate) use self::raw::CatalogSetting;
pub use self::raw::Raw;
use crate::cdc::capture::{CaptureOptions, DEFAULT_PUBLICATION, DEFAULT_SLOT};
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::{CatalogChoice, LakeLocation, namespace};
use crate::lake::maintenance::expire::Retention;
use crate::model::TableName;
use crate::pg::config::PgConfig;

/// How a run goes about its work, whatever it replicates: when it
/// commits, compacts, expires, warns and gives up. `Settings` holds one
/// and the pipeline's options the same one (`RunOptions::run`); each
/// default is in [`RunSettings::DEFAULT`], beside its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSettings {
    /// Commit a batch at least this often while changes arrive.
    pub flush_interval: Duration,
    /// Commit once a batch holds this many changes (at the next
    /// transaction end).
    pub max_batch_rows: usize,
    /// Commit once a batch holds about this many bytes of values.
    pub max_batch_bytes: usize,
    /// Commit every table of a batch in one catalog commit, all or none
    /// (`apply::flush`); else table by table, bronze then silver.
    pub atomic_commits: bool,
    /// Compact silver after a commit once this many data files were
    /// committed since its last compaction, or it holds this many delete
    /// files, and bronze every this many commits; 0 never
    /// (src/lake/maintenance/compaction.rs, src/lake/table/silver/compaction.rs).
    pub compact_after_files: usize,
    /// Connections that read the initial load's tables in parallel, each a
    /// table at a time, all in the slot's snapshot.
    pub load_connections: usize,
    /// How tables with a primary key are loaded.
    pub backfill: Backfill,
    /// Rows of a chunked backfill's chunk.
    pub backfill_chunk_rows: usize,
    /// Which snapshots the automatic expiry keeps; it runs for both tables
    /// of a source table after silver's compaction, and every
    /// `apply::EXPIRE_EVERY_COMMITS` commits.
    pub retention: Retention,
    /// Drain, commit, confirm and return once no change came for this long.
    pub exit_when_idle: Option<Duration>,
    /// Emit a logical message this often, so that the slot advances where
    /// only other databases write WAL.
    pub heartbeat_interval: Option<Duration>,
    /// Warn when the slot keeps more WAL than this on the source's disk.
    pub retained_wal_warn_bytes: u64,
    /// How long the run retries the lake's storage while it fails for the
    /// moment (timeouts, resets, 5xx, throttling) and no commit lands,
    /// before it exits with the error.
    pub storage_retry_deadline: Duration,
}

impl RunSettings {
    pub const DEFAULT: RunSettings = RunSettings {
        flush_interval: Duration::from_secs(1),
        max_batch_rows: 100_000,
        max_batch_bytes: 128 << 20,
        atomic_commits: true,
        compact_after_files: 16,
        load_connections: 2,
        backfill: Backfill::Snapshot,
        backfill_chunk_rows: 100_000,
        retention: Retention {
            older_than: Duration::from_secs(3600),
            retain_last: 10,
        },
        exit_when_idle: None,
        heartbeat_interval: None,
        retained_wal_warn_bytes: 1 << 30,
        storage_retry_deadline: Duration::from_secs(300),
    };
}

/// How a table with a primary key is loaded (docs/backfill.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backfill {
    /// One COPY inside the slot's exported snapshot.
    Snapshot,
    /// Key-range chunks beside the stream, where the key allows.
    Chunked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Checked settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub source: PgConfig,
    pub tables: Vec<TableName>,
    pub slot: String,
    /// Whether the slot was named (flag or file), not defaulted: `tail`
    /// reads a named slot, and otherwise one of its own.
    pub slot_named: bool,
    pub publication: String,
    /// The SQL catalog's database and the warehouse.
    pub lake: LakeLocation,
    pub namespace: Option<String>,
    /// Where a run keeps the silver key indexes between starts.
    pub state_dir: PathBuf,
    /// Iceberg names chosen for source tables, instead of the default.
    pub table_names: BTreeMap<TableName, String>,
    /// How a run goes about its work.
    pub run: RunSettings,
    pub metrics_addr: Option<SocketAddr>,
    pub log_format: LogFormat,
    pub(crate) proto_version: u32,
    pub(crate) streaming: bool,
}

impl Settings {
    /// Resolves the layers: `file` (if given), the environment `vars`, then
    /// `flags`.
    pub fn resolve(
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
        flags: Raw,
    ) -> Result<Settings> {
        Merged::layered(file, vars, flags)?.check()
    }

    /// The lake namespace: `namespace`, or the source database's name.
    pub fn lake_namespace(&self) -> iceberg::NamespaceIdent {
        namespace(self.namespace.as_deref().unwrap_or(&self.source.dbname))
    }

    /// What the capture needs.
    pub fn capture_options(&self) -> CaptureOptions {
        let mut options = CaptureOptions::new(self.tables.clone());
        options.slot = self.slot.clone();
        options.publication = self.publication.clone();
        options.proto_version = self.proto_version;
        options.streaming = self.streaming;
        options
    }
}

/// The merged raw values, as the file's keys, and where each came from.
#[derive(Default)]
struct Merged {
    values: toml::Table,
    origins: BTreeMap<String, String>,
}

/// The settings of the commands that read or maintain the lake alone
/// (`show`, `compact`, `expire-snapshots`): from the same layers, but they
/// connect to no source, so one is neither needed nor checked.
pub struct LakeSettings {
    pub lake: LakeLocation,
    pub namespace: Option<String>,
    pub log_format: LogFormat,
}

impl LakeSettings {
    /// Resolves the layers as [`Settings::resolve`] does.
    pub fn resolve(
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
        flags: Raw,
    ) -> Result<LakeSettings> {
        let merged = Merged::layered(file, vars, flags)?;
        let raw = &merged.raw()?;
        Ok(LakeSettings {
            lake: merged.lake(raw)?,
            namespace: raw.namespace.clone(),
            log_format: merged.log_format(raw)?,
        })
    }
}

impl Merged {
    /// `file` (if given), the environment `vars`, then `flags`, each over
    /// the one before.
    fn layered(
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
        flags: Raw,
    ) -> Result<Merged> {
        let mut layers = Vec::new();
        if let Some(path) = file {
            layers.push((from_file(path)?, format!("config file {}", path.display())));
        }
        let (env, names) = from_env(vars)?;
        layers.push((env, "environment".to_owned()));
        layers.push((flags, "command line".to_owned()));
        let mut merged = Merged::default();
        for (layer, origin) in layers {
            merged.over(layer, &origin, &names)?;
        }
        Ok(merged)
    }

    /// The merged values as the struct.
    fn raw(&self) -> Result<Raw> {
        Raw::deserialize(self.values.clone())
            .map_err(|e| Error::new(ErrorKind::Config, format!("settings: {}", e.message())))
    }

    fn log_format(&self, raw: &Raw) -> Result<LogFormat> {
        match raw.log_format.as_deref() {
            None | Some("text") => Ok(LogFormat::Text),
            Some("json") => Ok(LogFormat::Json),
            Some(other) => Err(self.error("log_format", format!("{other:?} is not text or json"))),
        }
    }

    /// The lake's place: its folder, catalog and warehouse.
    fn lake(&self, raw: &Raw) -> Result<LakeLocation> {
        let (file, table) = match &raw.catalog {
            Some(CatalogSetting::File(file)) => (Some(file.as_path()), None),
            Some(CatalogSetting::Table(table)) => (None, Some(table)),
            None => (None, None),
        };
        let from_table = |key: &str| table.and_then(|t| t.get(key)).map(String::as_str);
        // The table's properties, then the flat key's, which win.
        let properties: Vec<String> = table
            .into_iter()
            .flatten()
            .filter(|(k, _)| !["type", "uri", "warehouse", "name"].contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .chain(raw.catalog_property.iter().flatten().cloned())
            .collect();
        LakeLocation::configure(
            raw.lake.as_deref().unwrap_or(Path::new("./lake")),
            &CatalogChoice {
                kind: raw.catalog_type.as_deref().or(from_table("type")),
                file,
                uri: raw.catalog_uri.as_deref().or(from_table("uri")),
                warehouse: raw.warehouse.as_deref().or(from_table("warehouse")),
                properties: &properties,
                name: raw.catalog_name.as_deref().or(from_table("name")),
            },
        )
        .map_err(|(key, e)| self.error(key, e))
    }

    /// Puts `layer`'s values over those before it.
    fn over(&mut self, layer: Raw, origin: &str, names: &BTreeMap<String, String>) -> Result<()> {
        let values = toml::Table::try_from(layer).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!("{origin}: cannot read the settings"),
            )
            .with_source(e)
        })?;
        for (key, value) in values {
            let origin = match (origin, names.get(&key)) {
                ("environment", Some(var)) => format!("environment variable {var}"),
                (origin, _) => origin.to_owned(),
            };
            self.origins.insert(key.clone(), origin);
            self.values.insert(key, value);
        }
        Ok(())
    }

    /// An error about `key`, naming where its value came from.
    fn error(&self, key: &str, rule: impl std::fmt::Display) -> Error {
        let origin = self
            .origins
            .get(key)
            .map_or(String::new(), |o| format!(" (from the {o})"));
        Error::new(ErrorKind::Config, format!("{key}{origin}: {rule}"))
    }

    fn duration(&self, key: &str, value: Option<&String>) -> Result<Option<Duration>> {
        value
            .map(|v| parse_duration(key, v).map_err(|e| self.error(key, e)))
            .transpose()
    }

    fn positive(&self, key: &str, value: Option<i64>, default: usize) -> Result<usize> {
        match value {
            None => Ok(default),
            Some(n) if n >= 1 => usize::try_from(n).map_err(|_| self.error(key, "is too large")),
            Some(n) => Err(self.error(key, format!("must be at least 1, not {n}"))),
        }
    }

    /// The checked settings, or one error telling every invalid setting.
    fn check(self) -> Result<Settings> {
        let raw = &self.raw()?;
        let mut problems = Problems::default();
        let source = problems.take(
            PgConfig::parse(raw.source.as_deref().unwrap_or(""))
                .map_err(|e| self.error("source", e)),
        );
        let tables: Vec<TableName> = raw
            .tables
            .iter()
            .flatten()
            .filter(|t| !t.trim().is_empty())
            .filter_map(|t| {
                problems.take(TableName::parse(t.trim()).map_err(|e| self.error("tables", e)))
            })
            .collect();
        let table_names = self.table_names(raw, &tables, &mut problems);
        let log_format = problems
            .take(self.log_format(raw))
            .unwrap_or(LogFormat::Text);
        let proto_version = match raw.proto_version {
            None => 2,
            Some(v @ (1 | 2)) => v as u32,
            Some(v) => {
                problems.add(self.error("proto_version", format!("{v} is not 1 or 2")));
                2
            }
        };
        let streaming = raw.streaming.unwrap_or(false);
        if streaming && proto_version < 2 {
            problems.add(self.error("streaming", "needs proto_version 2"));
        }
        let metrics_addr = raw.metrics_addr.as_deref().and_then(|a| {
            problems.take(a.parse::<SocketAddr>().map_err(|_| {
                self.error(
                    "metrics_addr",
                    format!("{a:?} is not an address like 127.0.0.1:9187"),
                )
            }))
        });
        let defaults = RunSettings::DEFAULT;
        let retained_wal_warn_bytes = match raw.retained_wal_warn_bytes {
            None => defaults.retained_wal_warn_bytes,
            Some(n) if n >= 0 => n as u64,
            Some(n) => {
                problems.add(self.error(
                    "retained_wal_warn_bytes",
                    format!("must not be negative, not {n}"),
                ));
                defaults.retained_wal_warn_bytes
            }
        };
        let compact_after_files = match raw.compact_after_files {
            None => defaults.compact_after_files,
            Some(n) => problems
                .take(usize::try_from(n).map_err(|_| {
                    self.error(
                        "compact_after_files",
                        format!("must be 0 (never) or more, not {n}"),
                    )
                }))
                .unwrap_or(defaults.compact_after_files),
        };
        let mut duration = |key: &str, value: Option<&String>, default: Option<Duration>| {
            problems
                .take(self.duration(key, value))
                .flatten()
                .or(default)
        };
        let flush_interval = duration(
            "flush_interval",
            raw.flush_interval.as_ref(),
            Some(defaults.flush_interval),
        );
        let older_than = duration(
            "snapshot_retention",
            raw.snapshot_retention.as_ref(),
            Some(defaults.retention.older_than),
        );
        let exit_when_idle = duration("exit_when_idle", raw.exit_when_idle.as_ref(), None);
        let heartbeat_interval =
            duration("heartbeat_interval", raw.heartbeat_interval.as_ref(), None);
        let storage_retry_deadline = duration(
            "storage_retry_deadline",
            raw.storage_retry_deadline.as_ref(),
            Some(defaults.storage_retry_deadline),
        );
        let mut positive = |key: &str, value: Option<i64>, default: usize| {
            problems
                .take(self.positive(key, value, default))
                .unwrap_or(default)
        };
        let max_batch_rows = positive(
            "max_batch_rows",
            raw.max_batch_rows,
            defaults.max_batch_rows,
        );
        let max_batch_bytes = positive(
            "max_batch_bytes",
            raw.max_batch_bytes,
            defaults.max_batch_bytes,
        );
        let load_connections = positive(
            "load_connections",
            raw.load_connections,
            defaults.load_connections,
        );
        let backfill_chunk_rows = positive(
            "backfill_chunk_rows",
            raw.backfill_chunk_rows,
            defaults.backfill_chunk_rows,
        );
        let retain_last = positive(
            "retain_snapshots",
            raw.retain_snapshots,
            defaults.retention.retain_last,
        );
        let backfill = match raw.backfill.as_deref() {
            None => defaults.backfill,
            Some("snapshot") => Backfill::Snapshot,
            Some("chunked") => Backfill::Chunked,
            Some(other) => {
                problems
                    .add(self.error("backfill", format!("{other:?} is not snapshot or chunked")));
                defaults.backfill
            }
        };
        let lake = problems.take(self.lake(raw));
        problems.finish()?;
        let (Some(source), Some(lake)) = (source, lake) else {
            unreachable!("a setting without a value is a problem told above");
        };
        Ok(Settings {
            source,
            tables,
            slot: raw.slot.clone().unwrap_or_else(|| DEFAULT_SLOT.to_owned()),
            slot_named: raw.slot.is_some(),
            publication: raw
                .publication
                .clone()
                .unwrap_or_else(|| DEFAULT_PUBLICATION.to_owned()),
            state_dir: raw
                .state_dir
                .clone()
                .unwrap_or_else(|| lake.default_state_dir()),
            lake,
            namespace: raw.namespace.clone(),
            table_names,
            run: RunSettings {
                flush_interval: flush_interval.unwrap_or(defaults.flush_interval),
                max_batch_rows,
                max_batch_bytes,
                atomic_commits: raw.atomic_commits.unwrap_or(defaults.atomic_commits),
                compact_after_files,
                load_connections,
                backfill,
                backfill_chunk_rows,
                retention: Retention {
                    older_than: older_than.unwrap_or(defaults.retention.older_than),
                    retain_last,
                },
                exit_when_idle,
                heartbeat_interval,
                retained_wal_warn_bytes,
                storage_retry_deadline: storage_retry_deadline
                    .unwrap_or(defaults.storage_retry_deadline),
            },
            metrics_addr,
            log_format,
            proto_version,
            streaming,
        })
    }

    /// `table_names`, each entry checked against the tables.
    fn table_names(
        &self,
        raw: &Raw,
        tables: &[TableName],
        problems: &mut Problems,
    ) -> BTreeMap<TableName, String> {
        let mut table_names = BTreeMap::new();
        for (table, name) in raw.table_names.iter().flatten() {
            let Some(table) =
                problems.take(TableName::parse(table).map_err(|e| self.error("table_names", e)))
            else {
                continue;
            };
            if !tables.is_empty() && !tables.contains(&table) {
                problems.add(self.error(
                    "table_names",
                    format!("names {table}, which is not among the tables"),
                ));
            } else if name.is_empty() || name.contains('.') || name.ends_with("_changes") {
                problems.add(self.error(
                    "table_names",
                    format!(
                        "{name:?} for {table}: a name must be non-empty, without dots, and not end in _changes (the bronze suffix)"
                    ),
                ));
            } else {
                table_names.insert(table, name.clone());
            }
        }
        table_names
    }
}

/// Every invalid setting's error, gathered so that one start tells them
/// all rather than one per try.
#[derive(Default)]
struct Problems(Vec<Error>);

impl Problems {
    fn add(&mut self, err: Error) {
        self.0.push(err);
    }

    /// `result`'s value, its error kept for [`Problems::finish`].
    fn take<T>(&mut self, result: Result<T>) -> Option<T> {
        result.map_err(|e| self.add(e)).ok()
    }

    /// One error for all: the only one as it is, several one per line.
    fn finish(mut self) -> Result<()> {
        match self.0.len() {
            0 => Ok(()),
            1 => Err(self.0.remove(0)),
            n => Err(Error::new(
                ErrorKind::Config,
                format!(
                    "{n} settings are invalid:\n  {}",
                    self.0
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("\n  ")
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
