//! A local lake's storage whose writes are on disk when they return.
//!
//! iceberg's `LocalFsStorage` writes a whole file (a table's metadata JSON,
//! a manifest, a manifest list) without syncing it, and never syncs the
//! folders that gained a name, so a power loss after the catalog took a
//! new metadata location could leave it naming a file that is not there.
//! [`DurableFsFactory`] wraps it: every file written is synced, then each
//! folder it added a name to (its parent, and the parents of folders the
//! write created), before the write returns. Files written piecewise
//! (Parquet data and delete files) are synced by iceberg at their close;
//! their folders are synced here too. Object stores need none of this: a
//! completed PUT is durable.
//!
//! Small and isolated so that it goes when upstream's local storage syncs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

use crate::blocking::blocking;

/// Builds [`DurableFs`] storage for `file://` warehouses.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct DurableFsFactory;

#[typetag::serde]
impl StorageFactory for DurableFsFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(DurableFs::default()))
    }
}

/// `LocalFsStorage`, with every write synced with its folders.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct DurableFs {
    inner: LocalFsStorage,
}

#[async_trait]
#[typetag::serde]
impl Storage for DurableFs {
    async fn exists(&self, path: &str) -> Result<bool> {
        self.inner.exists(path).await
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        self.inner.metadata(path).await
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        self.inner.read(path).await
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        self.inner.reader(path).await
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let file = local_path(path);
        let folders = named_in(&file);
        self.inner
            .write(path, bs)
            .await
            .map_err(|e| e.with_context("path", path))?;
        blocking(|| {
            sync(&file)?;
            folders.iter().try_for_each(|f| sync(f))
        })
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let folders = named_in(&local_path(path));
        let inner = self
            .inner
            .writer(path)
            .await
            .map_err(|e| e.with_context("path", path))?;
        Ok(Box::new(DurableWrite {
            inner,
            folders,
            path: path.to_owned(),
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.inner.delete(path).await
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        self.inner.delete_prefix(path).await
    }

    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> Result<()> {
        self.inner.delete_stream(paths).await
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_owned()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_owned()))
    }
}

/// A file written piecewise; iceberg syncs it at its close, then its
/// folders are synced. Its errors name its path (a full disk, say).
struct DurableWrite {
    inner: Box<dyn FileWrite>,
    folders: Vec<PathBuf>,
    path: String,
}

#[async_trait]
impl FileWrite for DurableWrite {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        let path = &self.path;
        self.inner
            .write(bs)
            .await
            .map_err(|e| e.with_context("path", path))
    }

    async fn close(&mut self) -> Result<()> {
        let path = &self.path;
        self.inner
            .close()
            .await
            .map_err(|e| e.with_context("path", path))?;
        blocking(|| self.folders.iter().try_for_each(|f| sync(f)))
    }
}

/// The local path of a `file:` location, as `LocalFsStorage` reads it.
fn local_path(location: &str) -> PathBuf {
    let path = location
        .strip_prefix("file://")
        .or_else(|| location.strip_prefix("file:"))
        .unwrap_or(location);
    match path.starts_with('/') {
        true => PathBuf::from(path),
        false => PathBuf::from(format!("/{path}")),
    }
}

/// The folders a write to `file` adds a name to: its parent, and, for each
/// folder missing now (which the write creates), the one above it.
fn named_in(file: &Path) -> Vec<PathBuf> {
    let mut folders = Vec::new();
    let mut at = file.parent();
    while let Some(folder) = at {
        folders.push(folder.to_owned());
        if folder.exists() {
            break;
        }
        at = folder.parent();
    }
    folders
}

fn sync(path: &Path) -> Result<()> {
    #[cfg(test)]
    tests::SYNCED.lock().unwrap().push(path.to_owned());
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| {
            Error::new(ErrorKind::Unexpected, "cannot sync a file of the lake")
                .with_context("path", path.display().to_string())
                .with_source(e)
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use iceberg::io::FileIOBuilder;

    use super::*;

    /// Every path synced, by any test of this process.
    pub(crate) static SYNCED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    fn synced_under(root: &Path) -> Vec<PathBuf> {
        let synced = SYNCED.lock().unwrap();
        synced
            .iter()
            .filter(|p| p.starts_with(root))
            .cloned()
            .collect()
    }

    #[tokio::test]
    async fn a_file_and_every_folder_that_gained_its_name_are_synced() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let io = FileIOBuilder::new(Arc::new(DurableFsFactory)).build();

        // A whole write into two folders that do not exist yet.
        let meta = root.join("t/metadata/00001.metadata.json");
        let output = io.new_output(format!("file://{}", meta.display())).unwrap();
        output.write(Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(std::fs::read(&meta).unwrap(), b"{}");
        assert_eq!(
            synced_under(&root),
            [
                meta.clone(),
                root.join("t/metadata"),
                root.join("t"),
                root.clone()
            ],
        );

        // A piecewise write beside it: its folder at its close.
        let data = root.join("t/metadata/00002.avro");
        let output = io.new_output(format!("file:{}", data.display())).unwrap();
        let mut writer = output.writer().await.unwrap();
        writer.write(Bytes::from_static(b"ab")).await.unwrap();
        assert_eq!(synced_under(&root).len(), 4, "nothing until the close");
        writer.close().await.unwrap();
        assert_eq!(std::fs::read(&data).unwrap(), b"ab");
        assert_eq!(synced_under(&root)[4..], [root.join("t/metadata")]);
    }

    #[tokio::test]
    async fn a_local_lake_writes_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let lake = crate::lake::catalog::Lake::open_embedded(&root)
            .await
            .unwrap();
        let ident = iceberg::TableIdent::from_strs(["db", "t"]).unwrap();
        let schema = iceberg::spec::Schema::builder().build().unwrap();
        let table = lake.ensure_table(&ident, schema).await.unwrap();
        let meta = local_path(table.metadata_location().unwrap());
        assert!(
            synced_under(&root).contains(&meta),
            "the table's first metadata file is synced"
        );
    }
}
