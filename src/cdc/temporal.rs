//! Dates, times, timestamps and intervals in PostgreSQL's text output.
//!
//! Both of our connections set `DateStyle=ISO`, `TimeZone=UTC` and
//! `IntervalStyle=iso_8601`, so each type has one output shape:
//! `2026-11-29`, `19:51:00.5`, `19:51:00.5+02`, `2026-11-29 19:51:00.5`,
//! `2026-11-29 19:51:00.5+00`, `P1Y2M3DT4H5M6.5S`; years before 1 end in
//! ` BC` and dates or timestamps can be `infinity` or `-infinity`.
//! (<https://www.postgresql.org/docs/current/datatype-datetime.html>)

use std::fmt::Write as _;

use serde::Serialize;

pub(crate) const MICROS_PER_SECOND: i64 = 1_000_000;
pub(crate) const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;
/// Days from 1970-01-01 to 2000-01-01, the PostgreSQL epoch.
pub(crate) const PG_EPOCH_DAYS: i64 = 10_957;

/// A value that may also be one of PostgreSQL's infinities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum MaybeInfinite<T> {
    NegInfinity,
    Finite(T),
    Infinity,
}

/// An interval as PostgreSQL stores it: the three fields never mix, since a
/// month has no fixed number of days and a day no fixed number of seconds
/// (across a daylight-saving change).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Interval {
    pub(crate) months: i32,
    pub(crate) days: i32,
    pub(crate) micros: i64,
}

/// Converts microseconds since the PostgreSQL epoch (2000-01-01 UTC), the
/// unit of every timestamp in the replication protocol, to Unix microseconds.
pub(crate) fn pg_micros_to_unix(pg: i64) -> i64 {
    pg.saturating_add(PG_EPOCH_DAYS * MICROS_PER_DAY)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`). `year` is astronomical: 1 BC is 0.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Parses a `date`: days since 1970-01-01.
pub(crate) fn parse_date(s: &str) -> Option<MaybeInfinite<i32>> {
    if let Some(inf) = parse_infinity(s) {
        return Some(inf);
    }
    let (body, bc) = strip_bc(s);
    let days = parse_ymd(body, bc)?;
    Some(MaybeInfinite::Finite(i32::try_from(days).ok()?))
}

/// Parses a `timestamp` (no zone) or `timestamptz` (UTC offset applied):
/// microseconds since 1970-01-01 00:00:00 UTC.
pub(crate) fn parse_timestamp(s: &str, with_zone: bool) -> Option<MaybeInfinite<i64>> {
    if let Some(inf) = parse_infinity(s) {
        return Some(inf);
    }
    let (body, bc) = strip_bc(s);
    let (date, time) = body.split_once(' ')?;
    let days = parse_ymd(date, bc)?;
    let (time, offset) = if with_zone {
        split_offset(time)?
    } else {
        (time, 0)
    };
    let micros = parse_time_of_day(time)?;
    let local = days.checked_mul(MICROS_PER_DAY)?.checked_add(micros)?;
    Some(MaybeInfinite::Finite(
        local.checked_sub(i64::from(offset) * MICROS_PER_SECOND)?,
    ))
}

/// Whether a finite timestamp is one of the numbers the lake stores the
/// infinities as (`i64::MAX` microseconds is `294247-01-10
/// 04:00:54.775807`), so that it must be kept as its text instead.
pub(crate) fn is_sentinel(t: &MaybeInfinite<i64>) -> bool {
    matches!(t, MaybeInfinite::Finite(m) if *m == i64::MAX || *m == -i64::MAX)
}

/// Whether `s` has a timestamp's form: for text [`parse_timestamp`]
/// rejected, that it lies past what microseconds since 1970 hold
/// (PostgreSQL's go to the year 294276).
pub(crate) fn is_well_formed_timestamp(s: &str, with_zone: bool) -> bool {
    let (body, bc) = strip_bc(s);
    let Some((date, time)) = body.split_once(' ') else {
        return false;
    };
    let time = if with_zone {
        match split_offset(time) {
            Some((time, _)) => time,
            None => return false,
        }
    } else {
        time
    };
    parse_ymd(date, bc).is_some() && parse_time_of_day(time).is_some()
}

/// Parses a `time`: microseconds since midnight (24:00:00 is allowed).
pub(crate) fn parse_time(s: &str) -> Option<i64> {
    parse_time_of_day(s)
}

/// Parses a `timetz`: microseconds since midnight and the UTC offset in
/// seconds east of Greenwich.
pub(crate) fn parse_timetz(s: &str) -> Option<(i64, i32)> {
    let (time, offset) = split_offset(s)?;
    Some((parse_time_of_day(time)?, offset))
}

/// Parses an interval in `IntervalStyle=iso_8601`, e.g. `P-1Y2M3DT4H-5M6.5S`.
pub(crate) fn parse_interval(s: &str) -> Option<Interval> {
    let mut rest = s.strip_prefix('P')?;
    let (mut months, mut days, mut micros) = (0i64, 0i64, 0i64);
    let mut in_time = false;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('T') {
            in_time = true;
            rest = r;
            continue;
        }
        let end = rest.find(|c: char| c.is_ascii_alphabetic())?;
        let (number, unit) = (&rest[..end], rest.as_bytes()[end]);
        rest = &rest[end + 1..];
        match (in_time, unit) {
            (false, b'Y') => {
                months = months.checked_add(number.parse::<i64>().ok()?.checked_mul(12)?)?
            }
            (false, b'M') => months = months.checked_add(number.parse().ok()?)?,
            (false, b'W') => {
                days = days.checked_add(number.parse::<i64>().ok()?.checked_mul(7)?)?
            }
            (false, b'D') => days = days.checked_add(number.parse().ok()?)?,
            (true, b'H') => {
                micros = micros.checked_add(
                    number
                        .parse::<i64>()
                        .ok()?
                        .checked_mul(3600 * MICROS_PER_SECOND)?,
                )?
            }
            (true, b'M') => {
                micros = micros.checked_add(
                    number
                        .parse::<i64>()
                        .ok()?
                        .checked_mul(60 * MICROS_PER_SECOND)?,
                )?
            }
            (true, b'S') => micros = micros.checked_add(parse_signed_seconds(number)?)?,
            _ => return None,
        }
    }
    Some(Interval {
        months: i32::try_from(months).ok()?,
        days: i32::try_from(days).ok()?,
        micros,
    })
}

