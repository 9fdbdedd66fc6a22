use proptest::prelude::*;

use super::persist::MANIFEST;
use super::*;

fn key(i: i64) -> Key {
    Key::from_slice(&i.to_le_bytes())
}

#[test]
fn the_index_reuses_the_number_of_a_file_without_live_rows() {
    let mut index = KeyIndex::default();
    index
        .add_file("a".into(), [(0, key(1)), (1, key(2))])
        .unwrap();
    index.add_file("b".into(), [(0, key(3))]).unwrap();
    assert_eq!(index.remove(&key(1)).unwrap(), Some(("a".into(), 0)));
    assert_eq!(index.remove(&key(1)).unwrap(), None);
    assert_eq!(index.remove(&key(2)).unwrap(), Some(("a".into(), 1)));
    // A rewritten key moves; its old file keeps its other rows.
    index
        .add_file("c".into(), [(5, key(4)), (6, key(3))])
        .unwrap();
    assert_eq!(index.files.len(), 2, "c took a's number");
    assert_eq!(index.get(&key(3)).unwrap(), Some(("c".into(), 6)));
    assert_eq!(index.get(&key(4)).unwrap(), Some(("c".into(), 5)));
    assert_eq!(index.files[1].live, 0, "b lost its only row to c");
    index.add_file("empty".into(), []).unwrap();
    assert_eq!(index.files.len(), 2, "a file without rows keeps no number");
    let mut all = index.clear().unwrap();
    all.sort();
    assert_eq!(all, [("c".into(), 5), ("c".into(), 6)]);
    assert_eq!(index.live_rows(), 0);
}

#[test]
fn a_file_being_written_takes_its_rows_run_by_run_across_spills() {
    let mut index = KeyIndex::with_memory_limit(3);
    let file = index.new_file("load".into()).unwrap();
    index
        .add_new_rows(&file, (0..).zip([key(7), key(8)]))
        .unwrap();
    index
        .add_new_rows(&file, (2..).zip([key(9), key(10), key(11)]))
        .unwrap();
    index.end_new_file(file);
    assert_eq!(index.live_rows(), 5);
    assert_eq!(index.get(&key(7)).unwrap(), Some(("load".into(), 0)));
    assert_eq!(index.get(&key(11)).unwrap(), Some(("load".into(), 4)));
    assert_eq!(index.live_per_file().get("load"), Some(&5));
    let empty = index.new_file("empty".into()).unwrap();
    index.end_new_file(empty);
    let next = index.new_file("next".into()).unwrap();
    assert_eq!(index.files.len(), 2, "next took the number empty gave back");
    index.end_new_file(next);
}

#[test]
fn fresh_rows_of_a_load_go_to_runs_in_bulk_and_read_back_as_any_other() {
    let mut index = KeyIndex::with_memory_limit(2);
    assert!(index.is_empty());
    let file = index.new_file("load".into()).unwrap();
    index
        .add_fresh_rows(&file, (0..).zip([key(5), key(1), key(4)]))
        .unwrap();
    index
        .add_fresh_rows(&file, (3..).zip([key(3), key(2)]))
        .unwrap();
    index.end_new_file(file);
    assert_eq!(index.runs.len(), 2, "two full runs, one entry left over");
    assert_eq!(index.live_rows(), 5);
    for (pos, k) in [5, 1, 4, 3, 2].into_iter().enumerate() {
        assert_eq!(
            index.get(&key(k)).unwrap(),
            Some(("load".into(), pos as i64))
        );
    }
    assert_eq!(index.runs.len(), 3, "the entry left over: a run of its own");
    assert!(index.memory.is_empty() && index.fresh.capacity() == 0);
    assert_eq!(index.remove(&key(4)).unwrap(), Some(("load".into(), 2)));
    assert_eq!(index.get(&key(4)).unwrap(), None);
    index.add_file("next".into(), [(0, key(5))]).unwrap();
    assert_eq!(index.get(&key(5)).unwrap(), Some(("next".into(), 0)));
    assert_eq!(index.live_rows(), 4);
    let mut all = index.clear().unwrap();
    all.sort();
    assert_eq!(
        all,
        [
            ("load".into(), 1),
            ("load".into(), 3),
            ("load".into(), 4),
            ("next".into(), 0)
        ]
    );
}

