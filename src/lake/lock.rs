//! One writer per namespace of a lake. `run`, `compact` and `expire-snapshots` hold an
//! exclusive lock while they write: a compaction must never move rows
//! under a running pipeline's key index, and two runs (on two slots) must
//! never write the same tables. Beside a SQLite catalog it is a lock on a
//! file (`<catalog>.<namespace>.lock`), which the operating system
//! releases when the process ends; in a PostgreSQL catalog, which
//! processes on other machines share, it is a session advisory lock on
//! the catalog's database, held by a connection of its own and released
//! by the server when that connection ends. So a crash never leaves it
//! behind. Beside a REST or Glue catalog, which has no lock to offer, it is a
//! lock on a file in the lake's folder, which keeps out processes of this
//! machine only: there the commits themselves keep a table whole (each
//! names the snapshot it builds on, and a run refuses a base another
//! writer rewrote), and docs/configuration.md gives the rule for two
//! pipelines on one namespace.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;

use iceberg::{NamespaceIdent, TableIdent};

use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::LakeLocation;
use crate::lake::catalog::db::CatalogDb;
use crate::lake::catalog::uri::CatalogUri;

/// Held while it lives.
#[derive(Debug)]
pub enum WriterLock {
    File(File),
    Session(sqlx::PgConnection),
}

/// What the lock's refusal says, beside what holds it.
const HELD: &str = "another wal2iceberg process (a run, compact or expire-snapshots) writes this \
                    namespace of the lake: a run compacts its tables and expires their snapshots \
                    itself; stop the other process first";

impl WriterLock {
    /// The locks of every namespace of `tables`, for maintenance that
    /// writes them.
    pub async fn acquire_all(
        lake: &LakeLocation,
        tables: &[TableIdent],
    ) -> Result<Vec<WriterLock>> {
        let mut namespaces: Vec<&NamespaceIdent> =
            tables.iter().map(TableIdent::namespace).collect();
        namespaces.sort_by_key(|n| n.join("."));
        namespaces.dedup();
        let mut locks = Vec::new();
        for namespace in namespaces {
            locks.push(WriterLock::acquire(lake, namespace).await?);
        }
        Ok(locks)
    }

    /// Takes the lock of `namespace`, or fails at once naming what holds it.
    /// The catalog's folder is created when missing (a new lake), so the
    /// lock can be taken before the lake is opened.
    pub async fn acquire(lake: &LakeLocation, namespace: &NamespaceIdent) -> Result<WriterLock> {
        match &lake.catalog {
            CatalogUri::Sql(CatalogDb::File(file)) => WriterLock::beside(file, namespace),
            CatalogUri::Sql(db @ CatalogDb::Postgres(url)) => {
                WriterLock::in_database((db, &lake.name), url, namespace).await
            }
            CatalogUri::Rest { .. } => {
                WriterLock::beside(&lake.folder.join("rest-catalog"), namespace)
            }
            CatalogUri::Glue { .. } => {
                WriterLock::beside(&lake.folder.join("glue-catalog"), namespace)
            }
        }
    }

    /// The lock of `namespace` in the catalog `name`'s PostgreSQL
    /// database: an advisory lock on the hashes of the catalog's name and
    /// the namespace.
    async fn in_database(
        (db, name): (&CatalogDb, &str),
        url: &str,
        namespace: &NamespaceIdent,
    ) -> Result<WriterLock> {
        let refused = |e: sqlx::Error| {
            Error::new(
                ErrorKind::Lake,
                "cannot take the lake's writer lock in the catalog",
            )
            .with_context("namespace", namespace.join("."))
            .with_context("catalog", db)
            .with_source(e)
        };
        let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(url)
            .await
            .map_err(refused)?;
        let taken: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1), hashtext($2))")
                .bind(format!("wal2iceberg {name}"))
                .bind(namespace.join("."))
                .fetch_one(&mut connection)
                .await
                .map_err(refused)?;
        match taken {
            true => Ok(WriterLock::Session(connection)),
            false => Err(Error::new(ErrorKind::Lake, HELD)
                .with_context("namespace", namespace.join("."))
                .with_context("lock", format!("an advisory lock in {db}"))),
        }
    }

    /// Whether the lock is still held: a database session's lock goes
    /// with its connection (a restart of the catalog's server, a cut
    /// connection), a file's with the process.
    pub async fn holds(&mut self) -> bool {
        match self {
            WriterLock::File(_) => true,
            WriterLock::Session(connection) => sqlx::Connection::ping(connection).await.is_ok(),
        }
    }

    /// The lock of `namespace` on a file beside the catalog's file.
    fn beside(catalog: &std::path::Path, namespace: &NamespaceIdent) -> Result<WriterLock> {
        let path = lock_path(catalog, namespace);
        let io = |e: std::io::Error| {
            Error::new(ErrorKind::Io, "cannot open the lake's writer lock")
                .with_context("file", path.display())
                .with_source(e)
        };
        if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(folder).map_err(io)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(WriterLock::File(file)),
            Err(TryLockError::WouldBlock) => Err(Error::new(ErrorKind::Lake, HELD)
                .with_context("namespace", namespace.join("."))
                .with_context("lock", path.display())),
            Err(TryLockError::Error(e)) => Err(io(e)),
        }
    }
}

fn lock_path(catalog: &std::path::Path, namespace: &NamespaceIdent) -> PathBuf {
    let mut name = catalog.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{}.lock", namespace.join(".")));
    catalog.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_namespace_has_one_writer_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let lake = LakeLocation::in_folder(dir.path());
        let shop = NamespaceIdent::new("shop".into());
        let first = WriterLock::acquire(&lake, &shop).await.unwrap();
        let err = WriterLock::acquire(&lake, &shop).await.unwrap_err();
        assert!(
            err.to_string().contains("another wal2iceberg process")
                && err.to_string().contains("namespace=shop"),
            "{err}"
        );
        let other = NamespaceIdent::new("other".into());
        WriterLock::acquire(&lake, &other).await.unwrap();
        drop(first);
        WriterLock::acquire(&lake, &shop).await.unwrap();
    }
}
