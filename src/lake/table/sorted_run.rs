//! Sorted runs: the part of silver's key index that lives on local disk.
//!
//! A run is a file of (key, slot) entries in key order, written once and
//! read by `pread`, so what it holds is in the page cache, not in the
//! process's memory. It is cut into blocks of about 1 KiB; memory keeps
//! the first key and offset of every block (about half a byte per entry
//! for integer keys), the run's last key, and a Bloom filter (ten bits per
//! entry) unless its owner dropped it to bound memory. A lookup reads at
//! most one block and decodes its entries up to the key; a key outside
//! the run's range reads none, nor, with a filter, does a key that is not
//! in the run, usually. (Blocks of 4 KiB took 7.2 µs a lookup, most of it
//! decoding; 1 KiB takes 4.4 µs: docs/benchmarks.md.) Blocks are only
//! where memory's index cuts the file, so runs written with another block
//! size read the same.
//!
//! Entry layout, each number a LEB128 varint: key length, key bytes, then
//! 0 for a key gone, or the file number plus one and the position (an
//! 8-byte key in a file numbered under 127, at a position under 2^21,
//! takes 13 bytes). An entry never straddles a block; one larger than a
//! block has a block of its own.

use std::fs::File;
use std::hash::BuildHasher;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use crate::lake::table::key::Key;

const BLOCK: usize = 1024;
/// Bytes a walk through a whole run reads at once.
const ITER_CHUNK: usize = 64 << 10;
const BLOOM_BITS_PER_KEY: usize = 10;
const BLOOM_HASHES: u64 = 7;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) file: u32,
    pub(crate) pos: u32,
}

/// What a layer of the index says of a key: its live row, or that a newer
/// change removed it (which hides what older runs say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Live(Location),
    Gone,
}

pub(crate) struct Run {
    file: File,
    path: PathBuf,
    /// Kept on disk when dropped: part of a persisted index.
    kept: bool,
    /// First key and byte range of every block, in key order.
    blocks: Vec<(Key, u64, u32)>,
    /// The greatest key.
    last: Key,
    bloom: Option<Bloom>,
    /// Entries in the file.
    keys: usize,
}

impl Run {
    /// Writes `entries`, which must be in strictly increasing key order, to
    /// a new file at `path`; with a Bloom filter sized by `filter` (an upper
    /// bound on their number) when it is given.
    pub(crate) fn write(
        path: PathBuf,
        filter: Option<usize>,
        entries: impl IntoIterator<Item = io::Result<(Key, Slot)>>,
    ) -> io::Result<Run> {
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let mut out = BufWriter::with_capacity(1 << 16, &file);
        let mut bloom = filter.map(Bloom::new);
        let mut blocks = Blocks::default();
        let mut block = Vec::with_capacity(BLOCK);
        let mut entry = Vec::new();
        let mut keys = 0;
        let mut last = Key::new();
        for e in entries {
            let (key, slot) = e?;
            keys += 1;
            entry.clear();
            encode(&mut entry, &key, slot);
            if blocks.place(&key, entry.len()) {
                out.write_all(&block)?;
                block.clear();
            }
            if let Some(bloom) = &mut bloom {
                bloom.insert(&key);
            }
            block.extend_from_slice(&entry);
            last = key;
        }
        out.write_all(&block)?;
        out.flush()?;
        drop(out);
        Ok(Run {
            file,
            path,
            kept: false,
            blocks: blocks.finish(),
            last,
            bloom,
            keys,
        })
    }

    /// Opens a run of `keys` entries written before, by another process
    /// perhaps: its block index, last key and (when `filter`) Bloom filter
    /// rebuilt from one sequential read (blocks are cut as [`Self::write`]
    /// cuts them). A run opened is kept on disk only when [`Self::keep`]
    /// says so again.
    pub(crate) fn open(path: PathBuf, keys: usize, filter: bool) -> io::Result<Run> {
        let file = File::options().read(true).open(&path)?;
        let mut bloom = filter.then(|| Bloom::new(keys));
        let mut blocks = Blocks::default();
        let mut last = Key::new();
        each_key(&file, |key, size| {
            blocks.place(key, size);
            if let Some(bloom) = &mut bloom {
                bloom.insert(key);
            }
            last = Key::from_slice(key);
        })?;
        Ok(Run {
            file,
            path,
            kept: false,
            blocks: blocks.finish(),
            last,
            bloom,
            keys,
        })
    }

    /// Entries in the file.
    pub(crate) fn keys(&self) -> usize {
        self.keys
    }

    /// Leaves the file on disk when the run is dropped.
    pub(crate) fn keep(&mut self) {
        self.kept = true;
    }

