//! The catalog: an Iceberg SQL catalog on SQLite, by default at
//! `<lake>/catalog.db` with the warehouse at `<lake>/warehouse`, the layout
//! pyiceberg's `SqlCatalog` and DuckDB read with no options; the catalog
//! file and the warehouse may also live apart ([`LakeLocation`]), the
//! catalog in a PostgreSQL database (`db`), be a REST catalog (`uri`,
//! `rest_tables`, `rest_commit`) or AWS Glue (`glue`, `glue_commit`), and
//! the warehouse on S3 or GCS (`s3://bucket/prefix`, `gs://bucket/prefix`,
//! see `lake::storage`). A SQL catalog registers tables under the catalog
//! name [`CATALOG_NAME`] unless one is chosen. Each backend's commit is its
//! own module (`commit` for the SQL catalogs); `row_delta` plans the one
//! snapshot kind iceberg-rust 0.10 lacks.

pub mod commit;
pub(crate) mod db;
pub(crate) mod glue;
pub(crate) mod glue_commit;
mod location;
pub(crate) mod rest_commit;
pub(crate) mod rest_tables;
pub mod row_delta;
pub(crate) mod uri;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use iceberg::io::StorageFactory;
use iceberg::spec::Schema;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_glue::GlueCatalogBuilder;
use iceberg_catalog_rest::RestCatalogBuilder;
use iceberg_catalog_sql::SqlCatalogBuilder;

use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::db::CatalogDb;
use crate::lake::catalog::glue_commit::GlueCommits;
use crate::lake::catalog::rest_commit::RestCommits;
use crate::lake::catalog::uri::CatalogUri;
use crate::lake::iceberg_error;
use crate::lake::storage::durable_fs::DurableFsFactory;
use crate::lake::storage::listing::{delete_each, files_under};
use crate::lake::storage::{Warehouse, object_store};

pub use location::{CatalogChoice, LakeLocation};

/// How often [`Lake::update_properties`] tries when other commits come first.
const PROPERTY_ATTEMPTS: usize = 10;

fn is_s3(location: &str) -> bool {
    location.starts_with("s3://") || location.starts_with("s3a://")
}

fn in_object_store(location: &str) -> bool {
    is_s3(location) || location.starts_with("gs://")
}

/// An Iceberg catalog, and where the commits `row_delta` and `expire`
/// make themselves go.
pub struct Lake {
    catalog: Arc<dyn Catalog>,
    commits: Commits,
    /// Opened with a local warehouse: a table on S3 needs the store's
    /// settings to be read.
    local: bool,
}

/// Where a lake's own commits go.
pub(crate) enum Commits {
    /// A compare-and-swap of the pointer in a SQL catalog's database,
    /// through a pool of one connection.
    Sql {
        pool: sqlx::AnyPool,
        db: CatalogDb,
        /// The catalog's name, as its rows give it.
        name: String,
    },
    /// The REST catalog's table update.
    Rest(Box<RestCommits>),
    /// Glue's `UpdateTable` under the table's version.
    Glue(GlueCommits),
}

impl Lake {
    /// Opens (creating when missing) the embedded lake in `root`.
    pub async fn open_embedded(root: &Path) -> Result<Lake> {
        Lake::open(&LakeLocation::in_folder(root)).await
    }

    /// Opens (creating when missing) the lake at `location`.
    pub async fn open(location: &LakeLocation) -> Result<Lake> {
        Lake::open_at(location, true).await
    }

