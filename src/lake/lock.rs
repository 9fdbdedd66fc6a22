//! One writer per namespace of a lake. `run`, `compact` and `expire-snapshots` hold an
//! exclusive lock on a file beside the catalog (`<catalog>.<namespace>.lock`)
//! while they write: a compaction must never move rows under a running
//! pipeline's key index, and two runs (on two slots) must never write the
//! same tables. The operating system releases the lock when the process
//! ends, however it ends, so a crash never leaves it behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;

use iceberg::{NamespaceIdent, TableIdent};

use super::catalog::LakeLocation;
use crate::error::{Error, ErrorKind, Result};

/// Held while it lives.
#[derive(Debug)]
pub struct WriterLock {
    _file: File,
}

impl WriterLock {
    /// Takes the lock of `namespace`, or fails at once naming what holds it.
    /// The catalog's folder is created when missing (a new lake), so the
    /// lock can be taken before the lake is opened.
    /// The locks of every namespace of `tables`, for maintenance that
    /// writes them.
    pub fn acquire_all(lake: &LakeLocation, tables: &[TableIdent]) -> Result<Vec<WriterLock>> {
        let mut namespaces: Vec<&NamespaceIdent> =
            tables.iter().map(TableIdent::namespace).collect();
        namespaces.sort_by_key(|n| n.join("."));
        namespaces.dedup();
        namespaces
            .into_iter()
            .map(|namespace| WriterLock::acquire(lake, namespace))
            .collect()
    }

    pub fn acquire(lake: &LakeLocation, namespace: &NamespaceIdent) -> Result<WriterLock> {
        let path = lock_path(lake, namespace);
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
            Ok(()) => Ok(WriterLock { _file: file }),
            Err(TryLockError::WouldBlock) => Err(Error::new(
                ErrorKind::Lake,
                "another wal2iceberg process (a run, compact or expire-snapshots) writes this \
                 namespace of the lake: a run compacts its tables and expires their snapshots \
                 itself; stop the other process first",
            )
            .with_context("namespace", namespace.join("."))
            .with_context("lock", path.display())),
            Err(TryLockError::Error(e)) => Err(io(e)),
        }
    }
}

fn lock_path(lake: &LakeLocation, namespace: &NamespaceIdent) -> PathBuf {
    let mut name = lake.catalog.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{}.lock", namespace.join(".")));
    lake.catalog.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_has_one_writer_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let lake = LakeLocation::in_folder(dir.path());
        let shop = NamespaceIdent::new("shop".into());
        let first = WriterLock::acquire(&lake, &shop).unwrap();
        let err = WriterLock::acquire(&lake, &shop).unwrap_err();
        assert!(
            err.to_string().contains("another wal2iceberg process")
                && err.to_string().contains("namespace=shop"),
            "{err}"
        );
        WriterLock::acquire(&lake, &NamespaceIdent::new("other".into())).unwrap();
        drop(first);
        WriterLock::acquire(&lake, &shop).unwrap();
    }
}
