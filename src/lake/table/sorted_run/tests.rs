use super::*;

fn key(i: u64) -> Key {
    Key::from_slice(&i.to_be_bytes())
}

fn live(i: u64) -> Slot {
    Slot::Live(Location {
        file: (i % 7) as u32,
        pos: i as u32,
    })
}

#[test]
fn a_run_finds_every_key_it_holds_and_no_other_with_or_without_a_filter() {
    let dir = tempfile::tempdir().unwrap();
    // Even keys from 2; every fifth one gone; a long key among them.
    let mut entries: Vec<(Key, Slot)> = (1..5_000u64)
        .map(|i| (key(2 * i), if i % 5 == 0 { Slot::Gone } else { live(i) }))
        .collect();
    let long = Key::from_slice(&[0xff; 5000]);
    entries.push((long.clone(), live(1)));
    for filter in [Some(entries.len()), None] {
        let run = Run::write(
            dir.path().join("r"),
            filter,
            entries.iter().cloned().map(Ok),
        )
        .unwrap();
        assert!(run.blocks.len() > 10, "the run spans many blocks");
        assert_eq!(run.filter_bytes() > 0, filter.is_some());
        let mut buf = Vec::new();
        for (k, slot) in &entries {
            assert!(run.may_hold(k));
            assert_eq!(run.get(k, &mut buf).unwrap(), Some(*slot));
        }
        for i in 1..5_000u64 {
            assert_eq!(run.get(&key(2 * i + 1), &mut buf).unwrap(), None);
        }
        let absent = (1..5_000u64)
            .filter(|i| run.may_hold(&key(2 * i + 1)))
            .count();
        match filter {
            Some(_) => assert!(absent < 200, "{absent} false positives"),
            None => assert_eq!(absent, 4_999, "in range, no filter: read"),
        }
        let outside = [&b""[..], &key(1), &[0xff; 5001]];
        assert!(
            outside.iter().all(|k| !run.may_hold(k)),
            "a key below the first or above the last is not read"
        );
        let read: Vec<_> = run.iter().collect::<io::Result<_>>().unwrap();
        assert_eq!(read, entries);
        let path = dir.path().join("r");
        drop(run);
        assert!(!path.exists(), "a dropped run removes its file");
    }
}

#[test]
fn a_filter_of_ten_bits_a_key_lets_about_one_absent_key_in_a_hundred_through() {
    let keys = 100_000u64;
    let mut bloom = Bloom::new(keys as usize);
    for i in 0..keys {
        bloom.insert(&key(2 * i));
    }
    assert!((0..keys).all(|i| bloom.may_contain(&key(2 * i))));
    let through = (0..keys)
        .filter(|i| bloom.may_contain(&key(2 * i + 1)))
        .count();
    assert!(through < 1_500, "{through} false positives in {keys}");
}

#[test]
fn a_run_opened_again_finds_what_it_was_written_with() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries: Vec<(Key, Slot)> = (0..3_000u64)
        .map(|i| (key(3 * i), if i % 4 == 0 { Slot::Gone } else { live(i) }))
        .collect();
    entries.push((Key::from_slice(&[0xff; 6000]), live(2)));
    let path = dir.path().join("r");
    let mut written = Run::write(path.clone(), Some(1), entries.iter().cloned().map(Ok)).unwrap();
    let places = |run: &Run| -> Vec<(Key, u64, u32)> { run.blocks.clone() };
    let blocks = places(&written);
    let written_last = written.last.clone();
    written.keep();
    drop(written);
    for filter in [true, false] {
        let mut opened = Run::open(path.clone(), entries.len(), filter).unwrap();
        assert!(places(&opened) == blocks, "the blocks are cut as they were");
        assert_eq!(opened.filter_bytes() > 0, filter);
        assert_eq!(opened.last, written_last);
        let mut buf = Vec::new();
        for (k, slot) in &entries {
            assert_eq!(opened.get(k, &mut buf).unwrap(), Some(*slot));
        }
        assert_eq!(opened.get(&key(1), &mut buf).unwrap(), None);
        opened.keep();
    }
    let opened = Run::open(path.clone(), entries.len(), true).unwrap();
    drop(opened);
    assert!(!path.exists(), "opened and dropped without keep: removed");
    std::fs::write(&path, b"\x05\0\0\0ab").unwrap();
    assert!(Run::open(path, 1, true).is_err(), "a torn run is an error");
}

#[test]
fn an_empty_run_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = Run::write(dir.path().join("r"), Some(0), []).unwrap();
    assert_eq!(run.get(&key(1), &mut Vec::new()).unwrap(), None);
    assert_eq!(run.iter().count(), 0);
}

#[test]
fn truncated_blocks_are_errors_not_panics() {
    let mut whole = Vec::new();
    encode(&mut whole, b"abc", live(300));
    for cut in 0..whole.len() {
        let mut block = whole.clone();
        block.truncate(cut);
        let mut entries = Entries { rest: &block };
        let result = entries.next_entry();
        assert!(cut == 0 || result.is_err(), "cut at {cut}");
    }
    let endless = [0xffu8; 12];
    assert!(
        Entries { rest: &endless }.next_entry().is_err(),
        "a varint without end"
    );
    let mut wide = vec![3];
    wide.extend_from_slice(b"abc");
    put_varint(&mut wide, u64::from(u32::MAX) + 2);
    put_varint(&mut wide, 1);
    assert!(
        Entries { rest: &wide }.next_entry().is_err(),
        "a file number past u32"
    );
}

#[test]
fn an_eight_byte_key_takes_thirteen_bytes() {
    let mut entry = Vec::new();
    encode(&mut entry, &7u64.to_be_bytes(), live(1 << 20));
    assert_eq!(entry.len(), 1 + 8 + 1 + 3);
    let decoded = Entries { rest: &entry }.next_entry().unwrap().unwrap();
    assert_eq!(decoded, (&7u64.to_be_bytes()[..], live(1 << 20)));
}
