//! Silver's primary-key index: where every live row is, as (data file,
//! position), with memory that does not grow with the table.
//!
//! The newest entries are in a hash map. When it holds
//! [`MEMORY_ENTRIES`] entries it is written, in key order, to a sorted run
//! on local disk (`sorted_run`), and emptied. A lookup asks memory, then
//! the runs from newest to oldest; the first that knows the key decides. A
//! key removed while older runs may still hold it gets a `Gone` entry,
//! which hides them. Runs are merged by tiers: a spill is a run of tier
//! 0, and [`FANOUT`] runs of one tier, the newest ones, are merged into
//! one of the next tier, dropping what newer entries hide (and the `Gone`
//! markers, when the merge reaches the oldest run). So each entry is
//! rewritten once per tier, a number logarithmic in the index's size,
//! and a lookup reads at most `FANOUT - 1` runs per tier, most of them
//! skipped by their key ranges or Bloom filters.
//!
//! Bloom filters take ten bits per entry, so the index bounds them: the
//! newest runs keep theirs while they fit in [`FILTER_SPILLS`] spills'
//! worth of entries, and an older run that no longer fits loses its own.
//! That is the oldest and largest run in practice, whose filter only ever
//! spares a read for a key the index does not hold at all (newer runs
//! answer for the keys they hold first): an insert. An insert of a key
//! above every key so far (a sequence, a timestamp) is outside every
//! run's range and reads nothing; one of a key in the middle (a UUID)
//! reads one block of each run without a filter whose range holds it.
//!
//! Files are numbered; a file's number is reused once no live row is left
//! in it, so the index does not grow with the files a long run writes. A
//! run can still name a reused number, but only in entries that newer ones
//! hide: a file loses its last live row only once every key pointing at it
//! was removed or moved.
//!
//! The runs live in a folder of the state directory (or, for maintenance
//! outside a run, a temporary one under `TMPDIR`). At a clean end the
//! index is persisted there ([`KeyIndex::persist`]): memory written to a
//! run and a manifest naming the runs, the file numbers and what the
//! index is of (its owner's words: a table, its snapshot, its key). The
//! next start restores it when the owner says the same words
//! ([`KeyIndex::restore`]), removing the manifest before it changes
//! anything, so an index a crash left half-changed is never taken again;
//! otherwise the folder is emptied ([`KeyIndex::clean`]) and the owner
//! rebuilds the index from its table.

mod layers;
mod persist;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::layers::{fitting, merge};
use crate::blocking::blocking;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::table::key::Key;
use crate::lake::table::sorted_run::{Location, Run, Slot, filter_bytes};

/// Entries held in memory before they go to a run: as many as a hash table
/// of 2^19 buckets holds without growing (7/8 of them), about 21 MB.
pub const MEMORY_ENTRIES: usize = (1 << 19) / 8 * 7;
/// Runs of one tier merged into one of the next.
const FANOUT: usize = 4;
/// The Bloom filters of runs holding up to this many spills' worth of
/// entries, the newest first, stay in memory: every run of the two lowest
/// tiers (4.6 MB per million entries in memory, 9.2 MB by default).
const FILTER_SPILLS: usize = 16;

/// A data file being written, as the index numbers it.
pub struct NewFile(u32);

/// A data file's path and its rows as (position, key).
pub(crate) type FileRows = (Arc<str>, Vec<(usize, Key)>);

pub struct KeyIndex {
    memory: HashMap<Key, Slot, foldhash::fast::RandomState>,
    memory_limit: usize,
    /// Bytes of Bloom filters the runs may keep ([`FILTER_SPILLS`]).
    filter_budget: usize,
    block_reads: u64,
    /// Oldest first, each with its tier; tiers never grow toward the newest.
    runs: Vec<(Run, u32)>,
    dir: RunsDir,
    runs_written: u64,
    /// Entries written to runs, by spills and merges, and their bytes.
    entries_written: u64,
    bytes_written: u64,
    live: usize,
    files: Vec<FileSlot>,
    free: Vec<u32>,
    buf: Vec<u8>,
    /// Entries of rows new to an index that was empty (an initial load),
    /// gathered without hashing and written straight to sorted runs; the
    /// rest go to memory before anything reads or changes the index.
    fresh: Vec<(Key, Slot)>,
}

