//! Where a lake lives: its catalog, its warehouse and their properties,
//! resolved from the settings as given.

use std::path::{Path, PathBuf};

use super::{in_object_store, is_s3};
use crate::lake::catalog::db::CatalogDb;
use crate::lake::catalog::uri::CatalogUri;
use crate::lake::storage::{CatalogProperties, Warehouse};

/// The name tables are registered under in the SQL catalog by default
/// (pyiceberg: `SqlCatalog("local", uri=..., warehouse=...)`).
pub(crate) const CATALOG_NAME: &str = "local";

/// Where a lake lives: its catalog, its warehouse and what its storage
/// needs (an S3 endpoint, credentials). By default a SQL catalog on SQLite
/// and a local warehouse sit in one folder, as `<lake>/catalog.db` and
/// `<lake>/warehouse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LakeLocation {
    /// The lake's folder (`--lake`): where the defaults live.
    pub folder: PathBuf,
    pub catalog: CatalogUri,
    /// Where the files live: for a REST catalog, whose server places the
    /// tables, what storage they are read and written through.
    pub(crate) warehouse: Warehouse,
    pub(crate) properties: CatalogProperties,
    /// The catalog's name: a SQL catalog's `catalog_name`, which every
    /// engine sharing its database opens it by [default: local].
    pub(crate) name: String,
}

impl LakeLocation {
    pub(crate) fn in_folder(root: &Path) -> LakeLocation {
        LakeLocation {
            folder: root.to_owned(),
            catalog: CatalogUri::Sql(CatalogDb::File(root.join("catalog.db"))),
            warehouse: Warehouse::Folder(root.join("warehouse")),
            properties: CatalogProperties::default(),
            name: CATALOG_NAME.to_owned(),
        }
    }

    /// The lake `choice` names, in `folder` (`--lake`); an error names
    /// the setting it is about.
    pub fn configure(
        folder: &Path,
        choice: &CatalogChoice<'_>,
    ) -> std::result::Result<LakeLocation, (&'static str, String)> {
        let mut lake = LakeLocation::in_folder(folder);
        match choice.name {
            Some(name) if name.trim().is_empty() => {
                return Err(("catalog_name", "a catalog's name is not empty".to_owned()));
            }
            Some(name) => lake.name = name.to_owned(),
            None => {}
        }
        match (choice.file, choice.uri) {
            (Some(_), Some(_)) => {
                return Err((
                    "catalog_uri",
                    "give the catalog's file or its URI, not both".to_owned(),
                ));
            }
            (Some(file), None) => {
                if let Some(kind) = choice.kind.filter(|k| *k != "sql") {
                    return Err((
                        "catalog_type",
                        format!("a catalog file is a SQL catalog's, not a {kind} catalog's"),
                    ));
                }
                lake.catalog = CatalogUri::Sql(CatalogDb::File(file.to_owned()));
            }
            (None, Some(uri)) => {
                lake.catalog = CatalogUri::parse(choice.kind, uri, choice.warehouse)
                    .map_err(|e| ("catalog_uri", e))?;
            }
            (None, None) => {
                if let Some(kind) = choice.kind
                    && let Some(catalog) =
                        CatalogUri::without_uri(kind).map_err(|e| ("catalog_type", e))?
                {
                    lake.catalog = catalog;
                }
            }
        }
        // A REST catalog's warehouse may be a name the server knows, and
        // the server places the tables: the warehouse here only says how
        // their files are reached, through S3 when the warehouse or the
        // properties name it.
        let rest = matches!(lake.catalog, CatalogUri::Rest { .. });
        let glue = matches!(lake.catalog, CatalogUri::Glue { .. });
        let properties = CatalogProperties::parse(choice.properties.iter().map(String::as_str))
            .map_err(|e| ("catalog_property", e))?;
        if glue {
            // Glue keeps pointers only: the tables' files are on S3.
            lake.warehouse = match choice.warehouse {
                Some(warehouse) if is_s3(warehouse) => {
                    Warehouse::parse(warehouse).map_err(|e| ("warehouse", e))?
                }
                _ => {
                    return Err((
                        "warehouse",
                        "a Glue catalog's tables live on S3: --warehouse s3://bucket/prefix"
                            .to_owned(),
                    ));
                }
            };
        } else if rest
            && (choice.warehouse.is_some_and(in_object_store) || properties.names_object_store())
        {
            lake.warehouse = Warehouse::Uri(
                choice
                    .warehouse
                    .filter(|w| in_object_store(w))
                    .unwrap_or("s3://")
                    .to_owned(),
            );
        } else if let Some(warehouse) = choice.warehouse.filter(|_| !rest) {
            lake.warehouse = Warehouse::parse(warehouse).map_err(|e| ("warehouse", e))?;
        }
        if !rest && properties.names_rest() {
            return Err((
                "catalog_property",
                "token, credential and the other REST properties are for a REST catalog".to_owned(),
            ));
        }
        if !glue && properties.names_glue() {
            return Err((
                "catalog_property",
                "the glue.* properties are for a Glue catalog (--catalog-type glue)".to_owned(),
            ));
        }
        lake.properties = properties;
        Ok(lake)
    }

    /// The default state directory: `state/` beside the catalog file
    /// (`<lake>/state`), or in the lake's folder for a catalog that is
    /// not a file.
    pub(crate) fn default_state_dir(&self) -> PathBuf {
        match &self.catalog {
            CatalogUri::Sql(CatalogDb::File(file)) => file.parent().unwrap_or(Path::new(".")),
            _ => &self.folder,
        }
        .join("state")
    }
}

impl From<PathBuf> for LakeLocation {
    fn from(root: PathBuf) -> LakeLocation {
        LakeLocation::in_folder(&root)
    }
}

/// The settings of a lake's catalog, as given (flags, file or
/// environment).
#[derive(Debug, Default, Clone, Copy)]
pub struct CatalogChoice<'a> {
    /// `sql`, `rest` or `glue`; inferred from the URI when not given.
    pub kind: Option<&'a str>,
    /// A SQL catalog's SQLite file.
    pub file: Option<&'a Path>,
    pub uri: Option<&'a str>,
    pub warehouse: Option<&'a str>,
    /// `key=value` pairs.
    pub properties: &'a [String],
    pub name: Option<&'a str>,
}