#[test]
fn moved_files_take_their_live_rows_and_only_those() {
    // a holds 1 (2 was removed), b holds 3; most of it in runs.
    let two_files = || {
        let mut index = KeyIndex::with_memory_limit(2);
        index
            .add_file("a".into(), [(0, key(1)), (1, key(2))])
            .unwrap();
        index.add_file("b".into(), [(0, key(3))]).unwrap();
        index.remove(&key(2)).unwrap();
        assert!(!index.runs.is_empty(), "the rows went to runs");
        index
    };
    let wrong = two_files().move_files(&["a", "b"], vec![("c".into(), vec![(0, key(1))])]);
    assert!(wrong.is_err(), "b's row is missing from the move");
    let mut index = two_files();
    index
        .move_files(
            &["a", "b"],
            vec![("c".into(), vec![(0, key(1)), (1, key(3))])],
        )
        .unwrap();
    assert_eq!(index.get(&key(1)).unwrap(), Some(("c".into(), 0)));
    assert_eq!(index.get(&key(3)).unwrap(), Some(("c".into(), 1)));
    assert_eq!(index.get(&key(2)).unwrap(), None);
    assert_eq!(index.live_rows(), 2);
    assert_eq!(index.live_per_file(), HashMap::from([("c", 2)]));
}

#[test]
fn each_entry_is_written_a_logarithmic_number_of_times() {
    // 4^5 spills of 4 new keys each: five tiers of merges above the
    // spills. Merging every run at each fifth spill, as the index once
    // did, writes each entry about 4^5 / 10 times.
    let (limit, spills) = (4, 4usize.pow(5));
    let mut index = KeyIndex::with_memory_limit(limit);
    let keys = (limit * spills) as i64;
    for k in 0..keys {
        index
            .add_file(format!("f{k}").into(), [(0, key(k))])
            .unwrap();
    }
    let per_entry = index.entries_written() as f64 / keys as f64;
    assert!(
        per_entry <= 6.0,
        "each entry written {per_entry} times: once by its spill, once per tier"
    );
    assert_eq!(index.runs.len(), 1, "{} runs", index.runs.len());
    assert_eq!(index.get(&key(17)).unwrap(), Some(("f17".into(), 0)));
}

#[test]
fn filters_stay_within_their_budget_and_a_key_above_every_run_reads_nothing() {
    // 4^3 spills of 4 even keys each merge into one run of 256 entries,
    // too many for the filters of 16 spills' worth.
    let big_endian = |i: u64| Key::from_slice(&i.to_be_bytes());
    let mut index = KeyIndex::with_memory_limit(4);
    for k in 0..256 {
        index
            .add_file(format!("f{k}").into(), [(0, big_endian(2 * k))])
            .unwrap();
    }
    assert_eq!(index.runs.len(), 1);
    assert_eq!(index.filter_bytes(), 0, "the large run has no filter");
    for k in 0..256 {
        let found = index.get(&big_endian(2 * k)).unwrap();
        assert_eq!(found, Some((format!("f{k}").into(), 0)));
    }
    let reads = index.block_reads();
    assert_eq!(index.get(&big_endian(513)).unwrap(), None);
    assert_eq!(index.block_reads(), reads, "above the range: no read");
    assert_eq!(index.get(&big_endian(3)).unwrap(), None);
    assert_eq!(index.block_reads(), reads + 1, "in the range: one read");

    // Newer, smaller runs keep theirs, within the budget.
    for k in 0..60 {
        index
            .add_file(format!("g{k}").into(), [(0, big_endian(2 * k + 1))])
            .unwrap();
    }
    assert!(index.runs.len() > 2, "{} runs", index.runs.len());
    assert!(index.filter_bytes() > 0);
    assert!(index.filter_bytes() <= index.filter_budget);
    let reads = index.block_reads();
    assert_eq!(
        index.get(&big_endian(2 * 100)).unwrap(),
        Some(("f100".into(), 0))
    );
    assert_eq!(
        index.block_reads() - reads,
        1,
        "newer runs end below the key: only the oldest read"
    );
}

