//! Which catalog a lake has, as pyiceberg users name it (a type and a
//! URI): a SQL catalog, in a SQLite file (the embedded default) or a
//! PostgreSQL database (`catalog_db`), an Iceberg REST catalog, or AWS
//! Glue.

use std::fmt;

use crate::lake::catalog::db::{CatalogDb, redacted};

#[derive(Clone, PartialEq, Eq)]
pub enum CatalogUri {
    Sql(CatalogDb),
    /// A REST catalog at an `http(s)://` base URI (before `/v1`), and the
    /// warehouse asked of it, a location or a name.
    Rest {
        uri: String,
        warehouse: Option<String>,
    },
    /// AWS Glue's Data Catalog, at its regional endpoint unless another is
    /// given (pyiceberg's `glue.endpoint`: a VPC endpoint, a test server).
    Glue {
        endpoint: Option<String>,
    },
}

/// The catalog types wal2iceberg knows.
const TYPES: &str = "sql, rest or glue";

impl CatalogUri {
    /// The catalog of `kind` (`sql`, `rest`; inferred from the URI when
    /// not given, as pyiceberg infers it) at `uri`; a REST catalog is
    /// asked for `warehouse`; Glue's URI is its endpoint. Types
    /// wal2iceberg does not know are refused up front.
    pub(crate) fn parse(
        kind: Option<&str>,
        uri: &str,
        warehouse: Option<&str>,
    ) -> Result<CatalogUri, String> {
        let http = uri.starts_with("http://") || uri.starts_with("https://");
        match (kind, http) {
            (None | Some("rest"), true) => {
                url::Url::parse(uri).map_err(|e| format!("not a URL: {e}"))?;
                Ok(CatalogUri::Rest {
                    uri: uri.trim_end_matches('/').to_owned(),
                    warehouse: warehouse.map(str::to_owned),
                })
            }
            (Some("rest"), false) => Err(format!(
                "a REST catalog's URI is http(s)://host:port, not {uri:?}"
            )),
            (None | Some("sql"), false) => CatalogDb::parse_uri(uri).map(CatalogUri::Sql),
            (Some("glue"), true) => {
                url::Url::parse(uri).map_err(|e| format!("not a URL: {e}"))?;
                Ok(CatalogUri::Glue {
                    endpoint: Some(uri.trim_end_matches('/').to_owned()),
                })
            }
            (Some("glue"), false) => Err(format!(
                "a Glue catalog's URI is its endpoint, http(s)://host[:port], not {uri:?}; \
                 without one, AWS's endpoint of the region"
            )),
            (Some("sql"), true) => Err(
                "a SQL catalog's URI is sqlite:FILE or postgresql://user@host/db; an http URI \
                 is a REST catalog (catalog type rest)"
                    .to_owned(),
            ),
            (Some(other), _) => Err(unknown(other)),
        }
    }

    /// The catalog of a type given without a URI: a SQL catalog has one by
    /// default (the lake's SQLite file, `None` here), Glue its region's.
    pub(crate) fn without_uri(kind: &str) -> Result<Option<CatalogUri>, String> {
        match kind {
            "sql" => Ok(None),
            "glue" => Ok(Some(CatalogUri::Glue { endpoint: None })),
            "rest" => Err("a REST catalog needs its URI: --catalog-uri http://host:8181".into()),
            other => Err(unknown(other)),
        }
    }

    /// The SQL catalog's database, for what only a SQL catalog has.
    pub(crate) fn db(&self) -> Option<&CatalogDb> {
        match self {
            CatalogUri::Sql(db) => Some(db),
            CatalogUri::Rest { .. } | CatalogUri::Glue { .. } => None,
        }
    }

    /// Whether a catalog can be here already: a SQLite file exists; a
    /// server or database is asked when opened.
    pub(crate) fn may_exist(&self) -> bool {
        self.db().is_none_or(CatalogDb::may_exist)
    }
}

fn unknown(kind: &str) -> String {
    format!("{kind:?} is not a catalog type: {TYPES}")
}

impl fmt::Display for CatalogUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatalogUri::Sql(db) => write!(f, "{db}"),
            CatalogUri::Rest { uri, .. } => write!(f, "{}", redacted(uri)),
            CatalogUri::Glue { endpoint: None } => write!(f, "glue"),
            CatalogUri::Glue {
                endpoint: Some(endpoint),
            } => write!(f, "glue at {}", redacted(endpoint)),
        }
    }
}

impl fmt::Debug for CatalogUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CatalogUri({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_is_inferred_from_the_uri_and_must_agree_with_it() {
        let rest = CatalogUri::parse(None, "http://cat:8181/", Some("lake")).unwrap();
        assert_eq!(
            rest,
            CatalogUri::Rest {
                uri: "http://cat:8181".into(),
                warehouse: Some("lake".into())
            }
        );
        assert_eq!(
            CatalogUri::parse(Some("rest"), "https://cat/api/catalog", None).unwrap(),
            CatalogUri::Rest {
                uri: "https://cat/api/catalog".into(),
                warehouse: None
            }
        );
        assert!(matches!(
            CatalogUri::parse(Some("sql"), "postgresql://h/db", None),
            Ok(CatalogUri::Sql(CatalogDb::Postgres(_)))
        ));
        for (kind, uri) in [
            (Some("sql"), "http://cat:8181"),
            (Some("rest"), "postgresql://h/db"),
            (Some("glue"), "glue.example"),
            (Some("hive"), "thrift://x"),
        ] {
            assert!(
                CatalogUri::parse(kind, uri, None).is_err(),
                "{kind:?} {uri}"
            );
        }
        assert_eq!(
            CatalogUri::parse(Some("glue"), "http://127.0.0.1:5000/", None).unwrap(),
            CatalogUri::Glue {
                endpoint: Some("http://127.0.0.1:5000".into())
            }
        );
        assert_eq!(
            CatalogUri::without_uri("glue").unwrap(),
            Some(CatalogUri::Glue { endpoint: None })
        );
        assert!(CatalogUri::without_uri("rest").is_err());
        assert!(CatalogUri::without_uri("hive").is_err());
        assert_eq!(CatalogUri::without_uri("sql").unwrap(), None);
    }

    #[test]
    fn a_password_in_a_rest_uri_is_never_shown() {
        let rest = CatalogUri::parse(None, "https://svc:s3cret@cat/api", None).unwrap();
        let shown = format!("{rest} {rest:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("svc:***@cat"),
            "{shown}"
        );
    }
}
