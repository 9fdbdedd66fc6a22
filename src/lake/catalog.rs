//! The embedded catalog: an Iceberg SQL catalog on SQLite, by default at
//! `<lake>/catalog.db` with the warehouse at `<lake>/warehouse`, the layout
//! pyiceberg's `SqlCatalog` and DuckDB read with no options; the catalog
//! file and the warehouse may also live apart ([`LakeLocation`]), and the
//! warehouse on S3 (`s3://bucket/prefix`, see `storage`). Tables are
//! registered under the catalog name [`CATALOG_NAME`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::io::{LocalFsStorageFactory, StorageFactory};
use iceberg::spec::Schema;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_sql::{SqlBindStyle, SqlCatalog, SqlCatalogBuilder};

use super::storage::{CatalogProperties, Warehouse, object_store};
use crate::error::{Error, ErrorKind, Result};

/// The name tables are registered under in the SQL catalog (pyiceberg:
/// `SqlCatalog("local", uri=..., warehouse=...)`).
pub const CATALOG_NAME: &str = "local";

/// Where a lake lives: the SQLite file of its SQL catalog, its warehouse
/// and what its storage needs (an S3 endpoint, credentials). By default
/// the catalog and a local warehouse sit in one folder, as
/// `<lake>/catalog.db` and `<lake>/warehouse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LakeLocation {
    pub catalog: PathBuf,
    pub warehouse: Warehouse,
    pub properties: CatalogProperties,
}

impl LakeLocation {
    pub fn in_folder(root: &Path) -> LakeLocation {
        LakeLocation {
            catalog: root.join("catalog.db"),
            warehouse: Warehouse::Folder(root.join("warehouse")),
            properties: CatalogProperties::default(),
        }
    }

    /// The default state directory: `state/` beside the catalog file
    /// (`<lake>/state`).
    pub fn default_state_dir(&self) -> PathBuf {
        self.catalog
            .parent()
            .unwrap_or(Path::new("."))
            .join("state")
    }
}

impl From<PathBuf> for LakeLocation {
    fn from(root: PathBuf) -> LakeLocation {
        LakeLocation::in_folder(&root)
    }
}

/// An Iceberg catalog and the file it lives in.
pub struct Lake {
    catalog: SqlCatalog,
    catalog_file: PathBuf,
    /// Opened with a local warehouse: a table on S3 needs the store's
    /// settings to be read.
    local: bool,
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
        // A reader never writes there; a missing warehouse is fine for it.
        let (warehouse, storage, props): (_, Arc<dyn StorageFactory>, _) = match &location.warehouse
        {
            Warehouse::Folder(path) => {
                let path =
                    folder(path).or_else(|e| if create { Err(e) } else { Ok(path.clone()) })?;
                let uri = format!("file://{}", path.display());
                (uri, Arc::new(LocalFsStorageFactory), HashMap::new())
            }
            Warehouse::Uri(uri) => (
                uri.clone(),
                object_store(),
                location.properties.storage_props(),
            ),
        };
        let catalog_dir = folder(
            location
                .catalog
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
        )?;
        let file_name = location.catalog.file_name().ok_or_else(|| {
            Error::new(ErrorKind::Config, "catalog: not a file path")
                .with_context("file", location.catalog.display())
        })?;
        let db = catalog_dir.join(file_name);
        sqlx::any::install_default_drivers();
        let catalog = SqlCatalogBuilder::default()
            .uri(format!("sqlite:{}?mode=rwc", db.display()))
            .warehouse_location(warehouse)
            .sql_bind_style(SqlBindStyle::QMark)
            .with_storage_factory(storage)
            .load(CATALOG_NAME, props)
            .await
            .map_err(|e| {
                iceberg_error(e, "cannot open the SQL catalog").with_context("file", db.display())
            })?;
        Ok(Lake {
            catalog,
            catalog_file: db,
            local: matches!(location.warehouse, Warehouse::Folder(_)),
        })
    }

    /// Opens a lake that must exist already (for readers: a mistyped path
    /// is an error, not a new empty lake).
    pub async fn open_existing(location: &LakeLocation) -> Result<Lake> {
        if !location.catalog.is_file() {
            return Err(Error::new(
                ErrorKind::Config,
                "no lake here: the catalog file does not exist (give the --lake or --catalog a run wrote to)",
            )
            .with_context("file", location.catalog.display()));
        }
        Lake::open_at(location, false).await
    }

    pub async fn has_namespace(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.catalog
            .namespace_exists(namespace)
            .await
            .map_err(|e| iceberg_error(e, "cannot read the catalog"))
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
            .commit(&self.catalog)
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
            } else {
                "no such table in the lake".to_owned()
            };
            return Err(Error::new(ErrorKind::Config, message).with_context("table", &ident));
        }
        Ok(ident)
    }

    /// The SQLite file of the catalog.
    pub fn catalog_file(&self) -> &Path {
        &self.catalog_file
    }

    pub fn catalog(&self) -> &SqlCatalog {
        &self.catalog
    }

    /// Loads a table that exists.
    pub async fn catalog_table(&self, ident: &TableIdent) -> Result<Table> {
        self.catalog.load_table(ident).await.map_err(|e| {
            let on_s3 = self.local
                && ["s3://", "s3a://"]
                    .iter()
                    .any(|s| e.to_string().contains(s));
            let message = if on_s3 {
                "cannot load the table: its files are on S3; give the lake's --warehouse \
                     s3://... and the store's settings (docs/configuration.md, A lake on S3)"
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

    /// Loads the table, creating it (and its namespace) with `schema` when
    /// missing.
    pub async fn ensure_table(&self, ident: &TableIdent, schema: Schema) -> Result<Table> {
        self.ensure_table_with(ident, schema, &[]).await
    }

    /// [`Self::ensure_table`], a new table created with `properties` too.
    pub async fn ensure_table_with(
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
            return self
                .catalog
                .load_table(ident)
                .await
                .map_err(|e| context(e, "cannot load the table"));
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
        self.catalog
            .create_table(namespace, creation)
            .await
            .map_err(|e| context(e, "cannot create the table"))
    }
}

/// The namespace of a source database's tables.
pub fn namespace(database: &str) -> NamespaceIdent {
    NamespaceIdent::new(database.to_owned())
}

pub(crate) fn iceberg_error(err: iceberg::Error, message: &str) -> Error {
    let kind = if err.retryable() {
        ErrorKind::Io
    } else {
        ErrorKind::Lake
    };
    Error::new(kind, message.to_owned()).with_source(err)
}