    /// The file's size in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.blocks
            .last()
            .map_or(0, |(_, offset, len)| offset + u64::from(*len))
    }

    /// Syncs the file to disk.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    /// The file's name in its folder.
    pub(crate) fn file_name(&self) -> Option<&str> {
        self.path.file_name()?.to_str()
    }

    /// Whether the run may hold `key`, as its range and Bloom filter say,
    /// without reading the file: when not, [`Self::get`] finds nothing.
    pub(crate) fn may_hold(&self, key: &[u8]) -> bool {
        let in_range = self
            .blocks
            .first()
            .is_some_and(|(first, _, _)| first.as_slice() <= key && key <= self.last.as_slice());
        in_range && self.bloom.as_ref().is_none_or(|b| b.may_contain(key))
    }

    /// The bytes of the run's Bloom filter in memory.
    pub(crate) fn filter_bytes(&self) -> usize {
        self.bloom.as_ref().map_or(0, |b| b.lines.len() * 64)
    }

    /// Frees the run's Bloom filter: lookups of keys in its range read a
    /// block from then on.
    pub(crate) fn drop_filter(&mut self) {
        self.bloom = None;
    }

    /// What this run says of `key`, if anything, from one block read: the
    /// caller asks [`Self::may_hold`] first to spare it.
    pub(crate) fn get(&self, key: &[u8], buf: &mut Vec<u8>) -> io::Result<Option<Slot>> {
        let Some(i) = self
            .blocks
            .partition_point(|(first, _, _)| first.as_slice() <= key)
            .checked_sub(1)
        else {
            return Ok(None);
        };
        self.read_block(i, buf)?;
        let mut entries = Entries { rest: buf };
        while let Some((k, slot)) = entries.next_entry()? {
            match k.cmp(key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Ok(Some(slot)),
                std::cmp::Ordering::Greater => break,
            }
        }
        Ok(None)
    }

    /// Every entry, in key order.
    pub(crate) fn iter(&self) -> RunIter<'_> {
        RunIter {
            run: self,
            block: 0,
            buf: Vec::with_capacity(ITER_CHUNK),
            at: 0,
        }
    }

    fn read_block(&self, i: usize, buf: &mut Vec<u8>) -> io::Result<()> {
        self.read_blocks(i..i + 1, buf)
    }

    /// Reads consecutive blocks into `buf` at once.
    fn read_blocks(&self, blocks: std::ops::Range<usize>, buf: &mut Vec<u8>) -> io::Result<()> {
        let (_, offset, _) = &self.blocks[blocks.start];
        let (_, last, len) = &self.blocks[blocks.end - 1];
        buf.resize((last + u64::from(*len) - offset) as usize, 0);
        self.file.read_exact_at(buf, *offset)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // Unless persisted, a run is never needed again.
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

pub(crate) struct RunIter<'a> {
    run: &'a Run,
    block: usize,
    buf: Vec<u8>,
    at: usize,
}

impl Iterator for RunIter<'_> {
    type Item = io::Result<(Key, Slot)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.at < self.buf.len() {
                let mut entries = Entries {
                    rest: &self.buf[self.at..],
                };
                let before = entries.rest.len();
                let entry = entries.next_entry().transpose()?;
                self.at += before - entries.rest.len();
                return Some(entry.map(|(k, slot)| (Key::from_slice(k), slot)));
            }
            let blocks = &self.run.blocks;
            if self.block == blocks.len() {
                return None;
            }
            // Blocks follow one another in the file: read a chunk of them.
            let mut end = self.block + 1;
            let mut bytes = blocks[self.block].2 as usize;
            while end < blocks.len() && bytes + blocks[end].2 as usize <= ITER_CHUNK {
                bytes += blocks[end].2 as usize;
                end += 1;
            }
            if let Err(e) = self.run.read_blocks(self.block..end, &mut self.buf) {
                self.block = blocks.len();
                return Some(Err(e));
            }
            self.block = end;
            self.at = 0;
        }
    }
}

/// Calls `f` with each entry's key and size of a run file, in order,
/// reading it sequentially.
fn each_key(mut file: &File, mut f: impl FnMut(&[u8], usize)) -> io::Result<()> {
    io::Seek::seek(&mut file, io::SeekFrom::Start(0))?;
    let mut reader = io::BufReader::with_capacity(1 << 16, file);
    let mut key = Vec::new();
    loop {
        let mut size = 0;
        let Some(len) = read_varint(&mut reader, &mut size)? else {
            return Ok(());
        };
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= BLOCK_KEY_LIMIT)
            .ok_or_else(corrupt)?;
        key.resize(len, 0);
        io::Read::read_exact(&mut reader, &mut key)?;
        size += len;
        match read_varint(&mut reader, &mut size)?.ok_or_else(corrupt)? {
            0 => {}
            _ => {
                read_varint(&mut reader, &mut size)?.ok_or_else(corrupt)?;
            }
        }
        f(&key, size);
    }
}

/// Keys longer than this are corrupt: PostgreSQL's b-tree entries are at
/// most a third of a page, and the key's encoding is near its size.
const BLOCK_KEY_LIMIT: usize = 1 << 20;

fn corrupt() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "a corrupt key index run")
}

