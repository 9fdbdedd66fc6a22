//! What undoes the open batch in the key index: a stream that fails
//! mid-batch leaves the index as of the last commit again, exact, so the
//! next connection takes it over instead of reading every key
//! ([`SilverTable::abandon`]).

use std::collections::HashSet;
use std::sync::Arc;

use super::SilverTable;
use crate::error::Result;
use crate::lake::files::writer::STAGE_ROWS;
use crate::lake::table::key::Key;
use crate::lake::table::key_index::KeyIndex;

/// Entries an undo log holds before the batch counts as not undoable: a
/// few times a staged batch's rows, a few megabytes.
const UNDO_HELD: usize = 8 * STAGE_ROWS;

/// The open batch's changes to the index.
#[derive(Default)]
pub(super) struct Undo {
    /// Keys the batch's data files hold.
    added: Vec<Key>,
    /// Rows the batch removed, where they were.
    removed: Vec<(Key, Arc<str>, i64)>,
    /// The batch's data files.
    files: Vec<Arc<str>>,
}

impl Undo {
    /// The log with `entries` more, or `None` past [`UNDO_HELD`].
    fn room(log: &mut Option<Undo>, entries: usize) -> Option<&mut Undo> {
        if log
            .as_ref()
            .is_some_and(|u| u.added.len() + u.removed.len() + entries > UNDO_HELD)
        {
            *log = None;
        }
        log.as_mut()
    }

    pub(super) fn removed(log: &mut Option<Undo>, key: &Key, at: &(Arc<str>, i64)) {
        if let Some(undo) = Undo::room(log, 1) {
            undo.removed.push((key.clone(), at.0.clone(), at.1));
        }
    }

    pub(super) fn added<'k>(
        log: &mut Option<Undo>,
        file: &Arc<str>,
        keys: impl ExactSizeIterator<Item = &'k Key>,
    ) {
        if let Some(undo) = Undo::room(log, keys.len()) {
            undo.files.push(file.clone());
            undo.added.extend(keys.cloned());
        }
    }

    /// Takes the batch out of `index`: its files' keys removed, and each
    /// row it removed from a file committed before put back.
    fn undo(self, index: &mut KeyIndex) -> Result<()> {
        for key in &self.added {
            index.remove(key)?;
        }
        let batch: HashSet<&str> = self.files.iter().map(|f| &**f).collect();
        index.put_back(
            self.removed
                .into_iter()
                .filter(|(_, file, _)| !batch.contains(&**file))
                .collect(),
        )
    }
}

impl SilverTable {
    /// Whether the open batch staged anything since the last commit.
    pub(crate) fn is_staged(&self) -> bool {
        self.staged
    }

    /// Drops the open batch, uncommitted: its rows, data and delete files
    /// (left to the orphan sweep) and schema changes, and its changes to
    /// the key index, which then holds the last commit exactly again.
    /// False when the batch did what its log does not undo (a load, a
    /// truncate, more than [`UNDO_HELD`] entries): the index is then of no
    /// use, and the next start rebuilds it.
    pub(crate) fn abandon(&mut self) -> Result<bool> {
        if !self.staged {
            return Ok(true);
        }
        let undone = match self.undo.take() {
            Some(undo) => undo.undo(&mut self.index).map(|()| true),
            None => Ok(false),
        };
        self.pending.clear();
        self.order.clear();
        self.pending_bytes = 0;
        self.written.clear();
        self.deletes.clear();
        self.delete_files.clear();
        self.load = None;
        self.cached_group = None;
        self.schema_changes = Default::default();
        self.replace_all = false;
        self.staged = false;
        self.undo = Some(Undo::default());
        if !matches!(undone, Ok(true)) {
            self.exact_at = None;
        }
        undone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> Key {
        Key::from_slice(&n.to_be_bytes())
    }

    /// Where each of the keys the test uses lives.
    fn view(index: &mut KeyIndex) -> Vec<Option<(Arc<str>, i64)>> {
        (0..64).map(|n| index.get(&key(n)).unwrap()).collect()
    }

    #[test]
    fn a_batch_undone_leaves_the_index_as_it_was_across_spills() {
        // Four entries in memory: the batch's changes spill to runs.
        let mut index = KeyIndex::with_memory_limit(4);
        index
            .add_file("a".into(), (0..20).map(|n| (n as usize, key(n))))
            .unwrap();
        index
            .add_file("b".into(), (20..24).map(|n| (n as usize - 20, key(n))))
            .unwrap();
        let before = view(&mut index);
        let live = index.live_rows();

        let mut log = Some(Undo::default());
        // Updates of keys 0..6 and all of file b (b loses every row),
        // deletes of 6..8, then keys 2 and 21 changed again in a later
        // file of the batch.
        let remove = |index: &mut KeyIndex, log: &mut Option<Undo>, n: u32| {
            if let Some(at) = index.remove(&key(n)).unwrap() {
                Undo::removed(log, &key(n), &at);
            }
        };
        let first: Vec<u32> = (0..6).chain(20..24).collect();
        for &n in &first {
            remove(&mut index, &mut log, n);
        }
        for n in 6..8 {
            remove(&mut index, &mut log, n);
        }
        let keys: Vec<Key> = first.iter().map(|&n| key(n)).collect();
        let path: Arc<str> = "c".into();
        Undo::added(&mut log, &path, keys.iter());
        index.add_file(path, keys.into_iter().enumerate()).unwrap();
        for n in [2, 21] {
            remove(&mut index, &mut log, n);
        }
        let again = vec![key(2), key(21)];
        let path: Arc<str> = "d".into();
        Undo::added(&mut log, &path, again.iter());
        index.add_file(path, again.into_iter().enumerate()).unwrap();
        assert_ne!(view(&mut index), before);

        log.take().unwrap().undo(&mut index).unwrap();
        assert_eq!(index.live_rows(), live);
        assert_eq!(view(&mut index), before);
        let per_file = index.live_per_file();
        assert_eq!(
            (per_file.get("a"), per_file.get("b")),
            (Some(&20), Some(&4))
        );
        assert!(!per_file.contains_key("c") && !per_file.contains_key("d"));
    }

    #[test]
    fn a_log_past_its_bound_is_dropped() {
        let mut log = Some(Undo::default());
        let keys: Vec<Key> = (0..UNDO_HELD as u32 + 1).map(key).collect();
        Undo::added(&mut log, &"a".into(), keys.iter());
        assert!(log.is_none());
    }
}
