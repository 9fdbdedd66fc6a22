//! Crash points for the crash-safety tests (docs/testing.md).
//!
//! Compiled in only with the `failpoints` feature, which only test builds
//! turn on (the package's dev-dependency on itself): there,
//! `WAL2ICEBERG_FAILPOINT=<name>[:<n>]` aborts the process the `n`th time
//! (the first by default) it reaches the point `name`, the way a crash
//! would: no destructors, no final status update, nothing flushed. In
//! every other build [`hit`] is an empty inline function and the variable
//! is refused like any unknown setting.

/// The environment variable that arms a point.
pub const VARIABLE: &str = "WAL2ICEBERG_FAILPOINT";

/// A point reached: aborts when it is the armed one's `n`th time.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let armed = ARMED.get_or_init(|| {
        let value = std::env::var(VARIABLE).ok()?;
        Some(match value.split_once(':') {
            Some((point, n)) => (
                point.to_owned(),
                n.parse()
                    .unwrap_or_else(|_| panic!("{VARIABLE}={value}: the count must be a number")),
            ),
            None => (value, 1),
        })
    });
    if let Some((point, n)) = armed
        && point == name
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n
    {
        eprintln!("failpoint {name} reached (time {n}): aborting");
        std::process::abort();
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}
