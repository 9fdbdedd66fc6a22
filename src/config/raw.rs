//! The settings as written, before they are checked.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One layer of raw values, as written in a file, the environment or
/// flags: the settings' one definition, which clap reads as flags and
/// serde as the file's keys (docs/configuration.md lists them; a test
/// keeps the two in step).
#[derive(Debug, Clone, Default, Deserialize, Serialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    /// Source connection: a postgres:// URL or key=value string; PG*
    /// environment variables and ~/.pgpass fill what it leaves out.
    #[arg(long)]
    pub(crate) source: Option<String>,
    /// Tables to capture, comma-separated: public.customers,public.orders.
    #[arg(long, value_delimiter = ',')]
    pub tables: Option<Vec<String>>,
    /// Replication slot name [default: wal2iceberg; for tail, a temporary
    /// slot of its own].
    #[arg(long)]
    pub(crate) slot: Option<String>,
    /// Publication name; created for the tables when missing [default: wal2iceberg].
    #[arg(long)]
    pub(crate) publication: Option<String>,
    /// Folder of the embedded lake: catalog.db and warehouse/ [default: ./lake].
    #[arg(long)]
    pub(crate) lake: Option<PathBuf>,
    /// The SQL catalog's SQLite file [default: <lake>/catalog.db]; in a
    /// file, a [catalog] table of pyiceberg's keys instead.
    #[arg(long, value_name = "FILE", value_parser = CatalogSetting::file)]
    pub(crate) catalog: Option<CatalogSetting>,
    /// The catalog type: sql, rest or glue [default: from the URI, else sql].
    #[arg(long, value_name = "TYPE")]
    pub(crate) catalog_type: Option<String>,
    /// The catalog's URI: for sql, sqlite:FILE or
    /// postgresql://user@host/db (a password in it, in PGPASSWORD or in
    /// ~/.pgpass, is never shown); for rest, http(s)://host:port.
    #[arg(long, value_name = "URI")]
    pub(crate) catalog_uri: Option<String>,
    /// The SQL catalog's name, which engines sharing its database open it
    /// by (pyiceberg's SqlCatalog(name), a JDBC catalog's name) [default: local].
    #[arg(long, value_name = "NAME")]
    pub(crate) catalog_name: Option<String>,
    /// The warehouse: a folder, s3://bucket/prefix or gs://bucket/prefix
    /// [default: <lake>/warehouse];
    /// for a REST catalog, the warehouse asked of it.
    #[arg(long, value_name = "FOLDER|URI")]
    pub(crate) warehouse: Option<String>,
    /// A catalog property, key=value, repeated: s3.endpoint,
    /// s3.access-key-id, s3.secret-access-key, s3.region,
    /// s3.path-style-access (the AWS_* variables fill what they leave out);
    /// gcs.service.host, gcs.credentials-json, gcs.oauth2.token, gcs.no-auth;
    /// for a REST catalog token, credential, oauth2-server-uri, scope,
    /// prefix, header.<name>.
    #[arg(long, value_name = "KEY=VALUE")]
    pub(crate) catalog_property: Option<Vec<String>>,
    /// Iceberg namespace [default: the source database's name].
    #[arg(long)]
    pub(crate) namespace: Option<String>,
    /// Local folder for what a run keeps between starts: the silver key
    /// indexes [default: <lake>/state].
    #[arg(long, value_name = "FOLDER")]
    pub(crate) state_dir: Option<PathBuf>,
    /// Iceberg names for source tables (a file or variable only).
    #[arg(skip)]
    pub(crate) table_names: Option<BTreeMap<String, String>>,
    /// Commit a batch at least this often (500ms, 1s, 2m) [default: 1s].
    #[arg(long, value_name = "DURATION")]
    pub(crate) flush_interval: Option<String>,
    /// Commit once a batch holds this many changes [default: 100000].
    #[arg(long)]
    pub(crate) max_batch_rows: Option<i64>,
    /// Commit once a batch holds about this many bytes [default: 134217728].
    #[arg(long)]
    pub(crate) max_batch_bytes: Option<i64>,
    /// Commit every table of a batch in one catalog commit, so readers see
    /// a source transaction in all its tables at once [default: true].
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) atomic_commits: Option<bool>,
    /// Compact silver once this many commits wrote files since its last
    /// compaction, and bronze every this many commits; fully once the
    /// stream is quiet; 0 never [default: 16].
    #[arg(long, value_name = "FILES")]
    pub(crate) compact_after_files: Option<i64>,
    /// Connections reading the initial load's tables in parallel, all in
    /// the slot's snapshot [default: 2].
    #[arg(long, value_name = "N")]
    pub(crate) load_connections: Option<i64>,
    /// How a table with a primary key is loaded: `snapshot` (one COPY in
    /// the slot's exported snapshot) or `chunked` (key-range chunks beside
    /// the stream, no transaction held long; docs/backfill.md)
    /// [default: snapshot].
    #[arg(long, value_name = "snapshot|chunked")]
    pub(crate) backfill: Option<String>,
    /// Rows of a chunked backfill's chunk [default: 100000].
    #[arg(long, value_name = "ROWS")]
    pub(crate) backfill_chunk_rows: Option<i64>,
    /// Expire snapshots older than this (2h, 7d), keeping the newest
    /// --retain-snapshots however old [default: 1h].
    #[arg(long, value_name = "DURATION")]
    pub(crate) snapshot_retention: Option<String>,
    /// Snapshots kept by the automatic expiry however old [default: 10].
    #[arg(long, value_name = "N")]
    pub(crate) retain_snapshots: Option<i64>,
    /// Drain, commit, confirm and exit 0 once no change came for this long.
    #[arg(long, value_name = "DURATION")]
    pub(crate) exit_when_idle: Option<String>,
    /// Serve Prometheus /metrics and /healthz here (127.0.0.1:9187).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<String>,
    /// Log lines as text or json [default: text].
    #[arg(long)]
    pub(crate) log_format: Option<String>,
    /// pgoutput protocol version, 1 or 2 [default: 2].
    #[arg(long)]
    pub(crate) proto_version: Option<i64>,
    /// Stream large transactions before they commit (protocol 2).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) streaming: Option<bool>,
    /// Emit a logical message this often so the slot advances on servers
    /// where other databases make the WAL (30s) [default: off].
    #[arg(long, value_name = "DURATION")]
    pub(crate) heartbeat_interval: Option<String>,
    /// Warn when the slot retains more WAL than this [default: 1073741824].
    #[arg(long, value_name = "BYTES")]
    pub(crate) retained_wal_warn_bytes: Option<i64>,
    /// Retry an object store that times out, resets or answers 5xx or
    /// SlowDown for this long with no commit landing, then exit [default: 5m].
    #[arg(long, value_name = "DURATION")]
    pub(crate) storage_retry_deadline: Option<String>,
}

/// `catalog`: the SQL catalog's SQLite file (`--catalog FILE`, `catalog =
/// "FILE"`), or in a file a `[catalog]` table with pyiceberg's keys: `type`,
/// `uri`, `warehouse` and the catalog properties (`token`, `s3.endpoint`,
/// ...). The flat keys (`catalog_type`, `catalog_uri`, `warehouse`,
/// `catalog_property`) win over the table's.
#[derive(Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum CatalogSetting {
    File(PathBuf),
    Table(BTreeMap<String, String>),
}

impl CatalogSetting {
    fn file(text: &str) -> std::result::Result<CatalogSetting, String> {
        Ok(CatalogSetting::File(PathBuf::from(text)))
    }
}

/// Property values may be secrets: the keys only.
impl std::fmt::Debug for CatalogSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatalogSetting::File(file) => write!(f, "File({})", file.display()),
            CatalogSetting::Table(table) => f.debug_set().entries(table.keys()).finish(),
        }
    }
}