#[test]
fn a_persisted_index_is_restored_once_and_only_as_what_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("keys");
    let mut index = KeyIndex::in_folder(folder.clone(), 4);
    for k in 0..50 {
        index
            .add_file(format!("f{k}").into(), [(0, key(k))])
            .unwrap();
    }
    index.remove(&key(7)).unwrap();
    index.persist("t/1").unwrap();
    assert!(folder.join(MANIFEST).exists());

    assert!(
        KeyIndex::restore(&folder, "t/2", 4).is_none(),
        "another snapshot"
    );
    let mut restored = KeyIndex::restore(&folder, "t/1", 4).expect("restored");
    assert!(!folder.join(MANIFEST).exists(), "taken once");
    assert_eq!(restored.live_rows(), 49);
    assert_eq!(restored.get(&key(7)).unwrap(), None);
    assert_eq!(restored.get(&key(8)).unwrap(), Some(("f8".into(), 0)));
    restored
        .add_file("g".into(), [(1, key(8)), (2, key(99))])
        .unwrap();
    assert_eq!(restored.get(&key(8)).unwrap(), Some(("g".into(), 1)));
    assert_eq!(restored.live_rows(), 50);
    drop(restored);
    assert!(
        KeyIndex::restore(&folder, "t/1", 4).is_none(),
        "the manifest is gone"
    );

    // A torn run: not restored, and the folder is emptied.
    let mut index = KeyIndex::in_folder(folder.clone(), 2);
    for k in 0..9 {
        index
            .add_file(format!("f{k}").into(), [(0, key(k))])
            .unwrap();
    }
    index.persist("t/3").unwrap();
    let run = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "run"))
        .unwrap();
    let bytes = std::fs::read(&run).unwrap();
    std::fs::write(&run, &bytes[..bytes.len() - 3]).unwrap();
    assert!(KeyIndex::restore(&folder, "t/3", 2).is_none());
    KeyIndex::clean(&folder).unwrap();
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0);
}

#[derive(Debug, Clone)]
enum Step {
    AddFile(Vec<u8>),
    Remove(u8),
    Get(u8),
    Clear,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => proptest::collection::vec(0u8..40, 0..12).prop_map(Step::AddFile),
        6 => (0u8..40).prop_map(Step::Remove),
        3 => (0u8..40).prop_map(Step::Get),
        1 => Just(Step::Clear),
    ]
}

proptest! {
    /// With a memory of a few entries, so runs are written and merged
    /// all the time, the index answers as a plain map does.
    #[test]
    fn the_index_answers_as_a_map_however_it_spills(
        limit in 1usize..6,
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        let mut index = KeyIndex::with_memory_limit(limit);
        let mut model: HashMap<u8, (Arc<str>, i64)> = HashMap::new();
        for (n, step) in steps.into_iter().enumerate() {
            match step {
                Step::AddFile(keys) => {
                    let path: Arc<str> = format!("f{n}").into();
                    index.add_file(path.clone(), keys.iter().map(|&k| {
                        (usize::from(k) + 100, Key::from_slice(&[k]))
                    })).unwrap();
                    for k in keys {
                        model.insert(k, (path.clone(), i64::from(k) + 100));
                    }
                }
                Step::Remove(k) => {
                    prop_assert_eq!(index.remove(&[k]).unwrap(), model.remove(&k));
                }
                Step::Get(k) => {
                    prop_assert_eq!(index.get(&[k]).unwrap(), model.get(&k).cloned());
                }
                Step::Clear => {
                    let mut all = index.clear().unwrap();
                    all.sort();
                    let mut expected: Vec<_> = model.drain().map(|(_, v)| v).collect();
                    expected.sort();
                    prop_assert_eq!(all, expected);
                }
            }
            prop_assert_eq!(index.live_rows(), model.len());
            for tier in index.runs.iter().map(|(_, t)| *t) {
                let of_tier = index.runs.iter().filter(|(_, t)| *t == tier).count();
                prop_assert!(of_tier < FANOUT, "tier {} has {} runs", tier, of_tier);
            }
            prop_assert!(index.runs.is_sorted_by(|a, b| a.1 >= b.1));
            prop_assert!(index.filter_bytes() <= index.filter_budget);
            let live_in_files: u32 = index.files.iter().map(|f| f.live).sum();
            prop_assert_eq!(live_in_files as usize, model.len());
        }
    }
}
