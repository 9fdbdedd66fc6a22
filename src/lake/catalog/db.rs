//! The SQL catalog's database: a SQLite file (the embedded default), or a
//! PostgreSQL database that other engines share. Either holds the tables
//! pyiceberg's `SqlCatalog` and Iceberg's JDBC catalog create and read
//! (`iceberg_tables`, `iceberg_namespace_properties`), so a pyiceberg
//! `SqlCatalog("local", uri="postgresql+psycopg2://...")` or a Spark
//! `JdbcCatalog` named `local` sees what wal2iceberg writes.
//!
//! A PostgreSQL URL may carry a password: [`CatalogDb`] shows it, in
//! `Debug` and `Display` alike, with the password and any `password`
//! parameter replaced by `***`.

use std::fmt;
use std::path::{Path, PathBuf};

use iceberg_catalog_sql::SqlBindStyle;

#[derive(Clone, PartialEq, Eq)]
pub enum CatalogDb {
    /// A SQLite file, created when missing.
    File(PathBuf),
    /// A `postgresql://` (or `postgres://`) URL of a database that exists.
    Postgres(String),
}

impl CatalogDb {
    /// A catalog URI: `sqlite:FILE` or `postgresql://user@host/db`.
    pub(crate) fn parse_uri(text: &str) -> Result<CatalogDb, String> {
        if let Some(file) = text.strip_prefix("sqlite:") {
            let file = file.strip_prefix("//").unwrap_or(file);
            let file = file.split_once('?').map_or(file, |(file, _)| file);
            return match file.is_empty() {
                true => Err("sqlite: needs a file: sqlite:/var/lib/w2i/catalog.db".into()),
                false => Ok(CatalogDb::File(PathBuf::from(file))),
            };
        }
        if text.starts_with("postgresql://") || text.starts_with("postgres://") {
            let url = url::Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
            if url.path().trim_start_matches('/').is_empty() {
                return Err("the URL names no database: postgresql://user@host/catalog".into());
            }
            return Ok(CatalogDb::Postgres(text.to_owned()));
        }
        let scheme = text.split_once(':').map_or(text, |(scheme, _)| scheme);
        Err(format!(
            "{scheme:?} is not a catalog database wal2iceberg knows: sqlite:FILE or postgresql://user@host/db"
        ))
    }

    /// Whether a catalog can be here already: the file exists, or (a
    /// database, asked when opened) always.
    pub(crate) fn may_exist(&self) -> bool {
        match self {
            CatalogDb::File(file) => file.is_file(),
            CatalogDb::Postgres(_) => true,
        }
    }

    /// The URL sqlx connects with; `file` is the SQLite file as opened.
    pub(crate) fn sqlx_url(&self, file: Option<&Path>) -> String {
        match self {
            CatalogDb::File(f) => format!("sqlite:{}?mode=rwc", file.unwrap_or(f).display()),
            CatalogDb::Postgres(url) => url.clone(),
        }
    }

    pub(crate) fn bind_style(&self) -> SqlBindStyle {
        match self {
            CatalogDb::File(_) => SqlBindStyle::QMark,
            CatalogDb::Postgres(_) => SqlBindStyle::DollarNumeric,
        }
    }

    /// `sql` with each `?` numbered as the database wants its parameters.
    pub(crate) fn placeholders(&self, sql: &str) -> String {
        match self {
            CatalogDb::File(_) => sql.to_owned(),
            CatalogDb::Postgres(_) => {
                let mut n = 0;
                sql.chars()
                    .map(|c| match c {
                        '?' => {
                            n += 1;
                            format!("${n}")
                        }
                        c => c.to_string(),
                    })
                    .collect()
            }
        }
    }
}

impl fmt::Display for CatalogDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatalogDb::File(file) => write!(f, "{}", file.display()),
            CatalogDb::Postgres(text) => write!(f, "{}", redacted(text)),
        }
    }
}

/// A URL as it may be shown: a password in it, and any `password`
/// parameter, replaced by `***`; a URL that does not parse, its scheme
/// alone.
pub(crate) fn redacted(text: &str) -> String {
    let Ok(mut url) = url::Url::parse(text) else {
        let scheme = text.split_once("://").map_or("", |(scheme, _)| scheme);
        return format!("{scheme}://***");
    };
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    }
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| match k.as_ref() {
            "password" => (k.into_owned(), "***".to_owned()),
            _ => (k.into_owned(), v.into_owned()),
        })
        .collect();
    if !pairs.is_empty() {
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

impl fmt::Debug for CatalogDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CatalogDb({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_uris_name_a_sqlite_file_or_a_postgresql_database() {
        assert_eq!(
            CatalogDb::parse_uri("sqlite:/var/w2i/catalog.db"),
            Ok(CatalogDb::File("/var/w2i/catalog.db".into()))
        );
        assert_eq!(
            CatalogDb::parse_uri("sqlite:///var/w2i/catalog.db?mode=rwc"),
            Ok(CatalogDb::File("/var/w2i/catalog.db".into()))
        );
        let pg = "postgresql://w2i@db.internal:5432/lake";
        assert_eq!(CatalogDb::parse_uri(pg), Ok(CatalogDb::Postgres(pg.into())));
        for bad in ["sqlite:", "postgresql://host", "mysql://h/db", "catalog.db"] {
            assert!(CatalogDb::parse_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_password_is_never_shown() {
        let db =
            CatalogDb::parse_uri("postgresql://w2i:s3cret@db/lake?sslmode=require&password=other")
                .unwrap();
        let shown = format!("{db} {db:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("other"),
            "{shown}"
        );
        assert!(shown.contains("w2i:***@db/lake") && shown.contains("sslmode=require"));
    }

    #[test]
    fn postgresql_numbers_its_parameters() {
        let sql = "UPDATE t SET a = ? WHERE b = ? AND c = ?";
        let pg = CatalogDb::Postgres("postgresql://h/db".into());
        assert_eq!(
            pg.placeholders(sql),
            "UPDATE t SET a = $1 WHERE b = $2 AND c = $3"
        );
        assert_eq!(CatalogDb::File("f".into()).placeholders(sql), sql);
    }
}