struct FileSlot {
    path: Arc<str>,
    live: u32,
}

impl Default for KeyIndex {
    fn default() -> KeyIndex {
        KeyIndex::with_memory_limit(MEMORY_ENTRIES)
    }
}

impl KeyIndex {
    /// An index that keeps up to `entries` in memory.
    pub(crate) fn with_memory_limit(entries: usize) -> KeyIndex {
        KeyIndex {
            memory: HashMap::default(),
            memory_limit: entries.max(1),
            filter_budget: filter_bytes(entries.max(1) * FILTER_SPILLS),
            block_reads: 0,
            runs: Vec::new(),
            dir: RunsDir::Temporary(None),
            runs_written: 0,
            entries_written: 0,
            bytes_written: 0,
            live: 0,
            files: Vec::new(),
            free: Vec::new(),
            buf: Vec::new(),
            fresh: Vec::new(),
        }
    }

    /// Number of live rows.
    pub(crate) fn live_rows(&self) -> usize {
        self.live
    }

    /// Adds the live rows of a data file, as (position, key).
    pub(crate) fn add_file(
        &mut self,
        path: Arc<str>,
        rows: impl IntoIterator<Item = (usize, Key)>,
    ) -> Result<()> {
        let too_large = || {
            Error::new(
                ErrorKind::Lake,
                "a data file is too large for the key index",
            )
            .with_context("file", &path)
        };
        let file = self.slot_for(path.clone())?;
        for (pos, key) in rows {
            let pos = u32::try_from(pos).map_err(|_| too_large())?;
            let old = self.lookup(&key)?;
            self.files[file as usize].live += 1;
            match old {
                Some(old) => self.release(old),
                None => self.live += 1,
            }
            self.put(key, Slot::Live(Location { file, pos }))?;
        }
        if self.files[file as usize].live == 0 {
            self.free_slot(file);
        }
        Ok(())
    }

    /// Moves every live row of the files `from` to the files `to` (path,
    /// then (position, key) of each row), as a compaction rewrote them: no
    /// lookups, since each key's old place is known to be in `from`. The
    /// rows given must be exactly the live rows of `from`.
    pub(crate) fn move_files(&mut self, from: &[&str], to: Vec<FileRows>) -> Result<()> {
        let mut leaving = 0usize;
        for (id, slot) in self.files.iter_mut().enumerate() {
            if slot.live > 0 && from.contains(&&*slot.path) {
                leaving += slot.live as usize;
                slot.live = 0;
                slot.path = Arc::from("");
                self.free.push(id as u32);
            }
        }
        let arriving: usize = to.iter().map(|(_, rows)| rows.len()).sum();
        if arriving != leaving {
            return Err(Error::new(
                ErrorKind::Lake,
                "a compaction moved another number of rows than the index holds in its files",
            )
            .with_context("moved", arriving)
            .with_context("held", leaving));
        }
        for (path, rows) in to {
            let file = self.new_file(path)?;
            self.place_rows(&file, rows)?;
            self.end_new_file(file);
        }
        Ok(())
    }

    /// Starts a data file being written, whose rows are added as they are
    /// written ([`Self::add_new_rows`]).
    pub fn new_file(&mut self, path: Arc<str>) -> Result<NewFile> {
        Ok(NewFile(self.slot_for(path)?))
    }

    /// Adds rows of a file being written, as (position, key), whose keys
    /// the index holds no live row of (an initial load: the source's
    /// primary key makes them unique, and rows the table held under them
    /// were removed first), without looking any of them up.
    pub fn add_new_rows(
        &mut self,
        file: &NewFile,
        rows: impl IntoIterator<Item = (usize, Key)>,
    ) -> Result<()> {
        self.live += self.place_rows(file, rows)?;
        Ok(())
    }

    /// Whether the index holds nothing, not even a removed key's marker.
    pub(crate) fn is_empty(&self) -> bool {
        self.memory.is_empty() && self.runs.is_empty() && self.fresh.is_empty()
    }

