//! Log sequence numbers: a byte position in the write-ahead log.
//!
//! PostgreSQL prints an LSN as two hexadecimal halves, `16/B374D848`
//! (see the `pg_lsn` type). The wire carries it as a big-endian `Int64`,
//! and the lake's `_cdc_commit_lsn` holds that integer, so an LSN given to
//! wal2iceberg may be written either way.

use std::fmt;
use std::str::FromStr;

/// A position in the write-ahead log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid position `0/0`, which the server uses for "none".
    pub const ZERO: Lsn = Lsn(0);
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// The text was neither of the form `XXXXXXXX/XXXXXXXX` nor an integer.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid LSN {0:?}: expected two hexadecimal halves such as 16/B374D848, or the integer the \
     lake's _cdc_commit_lsn holds"
)]
pub struct ParseLsnError(String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || ParseLsnError(s.to_owned());
        let s = s.trim();
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return s.parse().map(Lsn).map_err(|_| invalid());
        }
        let (high, low) = s.split_once('/').ok_or_else(invalid)?;
        let half = |h: &str| {
            if h.is_empty() || h.len() > 8 {
                return Err(invalid());
            }
            u32::from_str_radix(h, 16).map_err(|_| invalid())
        };
        Ok(Lsn((u64::from(half(high)?) << 32) | u64::from(half(low)?)))
    }
}

impl From<Lsn> for u64 {
    fn from(lsn: Lsn) -> u64 {
        lsn.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        let lsn = Lsn(0x16_B374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!("16/B374D848".parse::<Lsn>().unwrap(), lsn);
        assert_eq!("0/0".parse::<Lsn>().unwrap(), Lsn::ZERO);
    }

    #[test]
    fn the_lakes_integer_form_parses_too() {
        assert_eq!("29497752".parse::<Lsn>().unwrap().to_string(), "0/1C21998");
        let lsn = Lsn(0x16_B374_D848);
        assert_eq!(format!(" {} ", lsn.0).parse::<Lsn>().unwrap(), lsn);
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "/1",
            "1/",
            "G/1",
            "123456789/0",
            "1/2/3",
            "-1",
            "18446744073709551616",
            "1e5",
        ] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parsed");
        }
    }
}