/// A varint from `reader`, its bytes added to `size`; `None` at the end
/// of the file before its first byte.
fn read_varint(reader: &mut impl io::Read, size: &mut usize) -> io::Result<Option<u64>> {
    let mut value = 0u64;
    for i in 0..10 {
        let mut byte = [0u8];
        match reader.read_exact(&mut byte) {
            Ok(()) => {}
            Err(e) if i == 0 && e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        *size += 1;
        value |= u64::from(byte[0] & 0x7f) << (7 * i);
        if byte[0] & 0x80 == 0 {
            return Ok(Some(value));
        }
    }
    Err(corrupt())
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A varint at the start of `bytes`, and the bytes after it.
fn take_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

/// Where a run's blocks begin and end: an entry goes to the current block
/// unless it would overflow it, and never straddles two.
#[derive(Default)]
struct Blocks {
    /// First key, offset and length of each block.
    index: Vec<(Key, u64, u32)>,
    /// The current block's length so far, and where it begins.
    len: usize,
    offset: u64,
}

impl Blocks {
    /// Places an entry of `key`, `size` bytes; true when it begins a new
    /// block, the one before being complete.
    fn place(&mut self, key: &[u8], size: usize) -> bool {
        let new = self.len > 0 && self.len + size > BLOCK;
        if new {
            self.close();
        }
        if self.len == 0 {
            self.index.push((Key::from_slice(key), self.offset, 0));
        }
        self.len += size;
        new
    }

    fn close(&mut self) {
        if let Some(last) = self.index.last_mut() {
            last.2 = self.len as u32;
        }
        self.offset += self.len as u64;
        self.len = 0;
    }

    fn finish(mut self) -> Vec<(Key, u64, u32)> {
        self.close();
        self.index
    }
}

fn encode(out: &mut Vec<u8>, key: &[u8], slot: Slot) {
    put_varint(out, key.len() as u64);
    out.extend_from_slice(key);
    match slot {
        Slot::Live(l) => {
            put_varint(out, u64::from(l.file) + 1);
            put_varint(out, l.pos.into());
        }
        Slot::Gone => put_varint(out, 0),
    }
}

/// Entries of one block, decoded in place.
struct Entries<'a> {
    rest: &'a [u8],
}

impl<'a> Entries<'a> {
    fn next_entry(&mut self) -> io::Result<Option<(&'a [u8], Slot)>> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let (len, rest) = take_varint(self.rest).ok_or_else(corrupt)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= rest.len())
            .ok_or_else(corrupt)?;
        let (key, rest) = rest.split_at(len);
        let (file, rest) = take_varint(rest).ok_or_else(corrupt)?;
        let (slot, rest) = match file {
            0 => (Slot::Gone, rest),
            file => {
                let (pos, rest) = take_varint(rest).ok_or_else(corrupt)?;
                let location = Location {
                    file: u32::try_from(file - 1).map_err(|_| corrupt())?,
                    pos: u32::try_from(pos).map_err(|_| corrupt())?,
                };
                (Slot::Live(location), rest)
            }
        };
        self.rest = rest;
        Ok(Some((key, slot)))
    }
}

/// A Bloom filter over a run's keys: no false negatives, about 1 % false
/// positives at ten bits per key. Blocked: a key's bits all fall in one
/// 64-byte line, so a lookup misses the CPU's cache once, not once a bit.
struct Bloom {
    lines: Vec<Line>,
}

#[derive(Clone, Copy, Default)]
#[repr(align(64))]
struct Line([u64; 8]);

/// The bytes of a Bloom filter for `keys` entries.
pub(crate) fn filter_bytes(keys: usize) -> usize {
    (keys.max(1) * BLOOM_BITS_PER_KEY).div_ceil(512) * 64
}

impl Bloom {
    fn new(expected: usize) -> Bloom {
        Bloom {
            lines: vec![Line::default(); filter_bytes(expected) / 64],
        }
    }

    /// The line of `key` and the bits it sets there: [`BLOOM_HASHES`]
    /// numbers of 9 bits taken from a second mix of the key's hash.
    fn probes(&self, key: &[u8]) -> (usize, impl Iterator<Item = usize> + use<>) {
        let h = foldhash::quality::FixedState::with_seed(0x5eed).hash_one(key);
        // The high half picks the line, scaled without a division.
        let line = ((h >> 32) * self.lines.len() as u64) >> 32;
        let bits = (h ^ (h >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let each = (0..BLOOM_HASHES).map(move |i| ((bits >> (9 * i)) & 511) as usize);
        (line as usize, each)
    }

    fn insert(&mut self, key: &[u8]) {
        let (line, bits) = self.probes(key);
        let line = &mut self.lines[line].0;
        for bit in bits {
            line[bit / 64] |= 1 << (bit % 64);
        }
    }

    fn may_contain(&self, key: &[u8]) -> bool {
        let (line, mut bits) = self.probes(key);
        let line = &self.lines[line].0;
        bits.all(|bit| line[bit / 64] & (1 << (bit % 64)) != 0)
    }
}

#[cfg(test)]
mod tests;