    /// As [`Self::add_new_rows`], for an index that was empty when the
    /// file's rows began ([`Self::is_empty`]) and gets nothing else until
    /// they end: the entries skip the hash map and go to sorted runs in
    /// bulk.
    pub(crate) fn add_fresh_rows(
        &mut self,
        file: &NewFile,
        rows: impl IntoIterator<Item = (usize, Key)>,
    ) -> Result<()> {
        let file = file.0;
        for (pos, key) in rows {
            let pos = self.position(file, pos)?;
            self.files[file as usize].live += 1;
            self.live += 1;
            self.fresh.push((key, Slot::Live(Location { file, pos })));
            if self.fresh.len() >= self.memory_limit {
                // Written and emptied, its memory kept for the next ones.
                let mut entries = std::mem::take(&mut self.fresh);
                self.write_run(&mut entries).map_err(|e| self.io_error(e))?;
                self.fresh = entries;
            }
        }
        Ok(())
    }

    /// Writes fresh entries to a run, and frees their memory: before any
    /// read or change. (Moved into memory instead, the hash map would start
    /// the stream as full as the load's row count happened to leave it.)
    fn settle(&mut self) -> Result<()> {
        if self.fresh.capacity() == 0 {
            return Ok(());
        }
        let mut entries = std::mem::take(&mut self.fresh);
        if entries.is_empty() {
            return Ok(());
        }
        self.write_run(&mut entries).map_err(|e| self.io_error(e))
    }

    fn position(&self, file: u32, pos: usize) -> Result<u32> {
        u32::try_from(pos).map_err(|_| {
            Error::new(
                ErrorKind::Lake,
                "a data file is too large for the key index",
            )
            .with_context("file", &self.files[file as usize].path)
        })
    }

    /// Ends a file started with [`Self::new_file`]; one that got no row
    /// gives its number back.
    pub fn end_new_file(&mut self, file: NewFile) {
        if self.files[file.0 as usize].live == 0 {
            self.free_slot(file.0);
        }
    }

    /// Puts each row in the index as it is, without a lookup; the number of
    /// rows.
    fn place_rows(
        &mut self,
        file: &NewFile,
        rows: impl IntoIterator<Item = (usize, Key)>,
    ) -> Result<usize> {
        let file = file.0;
        let mut placed = 0;
        for (pos, key) in rows {
            let pos = self.position(file, pos)?;
            self.files[file as usize].live += 1;
            self.put(key, Slot::Live(Location { file, pos }))?;
            placed += 1;
        }
        Ok(placed)
    }