/// `2026-11-29`, with ` BC` for years before 1 and 5-digit years as needed.
pub(crate) fn format_date(days: i64) -> String {
    let (year, month, day) = civil_from_days(days);
    let mut out = String::new();
    let _ = write!(out, "{:04}-{month:02}-{day:02}", display_year(year));
    if year <= 0 {
        out.push_str(" BC");
    }
    out
}

/// `19:51:00.123456`, trailing fractional zeros dropped.
pub(crate) fn format_time(micros: i64) -> String {
    let secs = micros.div_euclid(MICROS_PER_SECOND);
    let frac = micros.rem_euclid(MICROS_PER_SECOND);
    let mut out = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    push_fraction(&mut out, frac);
    out
}

/// RFC 3339 in UTC, `2026-11-29T19:51:00.123456Z`; BC years become negative
/// astronomical years (`-0043` is 44 BC), as ISO 8601 extended years do.
pub fn format_timestamp_utc(micros: i64) -> String {
    let days = micros.div_euclid(MICROS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let mut out = if year < 0 {
        format!("-{:04}-{month:02}-{day:02}T", -year)
    } else {
        format!("{year:04}-{month:02}-{day:02}T")
    };
    out.push_str(&format_time(micros.rem_euclid(MICROS_PER_DAY)));
    out.push('Z');
    out
}

/// A timestamp as PostgreSQL prints it (`DateStyle=ISO`, `TimeZone=UTC`),
/// from microseconds since 2000-01-01: `294277-01-09 04:00:54.775807+00`.
/// For values beyond what microseconds since 1970 hold in 64 bits, which
/// the lake keeps as their text.
pub(crate) fn format_pg_timestamp(pg_micros: i64, with_zone: bool) -> String {
    let days = pg_micros.div_euclid(MICROS_PER_DAY) + PG_EPOCH_DAYS;
    let (year, _, _) = civil_from_days(days);
    let date = format_date(days);
    let mut out = date.trim_end_matches(" BC").to_owned();
    out.push(' ');
    out.push_str(&format_time(pg_micros.rem_euclid(MICROS_PER_DAY)));
    if with_zone {
        out.push_str("+00");
    }
    if year <= 0 {
        out.push_str(" BC");
    }
    out
}

/// ISO 8601 duration, as PostgreSQL prints it with `IntervalStyle=iso_8601`.
pub(crate) fn format_interval(iv: &Interval) -> String {
    let mut out = String::from("P");
    let (years, months) = (iv.months / 12, iv.months % 12);
    for (n, unit) in [(years, 'Y'), (months, 'M'), (iv.days, 'D')] {
        if n != 0 {
            let _ = write!(out, "{n}{unit}");
        }
    }
    if iv.micros != 0 {
        out.push('T');
        let sign = if iv.micros < 0 { "-" } else { "" };
        let abs = iv.micros.unsigned_abs();
        let (h, m) = (abs / 3_600_000_000, abs / 60_000_000 % 60);
        let (s, frac) = (abs / 1_000_000 % 60, (abs % 1_000_000) as i64);
        if h != 0 {
            let _ = write!(out, "{sign}{h}H");
        }
        if m != 0 {
            let _ = write!(out, "{sign}{m}M");
        }
        if s != 0 || frac != 0 {
            let _ = write!(out, "{sign}{s}");
            push_fraction(&mut out, frac);
            out.push('S');
        }
    }
    if out == "P" {
        out.push_str("T0S");
    }
    out
}

fn display_year(astronomical: i64) -> i64 {
    if astronomical <= 0 {
        1 - astronomical
    } else {
        astronomical
    }
}

fn push_fraction(out: &mut String, frac: i64) {
    if frac != 0 {
        let digits = format!("{frac:06}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

fn parse_infinity<T>(s: &str) -> Option<MaybeInfinite<T>> {
    match s {
        "infinity" => Some(MaybeInfinite::Infinity),
        "-infinity" => Some(MaybeInfinite::NegInfinity),
        _ => None,
    }
}

fn strip_bc(s: &str) -> (&str, bool) {
    match s.strip_suffix(" BC") {
        Some(body) => (body, true),
        None => (s, false),
    }
}

/// Beyond PostgreSQL's last date (5874897 AD) no year is a value the
/// server sends; refusing it also keeps the day arithmetic from overflowing.
const MAX_YEAR: i64 = 5_874_898;

fn parse_ymd(s: &str, bc: bool) -> Option<i64> {
    let mut parts = s.splitn(3, '-');
    let year: i64 = parse_digits(parts.next()?)?;
    let month: u32 = parse_digits(parts.next()?)?;
    let day: u32 = parse_digits(parts.next()?)?;
    if !(1..=MAX_YEAR).contains(&year) || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let astronomical = if bc { 1 - year } else { year };
    Some(days_from_civil(astronomical, month, day))
}

fn parse_digits<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Splits `HH:MM:SS[.f]±HH[:MM[:SS]]` into the time and the offset in
/// seconds east of UTC.
fn split_offset(s: &str) -> Option<(&str, i32)> {
    let at = s.rfind(['+', '-'])?;
    let (time, offset) = (&s[..at], &s[at + 1..]);
    let sign = if s.as_bytes()[at] == b'-' { -1 } else { 1 };
    let mut secs = 0i32;
    let mut scale = 3600;
    for part in offset.split(':') {
        if part.len() != 2 || scale == 0 {
            return None;
        }
        secs += parse_digits::<i32>(part)? * scale;
        scale /= 60;
    }
    Some((time, sign * secs))
}

fn parse_time_of_day(s: &str) -> Option<i64> {
    let mut parts = s.splitn(3, ':');
    let h: i64 = parse_digits(parts.next()?)?;
    let m: i64 = parse_digits(parts.next()?)?;
    let (sec, frac) = split_fraction(parts.next()?)?;
    let s: i64 = parse_digits(sec)?;
    if h > 24 || m > 59 || s > 60 {
        return None;
    }
    Some(((h * 60 + m) * 60 + s) * MICROS_PER_SECOND + frac)
}

/// `6`, `6.5`, `-6.000001`: seconds with up to 6 fractional digits.
fn parse_signed_seconds(s: &str) -> Option<i64> {
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (whole, frac) = split_fraction(s)?;
    let micros = parse_digits::<i64>(whole)?
        .checked_mul(MICROS_PER_SECOND)?
        .checked_add(frac)?;
    Some(if negative { -micros } else { micros })
}

fn split_fraction(s: &str) -> Option<(&str, i64)> {
    match s.split_once('.') {
        None => Some((s, 0)),
        Some((whole, frac)) => {
            if frac.is_empty() || frac.len() > 6 {
                return None;
            }
            let scaled: i64 = parse_digits(frac)?;
            Some((whole, scaled * 10i64.pow(6 - frac.len() as u32)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_print_as_postgresql_prints_them() {
        let pg_epoch = PG_EPOCH_DAYS * MICROS_PER_DAY;
        for text in [
            "2026-11-29 19:51:00.25",
            "0044-03-15 12:00:00 BC",
            "1970-01-01 00:00:00",
            "9999-12-31 23:59:59.999999",
        ] {
            let Some(MaybeInfinite::Finite(unix)) = parse_timestamp(text, false) else {
                panic!("{text}")
            };
            assert_eq!(format_pg_timestamp(unix - pg_epoch, false), text);
        }
        assert_eq!(
            format_pg_timestamp(0, true),
            "2000-01-01 00:00:00+00",
            "with a zone, UTC"
        );
        // PostgreSQL's largest timestamp, beyond microseconds since 1970.
        let largest = (days_from_civil(294_277, 1, 1) - PG_EPOCH_DAYS) * MICROS_PER_DAY - 1;
        assert_eq!(
            format_pg_timestamp(largest, true),
            "294276-12-31 23:59:59.999999+00"
        );
    }

    #[test]
    fn civil_conversion_round_trips_over_a_wide_range() {
        for days in (-1_000_000..1_000_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 1, 1), PG_EPOCH_DAYS);
    }

    #[test]
    fn years_past_the_last_postgresql_date_are_refused_not_wrapped() {
        // Found by the fuzzer: the day arithmetic overflowed.
        assert_eq!(parse_date("025555555555555551-8-5"), None);
        assert_eq!(parse_timestamp("9999999-01-01 00:00:00", false), None);
        assert!(parse_date("5874897-12-31").is_some());
    }

    #[test]
    fn parses_dates_including_bc_and_infinity() {
        assert_eq!(parse_date("1970-01-02"), Some(MaybeInfinite::Finite(1)));
        assert_eq!(parse_date("infinity"), Some(MaybeInfinite::Infinity));
        assert_eq!(parse_date("-infinity"), Some(MaybeInfinite::NegInfinity));
        let bc = parse_date("0044-03-15 BC").unwrap();
        assert_eq!(
            bc,
            MaybeInfinite::Finite(days_from_civil(-43, 3, 15) as i32)
        );
        assert_eq!(format_date(days_from_civil(-43, 3, 15)), "0044-03-15 BC");
        assert_eq!(parse_date("2026-13-01"), None);
        assert_eq!(parse_date("2026-1x-01"), None);
    }

    #[test]
    fn parses_timestamps_with_offsets_and_fractions() {
        let ts = parse_timestamp("2026-11-29 19:51:00.5+02", true).unwrap();
        let expected = days_from_civil(2026, 11, 29) * MICROS_PER_DAY
            + (17 * 3600 + 51 * 60) * MICROS_PER_SECOND
            + 500_000;
        assert_eq!(ts, MaybeInfinite::Finite(expected));
        assert_eq!(format_timestamp_utc(expected), "2026-11-29T17:51:00.5Z");
        let with_minutes = parse_timestamp("2026-11-29 19:51:00-03:30", true).unwrap();
        assert_eq!(
            with_minutes,
            MaybeInfinite::Finite(
                days_from_civil(2026, 11, 29) * MICROS_PER_DAY
                    + (23 * 3600 + 21 * 60) * MICROS_PER_SECOND
            )
        );
        assert_eq!(
            parse_timestamp("infinity", true),
            Some(MaybeInfinite::Infinity)
        );
        assert!(parse_timestamp("2026-11-29 19:51:00.1234567", false).is_none());
    }

    #[test]
    fn parses_times_and_timetz() {
        assert_eq!(parse_time("24:00:00"), Some(MICROS_PER_DAY));
        assert_eq!(parse_time("00:00:00.000001"), Some(1));
        assert_eq!(
            parse_timetz("10:00:00+05:30"),
            Some((36_000_000_000, 19_800))
        );
        assert_eq!(format_time(3_723_000_100), "01:02:03.0001");
    }

    #[test]
    fn parses_and_formats_iso_intervals() {
        let iv = parse_interval("P1Y2M3DT4H5M6.5S").unwrap();
        assert_eq!(
            iv,
            Interval {
                months: 14,
                days: 3,
                micros: (4 * 3600 + 5 * 60 + 6) * MICROS_PER_SECOND + 500_000
            }
        );
        assert_eq!(format_interval(&iv), "P1Y2M3DT4H5M6.5S");
        let neg = parse_interval("P-1Y-2M3DT-4H-5M-6.5S").unwrap();
        assert_eq!(neg.months, -14);
        assert_eq!(
            neg.micros,
            -((4 * 3600 + 5 * 60 + 6) * MICROS_PER_SECOND + 500_000)
        );
        assert_eq!(parse_interval("PT0S").unwrap().micros, 0);
        assert_eq!(format_interval(&parse_interval("PT0S").unwrap()), "PT0S");
        assert!(parse_interval("P1X").is_none());
        assert!(parse_interval("1 day").is_none());
    }
}
