//! Durations as the settings write them (`500ms`, `2m`, `7d`, a bare
//! number of seconds), each bounded by its setting's ceiling.

use std::time::Duration;

/// The longest value each duration setting takes. Past it a value is a
/// typo, not an intent (`150000000000d` for `15d`), and would overflow a
/// clock: a cutoff in the future expires every snapshot, a deadline past
/// `Instant`'s range panics. The ceilings are generous on purpose.
pub(super) const LONGEST: &[(&str, Duration)] = &[
    ("flush_interval", Duration::from_secs(3_600)),
    ("heartbeat_interval", Duration::from_secs(86_400)),
    ("exit_when_idle", Duration::from_secs(365 * 86_400)),
    ("storage_retry_deadline", Duration::from_secs(30 * 86_400)),
    ("snapshot_retention", Duration::from_secs(3_650 * 86_400)),
    ("older_than", Duration::from_secs(3_650 * 86_400)),
    ("wait", Duration::from_secs(30 * 86_400)),
];

/// The duration setting `key`: a number with an optional unit, `ms`, `s`
/// (the default), `m`, `h` or `d` (`6`, `6s`, `500ms`, `1.5m`, `7d`), at
/// most the setting's ceiling in [`LONGEST`].
pub fn parse_duration(key: &str, text: &str) -> std::result::Result<Duration, String> {
    let longest = LONGEST
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(Duration::from_secs(3_650 * 86_400), |(_, d)| *d);
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use ms, s, m, h or d (6s, 500ms, 2m, 7d)"
            ));
        }
    };
    let value: f64 = number.parse().map_err(|_| {
        format!("{text:?} is not a duration: use a number and a unit (6s, 500ms, 2m)")
    })?;
    match Duration::try_from_secs_f64(value * scale) {
        Ok(d) if d <= longest => Ok(d),
        _ => Err(format!(
            "{text:?} is longer than the {} this setting takes at most",
            human_duration(longest)
        )),
    }
}

/// `d` in the largest whole unit that states it exactly: `30d`, `1h`, `90s`.
pub(super) fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        s if s >= 86_400 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s >= 3_600 && s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
