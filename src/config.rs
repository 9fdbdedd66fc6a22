//! Option values shared by the command line and (later) the config file.

use std::time::Duration;

/// A duration: a number with an optional unit, `ms`, `s` (the default),
/// `m` or `h`: `6`, `6s`, `500ms`, `1.5m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
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
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use ms, s, m or h (6s, 500ms, 2m)"
            ));
        }
    };
    let value: f64 = number.parse().map_err(|_| {
        format!("{text:?} is not a duration: use a number and a unit (6s, 500ms, 2m)")
    })?;
    Duration::try_from_secs_f64(value * scale).map_err(|_| format!("{text:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit_or_mean_seconds() {
        assert_eq!(parse_duration("6"), Ok(Duration::from_secs(6)));
        assert_eq!(parse_duration("6s"), Ok(Duration::from_secs(6)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        for bad in ["", "s", "6 days", "-1s", "1e999", "6x"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