    async fn open_at(location: &LakeLocation, create: bool) -> Result<Lake> {
        let folder = |path: &Path| {
            if create {
                std::fs::create_dir_all(path)
            } else {
                Ok(())
            }
            .and_then(|()| path.canonicalize())
            .map_err(|e| {
                Error::new(ErrorKind::Io, "cannot create the lake's folder")
                    .with_context("folder", path.display())
                    .with_source(e)
            })
        };
        let rest = matches!(location.catalog, CatalogUri::Rest { .. });
        // A reader never writes there; a missing warehouse is fine for it.
        // A REST catalog's server places the tables itself.
        let (warehouse, storage, props): (_, Arc<dyn StorageFactory>, _) = match &location.warehouse
        {
            Warehouse::Folder(_) if rest => {
                (String::new(), Arc::new(DurableFsFactory), HashMap::new())
            }
            Warehouse::Folder(path) => {
                let path =
                    folder(path).or_else(|e| if create { Err(e) } else { Ok(path.clone()) })?;
                let uri = format!("file://{}", path.display());
                (uri, Arc::new(DurableFsFactory), HashMap::new())
            }
            Warehouse::Uri(uri) => (
                uri.clone(),
                object_store(),
                location.properties.storage_props(),
            ),
        };
        let opened = |e| {
            iceberg_error(e, "cannot open the catalog").with_context("catalog", &location.catalog)
        };
        let (catalog, commits): (Arc<dyn Catalog>, _) = match &location.catalog {
            CatalogUri::Sql(db) => {
                let file = match db {
                    CatalogDb::File(file) => {
                        let catalog_dir = folder(
                            file.parent()
                                .filter(|p| !p.as_os_str().is_empty())
                                .unwrap_or(Path::new(".")),
                        )?;
                        let file_name = file.file_name().ok_or_else(|| {
                            Error::new(ErrorKind::Config, "catalog: not a file path")
                                .with_context("file", file.display())
                        })?;
                        Some(catalog_dir.join(file_name))
                    }
                    CatalogDb::Postgres(_) => None,
                };
                let url = db.sqlx_url(file.as_deref());
                sqlx::any::install_default_drivers();
                // The catalog makes its tables when missing; another
                // engine making them at the same moment makes PostgreSQL
                // refuse one `CREATE TABLE IF NOT EXISTS` (a unique
                // violation in its own catalog), and opened again it finds
                // them made.
                let mut attempts = 0;
                let catalog = loop {
                    let opened_catalog = SqlCatalogBuilder::default()
                        .uri(&url)
                        .warehouse_location(warehouse.clone())
                        .sql_bind_style(db.bind_style())
                        .with_storage_factory(storage.clone())
                        .load(&location.name, props.clone())
                        .await;
                    match opened_catalog {
                        Err(e) if attempts < 3 && e.to_string().contains("duplicate key value") => {
                            attempts += 1;
                        }
                        other => break other.map_err(opened)?,
                    }
                };
                let pool = sqlx::any::AnyPoolOptions::new()
                    .max_connections(1)
                    .connect_lazy(&url)
                    .map_err(|e| {
                        Error::new(ErrorKind::Lake, "cannot open the SQL catalog")
                            .with_context("catalog", &location.catalog)
                            .with_source(e)
                    })?;
                (
                    Arc::new(catalog),
                    Commits::Sql {
                        pool,
                        db: db.clone(),
                        name: location.name.clone(),
                    },
                )
            }
            CatalogUri::Rest { uri, warehouse } => {
                let mut props: HashMap<String, String> = props
                    .into_iter()
                    .chain(location.properties.rest_props())
                    .collect();
                props.insert("uri".to_owned(), uri.clone());
                // As pyiceberg asks: the server may hand out credentials
                // for a table's files with it.
                props
                    .entry("header.X-Iceberg-Access-Delegation".to_owned())
                    .or_insert_with(|| "vended-credentials".to_owned());
                if let Some(warehouse) = warehouse {
                    props.insert("warehouse".to_owned(), warehouse.clone());
                }
                let commits = RestCommits::new(uri, props.clone(), storage.clone());
                let catalog = RestCatalogBuilder::default()
                    .with_storage_factory(storage)
                    .load(&location.name, props)
                    .await
                    .map_err(opened)?;
                (Arc::new(catalog), Commits::Rest(Box::new(commits)))
            }
            CatalogUri::Glue { endpoint } => {
                let props = glue::catalog_props(
                    &location.properties,
                    endpoint.as_deref(),
                    &warehouse,
                    props,
                )?;
                let commits = glue::connect(&props).await;
                let inner = GlueCatalogBuilder::default()
                    .with_storage_factory(storage)
                    .load(&location.name, props)
                    .await
                    .map_err(opened)?;
                let catalog = glue::GlueCatalog {
                    inner,
                    commits: commits.clone(),
                    warehouse,
                };
                (Arc::new(catalog), Commits::Glue(commits))
            }
        };
        Ok(Lake {
            catalog,
            commits,
            local: matches!(location.warehouse, Warehouse::Folder(_)),
        })
    }

