//! Rows of `COPY ... TO STDOUT` in text format, split into fields.
//!
//! Format: "COPY", File Formats, Text Format
//! (<https://www.postgresql.org/docs/current/sql-copy.html>): one row per
//! line, fields separated by tabs, `\N` for NULL, and backslash escapes
//! (`\b \f \n \r \t \v \\`, octal `\NNN`, hex `\xHH`). The field text is then
//! the type's text output, the same text pgoutput sends.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

use super::wire::DecodeError;

/// Splits a COPY OUT byte stream into rows, across chunk boundaries.
#[derive(Default)]
pub struct CopyTextReader {
    pending: BytesMut,
}

impl CopyTextReader {
    pub fn new() -> CopyTextReader {
        CopyTextReader::default()
    }

    /// Adds a chunk of COPY data.
    pub fn push(&mut self, chunk: &[u8]) {
        self.pending.extend_from_slice(chunk);
    }

    /// The next complete line, without its newline.
    pub fn next_line(&mut self) -> Option<Bytes> {
        let end = self.pending.iter().position(|&b| b == b'\n')?;
        let line = self.pending.split_to(end + 1).freeze();
        Some(line.slice(..end))
    }

    /// Bytes left after the last newline: must be none once COPY ends.
    pub fn has_partial_line(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// Splits one line into `expected` fields; `None` is SQL NULL. A field
/// without escapes borrows from the line.
pub fn split_fields(
    line: &[u8],
    expected: usize,
) -> Result<Vec<Option<Cow<'_, str>>>, DecodeError> {
    let error = |offset: usize, problem: String| DecodeError {
        message: "COPY text row",
        field: "field",
        offset,
        problem,
    };
    let mut fields = Vec::with_capacity(expected);
    let mut start = 0;
    loop {
        let end = line[start..]
            .iter()
            .position(|&b| b == b'\t')
            .map_or(line.len(), |p| start + p);
        let raw = &line[start..end];
        fields.push(if raw == b"\\N" {
            None
        } else {
            let not_utf8 = || error(start, "field is not valid UTF-8".to_owned());
            Some(if raw.contains(&b'\\') {
                let bytes = unescape(raw)
                    .map_err(|at| error(start + at, "invalid backslash escape".to_owned()))?;
                Cow::Owned(String::from_utf8(bytes).map_err(|_| not_utf8())?)
            } else {
                Cow::Borrowed(std::str::from_utf8(raw).map_err(|_| not_utf8())?)
            })
        });
        if end == line.len() {
            break;
        }
        start = end + 1;
    }
    if fields.len() != expected {
        return Err(error(
            0,
            format!(
                "row has {} fields, the table has {expected} columns",
                fields.len()
            ),
        ));
    }
    Ok(fields)
}

/// Undoes COPY's backslash escapes; on error, the offset of the bad escape.
fn unescape(raw: &[u8]) -> Result<Vec<u8>, usize> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let at = i;
        let c = *raw.get(i + 1).ok_or(at)?;
        i += 2;
        match c {
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(0x0b),
            b'0'..=b'7' => {
                let mut value = u32::from(c - b'0');
                for _ in 0..2 {
                    match raw.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(value as u8);
            }
            b'x' => {
                let mut value = 0u8;
                let mut digits = 0;
                while digits < 2 {
                    match raw.get(i).and_then(|&d| (d as char).to_digit(16)) {
                        Some(d) => {
                            value = value * 16 + d as u8;
                            i += 1;
                            digits += 1;
                        }
                        None => break,
                    }
                }
                if digits == 0 {
                    return Err(at);
                }
                out.push(value);
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_rows_across_chunks() {
        let mut r = CopyTextReader::new();
        r.push(b"1\tAda\n2\tGr");
        assert_eq!(r.next_line().unwrap(), Bytes::from_static(b"1\tAda"));
        assert!(r.next_line().is_none());
        r.push(b"ace\n");
        assert_eq!(r.next_line().unwrap(), Bytes::from_static(b"2\tGrace"));
        assert!(!r.has_partial_line());
    }

    #[test]
    fn splits_fields_with_nulls_and_escapes() {
        let fields = split_fields(b"1\t\\N\ta\\tb\\nc\\\\d\t\\101\\x42\t", 5).unwrap();
        assert!(
            matches!(fields[0], Some(Cow::Borrowed(_))),
            "no escape, no copy"
        );
        assert_eq!(
            fields,
            vec![
                Some("1".into()),
                None,
                Some(Cow::Owned("a\tb\nc\\d".into())),
                Some("AB".into()),
                Some("".into())
            ]
        );
    }

    #[test]
    fn wrong_field_counts_and_bad_escapes_are_errors() {
        let err = split_fields(b"1\t2", 3).unwrap_err();
        assert!(
            err.to_string()
                .contains("row has 2 fields, the table has 3 columns")
        );
        assert!(split_fields(b"abc\\", 1).is_err());
        assert!(split_fields(b"\\xZZ", 1).is_err());
    }
}
