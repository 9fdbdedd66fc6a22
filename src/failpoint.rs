//! Crash points for the crash-safety tests (docs/testing.md).
//!
//! Compiled in only with the `failpoints` feature, which only test builds
//! turn on (the package's dev-dependency on itself): there,
//! `WAL2ICEBERG_FAILPOINT=<name>[:<n>]` aborts the process the `n`th time
//! (the first by default) it reaches the point `name`, the way a crash
//! would: no destructors, no final status update, nothing flushed. In
//! every other build [`hit`] is an empty inline function and the variable
//! is refused like any unknown setting.
//!
//! `WAL2ICEBERG_STALL=<name>[,<name>...]:<ms>` makes every [`stall`] of
//! those names wait that long, the way a slow object store or catalog
//! would, without holding up the runtime; `~<ms>` waits anywhere from none
//! to twice that, each time anew.

/// The environment variable that arms a point.
pub const VARIABLE: &str = "WAL2ICEBERG_FAILPOINT";

/// The environment variable that slows points down.
pub const STALL_VARIABLE: &str = "WAL2ICEBERG_STALL";

/// A point reached: aborts when it is the armed one's `n`th time.
#[cfg(feature = "failpoints")]
pub(crate) fn hit(name: &str) {
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
pub(crate) fn hit(_name: &str) {}

/// A point that waits when [`STALL_VARIABLE`] names it.
#[cfg(feature = "failpoints")]
pub(crate) async fn stall(name: &str) {
    use std::sync::OnceLock;
    use std::time::Duration;

    static STALLED: OnceLock<Option<(Vec<String>, Duration, bool)>> = OnceLock::new();
    let stalled = STALLED.get_or_init(|| {
        let value = std::env::var(STALL_VARIABLE).ok()?;
        let (points, ms) = value
            .rsplit_once(':')
            .unwrap_or_else(|| panic!("{STALL_VARIABLE}={value}: give <points>:<ms>"));
        let (ms, jitter) = match ms.strip_prefix('~') {
            Some(ms) => (ms, true),
            None => (ms, false),
        };
        let ms = ms
            .parse()
            .unwrap_or_else(|_| panic!("{STALL_VARIABLE}={value}: the wait must be a number"));
        Some((
            points.split(',').map(str::to_owned).collect(),
            Duration::from_millis(ms),
            jitter,
        ))
    });
    if let Some((points, wait, jitter)) = stalled
        && points.iter().any(|p| p == name)
    {
        // About the wait on average, anywhere from none to twice it.
        let wait = match jitter {
            true => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .subsec_nanos();
                wait.mul_f64(f64::from(nanos % 2000) / 1000.0)
            }
            false => *wait,
        };
        tracing::debug!(point = name, ?wait, "stalled by {STALL_VARIABLE}");
        tokio::time::sleep(wait).await;
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) async fn stall(_name: &str) {}
