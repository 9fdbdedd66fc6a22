//! A key index kept between starts: its runs in a folder of the state
//! directory and a manifest naming the table snapshot they are of.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{FileSlot, KeyIndex, RunsDir, fitting};
use crate::blocking::blocking;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::table::sorted_run::{Run, filter_bytes};

impl KeyIndex {
    /// An empty index whose runs go to `dir`, where it can be persisted.
    pub(crate) fn in_folder(dir: PathBuf, entries: usize) -> KeyIndex {
        KeyIndex {
            dir: RunsDir::Kept(dir),
            ..KeyIndex::with_memory_limit(entries)
        }
    }

    /// Writes the index to its folder (memory to a run, then the manifest,
    /// each synced before the next step) as the index of `of`, and leaves
    /// its files there. An index in a temporary directory is not kept.
    pub(crate) fn persist(mut self, of: &str) -> Result<()> {
        let RunsDir::Kept(dir) = &self.dir else {
            return Ok(());
        };
        let dir = dir.clone();
        self.settle()?;
        if !self.memory.is_empty() {
            self.spill().map_err(|e| self.io_error(e))?;
        }
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            of: of.to_owned(),
            live: self.live,
            runs_written: self.runs_written,
            runs: self
                .runs
                .iter()
                .map(|(run, tier)| {
                    let name = run.file_name().unwrap_or_default().to_owned();
                    (name, *tier, run.keys())
                })
                .collect(),
            files: self
                .files
                .iter()
                .map(|f| (f.path.to_string(), f.live))
                .collect(),
            free: self.free.clone(),
        };
        let written = blocking(|| {
            std::fs::create_dir_all(&dir)?;
            for (run, _) in &self.runs {
                run.sync()?;
            }
            let text = serde_json::to_vec(&manifest).map_err(io::Error::other)?;
            let staged = dir.join(format!("{MANIFEST}.new"));
            let mut file = std::fs::File::create(&staged)?;
            file.write_all(&text)?;
            file.sync_all()?;
            std::fs::rename(&staged, dir.join(MANIFEST))?;
            std::fs::File::open(&dir)?.sync_all()
        });
        written.map_err(|e| self.io_error(e))?;
        for (run, _) in &mut self.runs {
            run.keep();
        }
        Ok(())
    }

    /// The index persisted in `dir` as the index of `of`, if one is and
    /// reads whole; its manifest is removed first, so that it is taken at
    /// most once. `None` leaves the folder for [`Self::clean`].
    pub(crate) fn restore(dir: &Path, of: &str, entries: usize) -> Option<KeyIndex> {
        let text = std::fs::read(dir.join(MANIFEST)).ok()?;
        let manifest: Manifest = serde_json::from_slice(&text).ok()?;
        if manifest.version != MANIFEST_VERSION || manifest.of != of {
            return None;
        }
        std::fs::remove_file(dir.join(MANIFEST)).ok()?;
        std::fs::File::open(dir).and_then(|d| d.sync_all()).ok()?;
        let index = KeyIndex::in_folder(dir.to_owned(), entries);
        let sizes = manifest
            .runs
            .iter()
            .rev()
            .map(|(_, _, keys)| filter_bytes(*keys));
        let mut filtered: Vec<bool> = fitting(index.filter_budget, sizes).collect();
        filtered.reverse();
        let runs = blocking(|| {
            (manifest.runs.iter().zip(filtered))
                .map(|((name, tier, keys), filter)| {
                    Ok((Run::open(dir.join(name), *keys, filter)?, *tier))
                })
                .collect::<io::Result<Vec<_>>>()
        })
        .ok()?;
        Some(KeyIndex {
            runs,
            runs_written: manifest.runs_written,
            live: manifest.live,
            files: manifest
                .files
                .into_iter()
                .map(|(path, live)| FileSlot {
                    path: path.into(),
                    live,
                })
                .collect(),
            free: manifest.free,
            ..index
        })
    }

    /// Empties `dir` of what an earlier index left: a persisted one not
    /// taken, or the runs of one that ended without persisting.
    pub(crate) fn clean(dir: &Path) -> Result<()> {
        let cleaned = blocking(|| match std::fs::read_dir(dir) {
            Ok(mut entries) => entries.try_for_each(|entry| std::fs::remove_file(entry?.path())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        });
        cleaned.map_err(|e| {
            Error::new(ErrorKind::Io, "cannot empty the key index's folder")
                .with_context("dir", dir.display())
                .with_source(e)
        })
    }
}

/// The file naming a persisted index's parts.
pub(super) const MANIFEST: &str = "index.json";

pub(super) const MANIFEST_VERSION: u32 = 3;

/// A persisted index, as [`MANIFEST`] records it.
#[derive(Serialize, Deserialize)]
pub(super) struct Manifest {
    version: u32,
    /// What the index is of, in its owner's words.
    of: String,
    live: usize,
    runs_written: u64,
    /// Run file names with their tiers and entries, oldest first.
    runs: Vec<(String, u32, usize)>,
    /// Each file number's path and live rows ("" and 0 when free).
    files: Vec<(String, u32)>,
    free: Vec<u32>,
}