    /// Opens a lake that must exist already (for readers: a mistyped path
    /// is an error, not a new empty lake).
    pub async fn open_existing(location: &LakeLocation) -> Result<Lake> {
        if !location.catalog.may_exist() {
            return Err(Error::new(
                ErrorKind::Config,
                "no lake here: the catalog file does not exist (give the --lake or --catalog a run wrote to)",
            )
            .with_context("file", &location.catalog));
        }
        Lake::open_at(location, false).await
    }

    pub(crate) async fn has_namespace(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.catalog
            .namespace_exists(namespace)
            .await
            .map_err(|e| iceberg_error(e, "cannot read the catalog"))
    }

    /// Sets properties of the table `ident` in one commit, on the table as
    /// it is now, reloading it and trying again when another commit (a
    /// run's) came first.
    pub(crate) async fn update_properties(
        &self,
        ident: &TableIdent,
        properties: &[(&str, String)],
    ) -> Result<()> {
        let mut attempt = 1;
        loop {
            let table = self.catalog_table(ident).await?;
            match self.set_properties(&table, properties).await {
                Ok(()) => return Ok(()),
                Err(_) if attempt < PROPERTY_ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50 * attempt as u64)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sets table properties, in one commit.
    pub async fn set_properties(&self, table: &Table, properties: &[(&str, String)]) -> Result<()> {
        let tx = Transaction::new(table);
        let action = properties
            .iter()
            .fold(tx.update_table_properties(), |action, (k, v)| {
                action.set((*k).to_owned(), v.clone())
            });
        let context = |e: iceberg::Error| {
            iceberg_error(e, "cannot set the table's properties")
                .with_context("table", table.identifier())
        };
        action
            .apply(tx)
            .map_err(context)?
            .commit(self.catalog.as_ref())
            .await
            .map_err(context)?;
        Ok(())
    }

    /// Every table of `namespace`, or of the lake's only namespace.
    pub async fn tables(&self, namespace: Option<&str>) -> Result<Vec<TableIdent>> {
        let any = self.resolve_namespace(namespace).await?;
        let mut tables = self
            .catalog
            .list_tables(&any)
            .await
            .map_err(|e| iceberg_error(e, "cannot read the catalog"))?;
        tables.sort_by(|a, b| a.name().cmp(b.name()));
        Ok(tables)
    }

    /// `namespace`, or the lake's only namespace.
    async fn resolve_namespace(&self, namespace: Option<&str>) -> Result<NamespaceIdent> {
        if let Some(ns) = namespace {
            return Ok(NamespaceIdent::new(ns.to_owned()));
        }
        let namespaces = self
            .catalog
            .list_namespaces(None)
            .await
            .map_err(|e| iceberg_error(e, "cannot read the catalog"))?;
        match namespaces.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(Error::new(
                ErrorKind::Config,
                format!(
                    "the catalog holds no namespace{}",
                    self.other_catalogs().await
                ),
            )),
            _ => Err(Error::new(
                ErrorKind::Config,
                format!(
                    "the lake has {} namespaces ({}): name one with --namespace or as namespace.table",
                    namespaces.len(),
                    namespaces
                        .iter()
                        .map(|n| n.join("."))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    /// For an error about a SQL catalog that lacks what was asked: the
    /// other catalog names its database holds tables under, and how to
    /// choose one; empty when there are none (or they cannot be read).
    async fn other_catalogs(&self) -> String {
        let Commits::Sql { pool, db, name } = &self.commits else {
            return String::new();
        };
        let sql = db.placeholders(
            "SELECT DISTINCT catalog_name FROM iceberg_tables WHERE catalog_name <> ? \
             ORDER BY catalog_name",
        );
        let names: Vec<String> = match sqlx::query_scalar(&sql).bind(name).fetch_all(pool).await {
            Ok(names) => names,
            Err(_) => return String::new(),
        };
        if names.is_empty() {
            return format!(" (catalog name {name:?})");
        }
        format!(
            " (catalog name {name:?}); its database holds tables of the catalogs {}: choose \
             one with --catalog-name (catalog_name)",
            names.join(", ")
        )
    }

    /// The tables `names` name ([`Lake::resolve_table`]), or when none is
    /// named every table of `namespace` ([`Lake::tables`]).
    pub async fn tables_named(
        &self,
        names: &[String],
        namespace: Option<&str>,
    ) -> Result<Vec<TableIdent>> {
        if names.is_empty() {
            return self.tables(namespace).await;
        }
        let mut idents = Vec::new();
        for name in names {
            idents.push(self.resolve_table(name, namespace).await?);
        }
        Ok(idents)
    }

    /// The table `name` names: `namespace.table`, or `table` in
    /// `namespace`, or in the lake's only namespace.
    pub async fn resolve_table(&self, name: &str, namespace: Option<&str>) -> Result<TableIdent> {
        let ident = match name.rsplit_once('.') {
            Some((ns, table)) => {
                TableIdent::new(NamespaceIdent::new(ns.to_owned()), table.to_owned())
            }
            None => TableIdent::new(self.resolve_namespace(namespace).await?, name.to_owned()),
        };
        if self.table_if_exists(&ident).await?.is_none() {
            let history = TableIdent::new(
                ident.namespace().clone(),
                format!("{}_changes", ident.name()),
            );
            let message = if self.table_if_exists(&history).await?.is_some() {
                // A table without a primary key keeps its history only.
                format!("no such table in the lake; its history is {history}")
            } else if !self.has_namespace(ident.namespace()).await? {
                format!(
                    "no such table in the lake: the catalog holds no namespace {}{}",
                    ident.namespace().join("."),
                    self.other_catalogs().await
                )
            } else {
                "no such table in the lake".to_owned()
            };
            return Err(Error::new(ErrorKind::Config, message).with_context("table", &ident));
        }
        Ok(ident)
    }

    /// Where the commits `row_delta` and `expire` make go.
    pub(crate) fn commits(&self) -> &Commits {
        &self.commits
    }

    /// Whether the catalog commits several tables at once (a SQL
    /// catalog's transaction, REST's `transactions/commit`); Glue cannot.
    pub(crate) fn commits_tables_together(&self) -> bool {
        !matches!(self.commits, Commits::Glue(_))
    }

    pub fn catalog(&self) -> &dyn Catalog {
        self.catalog.as_ref()
    }

    /// Loads a table that exists (from a REST catalog with the
    /// credentials it vends for the table's files: `rest_tables`).
    pub async fn catalog_table(&self, ident: &TableIdent) -> Result<Table> {
        if let Commits::Rest(rest) = &self.commits {
            return rest.load_table(ident).await;
        }
        self.catalog.load_table(ident).await.map_err(|e| {
            let on_store = self.local
                && ["s3://", "s3a://", "gs://"]
                    .iter()
                    .any(|s| e.to_string().contains(s));
            let message = if on_store {
                "cannot load the table: its files are in an object store; give the lake's \
                     --warehouse s3://... or gs://... and the store's settings \
                     (docs/configuration.md, A lake on S3, on Google Cloud Storage)"
            } else {
                "cannot load the table"
            };
            iceberg_error(e, message).with_context("table", ident)
        })
    }

    /// Loads the table if it exists.
    pub async fn table_if_exists(&self, ident: &TableIdent) -> Result<Option<Table>> {
        let exists = self.catalog.table_exists(ident).await.map_err(|e| {
            iceberg_error(e, "cannot read the catalog").with_context("table", ident)
        })?;
        if !exists {
            return Ok(None);
        }
        self.catalog_table(ident).await.map(Some)
    }

    /// Drops a table from the catalog and deletes its folder.
    pub(crate) async fn drop_with_files(&self, ident: &TableIdent) -> Result<()> {
        let table = self.catalog_table(ident).await?;
        let location = table.metadata().location().to_owned();
        let local = location.strip_prefix("file://");
        // Never a bucket's root: a table another tool registered there would
        // take every object of the bucket with it.
        let in_bucket = location.split_once("://").map_or("", |(_, rest)| rest);
        if local.is_none() && !in_bucket.trim_end_matches('/').contains('/') {
            return Err(Error::new(
                ErrorKind::Lake,
                "the table's location is a bucket's root: drop it with the engine that made it",
            )
            .with_context("table", ident)
            .with_context("location", &location));
        }
        // GCS's objects go one request each, from a listing made while the
        // table is still in the catalog (a listing that fails leaves it
        // there): its batch delete is not taken by every server
        // (fake-gcs-server refuses opendal's). Elsewhere the store's own.
        let listed = if location.starts_with("gs://") {
            files_under(&location, table.file_io().config().props())
                .await
                .map_err(|e| e.with_context("table", ident))?
        } else {
            None
        };
        self.catalog
            .drop_table(ident)
            .await
            .map_err(|e| iceberg_error(e, "cannot drop the table").with_context("table", ident))?;
        let Some(folder) = local else {
            let deleted = match listed {
                Some(files) => delete_each(table.file_io(), files).await,
                None => table.file_io().delete_prefix(&location).await.map_err(|e| {
                    iceberg_error(e, "cannot delete the table's files")
                        .with_context("location", &location)
                }),
            };
            return deleted.map_err(|e| e.with_context("table", ident));
        };
        match std::fs::remove_dir_all(folder) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::new(ErrorKind::Io, "cannot delete the table's files")
                .with_context("folder", folder)
                .with_source(e)),
        }
    }

    /// Loads the table, creating it (and its namespace) with `schema` when
    /// missing.
    pub async fn ensure_table(&self, ident: &TableIdent, schema: Schema) -> Result<Table> {
        self.ensure_table_with(ident, schema, &[]).await
    }

    /// [`Self::ensure_table`], a new table created with `properties` too.
    pub(crate) async fn ensure_table_with(
        &self,
        ident: &TableIdent,
        schema: Schema,
        properties: &[(&str, &str)],
    ) -> Result<Table> {
        let context =
            |e: iceberg::Error, what: &str| iceberg_error(e, what).with_context("table", ident);
        let namespace = ident.namespace();
        if !self
            .catalog
            .namespace_exists(namespace)
            .await
            .map_err(|e| context(e, "cannot read the catalog"))?
        {
            self.catalog
                .create_namespace(namespace, HashMap::new())
                .await
                .map_err(|e| context(e, "cannot create the namespace"))?;
        }
        if self
            .catalog
            .table_exists(ident)
            .await
            .map_err(|e| context(e, "cannot read the catalog"))?
        {
            return self.catalog_table(ident).await;
        }
        let creation = TableCreation::builder()
            .name(ident.name().to_owned())
            .schema(schema)
            .properties(
                [("write.parquet.compression-codec", "zstd")]
                    .iter()
                    .chain(properties)
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<HashMap<_, _>>(),
            )
            .build();
        let created = self
            .catalog
            .create_table(namespace, creation)
            .await
            .map_err(|e| context(e, "cannot create the table"))?;
        match &self.commits {
            // Loaded again: a REST server vends the table's credentials
            // where iceberg-rust does not read them.
            Commits::Rest(_) => self.catalog_table(ident).await,
            _ => Ok(created),
        }
    }
}

/// The namespace of a source database's tables.
pub fn namespace(database: &str) -> NamespaceIdent {
    NamespaceIdent::new(database.to_owned())
}