    /// The file and position of `key`'s live row.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<(Arc<str>, i64)>> {
        Ok(self.lookup(key)?.map(|l| self.place(l)))
    }

    /// Forgets `key`'s live row; its file and position.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Result<Option<(Arc<str>, i64)>> {
        let Some(l) = self.lookup(key)? else {
            return Ok(None);
        };
        if self.runs.is_empty() {
            self.memory.remove(key);
        } else {
            self.put(Key::from_slice(key), Slot::Gone)?;
        }
        let place = self.place(l);
        self.live -= 1;
        self.release(l);
        Ok(Some(place))
    }

    /// Puts rows back where they were, as (key, file, position), each key
    /// not live now: what undoes their removal. A file that lost its last
    /// live row since gets a number again.
    pub(crate) fn put_back(&mut self, rows: Vec<(Key, Arc<str>, i64)>) -> Result<()> {
        let mut numbers: HashMap<Arc<str>, u32> = self
            .files
            .iter()
            .enumerate()
            .filter(|(_, f)| f.live > 0)
            .map(|(id, f)| (f.path.clone(), id as u32))
            .collect();
        for (key, path, pos) in rows {
            let file = match numbers.get(&path) {
                Some(&file) => file,
                None => {
                    let file = self.slot_for(path.clone())?;
                    numbers.insert(path, file);
                    file
                }
            };
            let pos = self.position(file, usize::try_from(pos).unwrap_or(usize::MAX))?;
            if self.lookup(&key)?.is_some() {
                return Err(Error::new(
                    ErrorKind::Lake,
                    "a row put back in the key index has a live row already",
                ));
            }
            self.files[file as usize].live += 1;
            self.live += 1;
            self.put(key, Slot::Live(Location { file, pos }))?;
        }
        Ok(())
    }

    /// Forgets every live row and lists them with their files and
    /// positions (the tests' view of the whole index).
    #[cfg(test)]
    pub(crate) fn clear(&mut self) -> Result<Vec<(Arc<str>, i64)>> {
        self.settle()?;
        let mut all = Vec::with_capacity(self.live);
        for entry in self.merged() {
            if let (_, Slot::Live(l)) = entry.map_err(|e| self.io_error(e))? {
                all.push(self.place(l));
            }
        }
        self.memory.clear();
        self.runs.clear();
        self.files.clear();
        self.free.clear();
        self.live = 0;
        Ok(all)
    }

    /// Live rows per data file.
    pub(crate) fn live_per_file(&self) -> HashMap<&str, u32> {
        self.files
            .iter()
            .filter(|f| f.live > 0)
            .map(|f| (&*f.path, f.live))
            .collect()
    }

    /// A file number for `path`: a free one, or a new one.
    fn slot_for(&mut self, path: Arc<str>) -> Result<u32> {
        let slot = FileSlot { path, live: 0 };
        Ok(match self.free.pop() {
            Some(id) => {
                self.files[id as usize] = slot;
                id
            }
            None => {
                let id = u32::try_from(self.files.len()).map_err(|_| {
                    Error::new(ErrorKind::Lake, "too many data files for the key index")
                })?;
                self.files.push(slot);
                id
            }
        })
    }

    fn place(&self, l: Location) -> (Arc<str>, i64) {
        (self.files[l.file as usize].path.clone(), l.pos.into())
    }

    fn lookup(&mut self, key: &[u8]) -> Result<Option<Location>> {
        self.settle()?;
        let slot = match self.memory.get(key) {
            Some(slot) => Some(*slot),
            None => self.runs_get(key)?,
        };
        Ok(match slot {
            Some(Slot::Live(l)) => Some(l),
            Some(Slot::Gone) | None => None,
        })
    }

    fn runs_get(&mut self, key: &[u8]) -> Result<Option<Slot>> {
        for (run, _) in self.runs.iter().rev() {
            if !run.may_hold(key) {
                continue;
            }
            self.block_reads += 1;
            match run.get(key, &mut self.buf) {
                Ok(Some(slot)) => return Ok(Some(slot)),
                Ok(None) => {}
                Err(e) => return Err(self.io_error(e)),
            }
        }
        Ok(None)
    }

    fn put(&mut self, key: Key, slot: Slot) -> Result<()> {
        self.settle()?;
        self.memory.insert(key, slot);
        if self.memory.len() >= self.memory_limit {
            self.spill().map_err(|e| self.io_error(e))?;
        }
        Ok(())
    }

    /// Writes memory to a new run.
    fn spill(&mut self) -> io::Result<()> {
        let mut entries: Vec<(Key, Slot)> = self.memory.drain().collect();
        self.write_run(&mut entries)
    }

    /// Writes entries newer than every run to a new run of tier 0, then
    /// merges the newest [`FANOUT`] runs while they are of one tier; off
    /// the stream task's way ([`blocking`]).
    /// `entries` is left empty, its memory kept.
    fn write_run(&mut self, entries: &mut Vec<(Key, Slot)>) -> io::Result<()> {
        blocking(|| self.write_and_merge(entries))
    }

    fn write_and_merge(&mut self, entries: &mut Vec<(Key, Slot)>) -> io::Result<()> {
        // A load in key order (a table written in key order) comes sorted.
        if !entries.is_sorted_by(|a, b| a.0 <= b.0) {
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
        let path = self.next_path()?;
        self.entries_written += entries.len() as u64;
        let filter = self.filter_for(entries.len());
        let run = Run::write(path, filter, entries.drain(..).map(Ok))?;
        self.bytes_written += run.bytes();
        self.runs.push((run, 0));
        while let Some(tier) = self.full_tier() {
            let from = self.runs.len() - FANOUT;
            let path = self.next_path()?;
            // Nothing looks keys up while they merge: their filters go
            // first, so theirs and the new one are never held together.
            for (run, _) in &mut self.runs[from..] {
                run.drop_filter();
            }
            let merging = || self.runs[from..].iter().map(|(run, _)| run);
            let expected = merging().map(Run::keys).sum();
            // A `Gone` hides older runs' entries; with none left, nothing.
            let oldest = from == 0;
            let mut written = 0u64;
            let merged = Run::write(
                path,
                self.filter_for(expected),
                merge(merging(), Vec::new())
                    .filter(|e| !(oldest && matches!(e, Ok((_, Slot::Gone)))))
                    .inspect(|_| written += 1),
            )?;
            self.entries_written += written;
            self.bytes_written += merged.bytes();
            self.runs.truncate(from);
            self.runs.push((merged, tier + 1));
        }
        self.fit_filters();
        Ok(())
    }

    /// The filter a new run of up to `entries` entries gets: one sized for
    /// them, unless they alone would not fit (the newest run comes first).
    fn filter_for(&self, entries: usize) -> Option<usize> {
        (filter_bytes(entries) <= self.filter_budget).then_some(entries)
    }

    /// Drops the filters of runs that no longer fit beside newer ones.
    fn fit_filters(&mut self) {
        let sizes = self.runs.iter().rev().map(|(run, _)| run.filter_bytes());
        let kept: Vec<bool> = fitting(self.filter_budget, sizes).collect();
        for ((run, _), kept) in self.runs.iter_mut().rev().zip(kept) {
            if !kept {
                run.drop_filter();
            }
        }
    }

    /// Bytes of Bloom filters in memory.
    pub fn filter_bytes(&self) -> usize {
        self.runs.iter().map(|(run, _)| run.filter_bytes()).sum()
    }

    /// Lookups that read a run's block.
    pub fn block_reads(&self) -> u64 {
        self.block_reads
    }

    /// The tier of the newest [`FANOUT`] runs, when they share one.
    fn full_tier(&self) -> Option<u32> {
        let from = self.runs.len().checked_sub(FANOUT)?;
        let tier = self.runs[from].1;
        self.runs[from..]
            .iter()
            .all(|(_, t)| *t == tier)
            .then_some(tier)
    }

    /// Entries written to runs so far, by spills and merges: over the
    /// entries spilled, how many times each was written.
    pub fn entries_written(&self) -> u64 {
        self.entries_written
    }

    /// Bytes written to runs so far, by spills and merges.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    fn next_path(&mut self) -> io::Result<std::path::PathBuf> {
        let dir = match &mut self.dir {
            RunsDir::Temporary(Some(dir)) => dir.path(),
            RunsDir::Temporary(dir) => dir
                .insert(
                    tempfile::Builder::new()
                        .prefix("wal2iceberg-keys-")
                        .tempdir()?,
                )
                .path(),
            RunsDir::Kept(dir) => {
                std::fs::create_dir_all(&*dir)?;
                dir
            }
        };
        self.runs_written += 1;
        Ok(dir.join(format!("{:08}.run", self.runs_written)))
    }

    /// Every entry of memory and the runs, newest winning, in key order.
    #[cfg(test)]
    fn merged(&self) -> impl Iterator<Item = io::Result<(Key, Slot)>> + '_ {
        let mut memory: Vec<(Key, Slot)> =
            self.memory.iter().map(|(k, s)| (k.clone(), *s)).collect();
        memory.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        merge(self.runs.iter().map(|(run, _)| run), memory)
    }

    fn io_error(&self, e: io::Error) -> Error {
        let dir = match &self.dir {
            RunsDir::Temporary(dir) => dir.as_ref().map(|d| d.path()),
            RunsDir::Kept(dir) => Some(dir.as_path()),
        };
        Error::new(ErrorKind::Io, "the key index cannot use its local files")
            .with_context("dir", dir.unwrap_or(Path::new("")).display())
            .with_source(e)
    }

    fn release(&mut self, l: Location) {
        let slot = &mut self.files[l.file as usize];
        slot.live -= 1;
        if slot.live == 0 {
            self.free_slot(l.file);
        }
    }

    fn free_slot(&mut self, file: u32) {
        self.files[file as usize].path = Arc::from("");
        self.free.push(file);
    }
}

/// Where an index writes its runs.
enum RunsDir {
    /// A temporary directory under `TMPDIR`, made at the first spill and
    /// removed with the index.
    Temporary(Option<tempfile::TempDir>),
    /// A folder of the state directory, where the index can be persisted.
    Kept(PathBuf),
}

#[cfg(test)]
mod tests;
