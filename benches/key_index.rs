//! The key index's write amplification (docs/benchmarks.md): N distinct
//! keys of 8 bytes, in random order, into silver's key index with its
//! default memory, as an initial load of N rows followed by updates of
//! every row would put them; the bytes its spills and merges write over
//! the bytes of the keys, and the bytes of an entry as written. Then the
//! memory its Bloom filters take, and what lookups cost: of keys it holds
//! (an update), of keys in its range it does not hold (an insert of a
//! random key) and of keys above its range (an insert of a sequence's
//! next value), in block reads and microseconds each.
//!
//! ```sh
//! cargo bench --bench key_index -- [--keys N]
//! ```

use std::time::Instant;

use wal2iceberg::lake::table::key::Key;
use wal2iceberg::lake::table::key_index::{KeyIndex, MEMORY_ENTRIES};

/// The target of issue 16 for the index's bytes written over the bytes of
/// its keys, at 10^8 keys.
const TARGET: f64 = 10.0;

/// A bijection on u64 (splitmix64's finalizer): distinct keys in an order
/// unrelated to their values.
fn scatter(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut keys: u64 = 100_000_000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--keys" => keys = args.next().ok_or("--keys needs a number")?.parse()?,
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let started = Instant::now();
    let mut index = KeyIndex::default();
    // Files of at most 2^20 rows, each row's key new to the index.
    let per_file = 1u64 << 20;
    for first in (0..keys).step_by(per_file as usize) {
        let file = index.new_file(format!("data-{first}.parquet").into())?;
        let rows = (first..keys.min(first + per_file)).map(|i| {
            (
                (i - first) as usize,
                Key::from_slice(&scatter(i).to_be_bytes()),
            )
        });
        index.add_new_rows(&file, rows)?;
        index.end_new_file(file);
    }
    let seconds = started.elapsed().as_secs_f64();
    let written = index.bytes_written() as f64;
    let key_bytes = (keys * 8) as f64;
    println!(
        "key index, {keys} keys of 8 bytes, {MEMORY_ENTRIES} entries in memory: {seconds:.1} s, \
         {:.1} GB written by spills and merges",
        written / 1e9
    );
    println!(
        "  each entry written {:.2} times",
        index.entries_written() as f64 / keys as f64
    );
    println!(
        "  bytes of an entry as written, its key's 8 included: {:.1}",
        written / index.entries_written() as f64
    );
    let ratio = written / key_bytes;
    let pass = ratio <= TARGET;
    println!(
        "  bytes written / bytes of keys: {ratio:.2} (target <= {TARGET} at 10^8 keys: {})",
        if pass { "pass" } else { "FAIL" }
    );
    println!(
        "  Bloom filters in memory: {:.1} MB",
        index.filter_bytes() as f64 / 1e6
    );
    let probes = 100_000.min(keys);
    let kinds: [(&str, &dyn Fn(u64) -> u64); 3] = [
        ("held (an update)", &|i| scatter(i * (keys / probes))),
        ("not held, in range (a random insert)", &|i| {
            scatter(keys + i)
        }),
        ("above every key (a sequence's insert)", &|i| u64::MAX - i),
    ];
    for (kind, of) in kinds {
        let reads = index.block_reads();
        let started = Instant::now();
        for i in 0..probes {
            index.get(&of(i).to_be_bytes())?;
        }
        let micros = started.elapsed().as_secs_f64() * 1e6 / probes as f64;
        let per = (index.block_reads() - reads) as f64 / probes as f64;
        println!("  lookup of a key {kind}: {per:.2} block reads, {micros:.2} us");
    }
    if !pass && keys >= 100_000_000 {
        std::process::exit(1);
    }
    Ok(())
}
