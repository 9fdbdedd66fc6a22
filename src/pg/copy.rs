//! Rows of `COPY ... TO STDOUT (FORMAT binary)`, split out of the byte
//! stream into runs of whole rows.
//!
//! Format: "COPY", File Formats, Binary Format
//! (<https://www.postgresql.org/docs/current/sql-copy.html>): an 11-byte
//! signature, a 32-bit flags field (bit 16: OIDs included, which we never
//! ask for), a header extension of a given length; then per row a 16-bit
//! field count and per field a 32-bit length (-1 for NULL) and that many
//! bytes of the type's binary send format; a field count of -1 ends the
//! data. Every integer is in network byte order.
//!
//! The reader checks each row's shape as it arrives (field count, lengths
//! within the bytes given), so walking a [`CopyRows`] afterwards cannot
//! fail, and no byte sequence makes it panic.

use bytes::{Buf, Bytes, BytesMut};

use super::wire::DecodeError;

const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";
/// Signature, flags and the extension length.
const HEADER_LEN: usize = SIGNATURE.len() + 8;
const FLAG_OIDS: u32 = 1 << 16;

/// Splits a binary COPY stream of rows of `columns` fields into runs of
/// whole rows, across chunk boundaries.
pub struct BinaryCopyReader {
    columns: usize,
    pending: BytesMut,
    /// Bytes of `pending` checked to hold whole rows.
    checked: usize,
    rows: usize,
    header_done: bool,
    ended: bool,
}

/// Whole rows of a binary COPY stream, each checked to have the expected
/// field count and lengths.
pub struct CopyRows {
    data: Bytes,
    rows: usize,
    columns: usize,
}

impl BinaryCopyReader {
    pub fn new(columns: usize) -> BinaryCopyReader {
        BinaryCopyReader {
            columns,
            pending: BytesMut::new(),
            checked: 0,
            rows: 0,
            header_done: false,
            ended: false,
        }
    }

    /// Adds a chunk of COPY data and checks the rows it completes.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), DecodeError> {
        if self.ended && !chunk.is_empty() {
            return Err(error(self.checked, "data after the end-of-data marker"));
        }
        self.pending.extend_from_slice(chunk);
        if !self.header_done {
            if !self.read_header()? {
                return Ok(());
            }
            self.header_done = true;
        }
        while !self.ended {
            let rest = &self.pending[self.checked..];
            match row_len(rest, self.columns)
                .map_err(|(at, problem)| error(self.checked + at, problem))?
            {
                None => break,
                Some(RowEnd::Trailer) => {
                    self.ended = true;
                    if rest.len() > 2 {
                        return Err(error(self.checked + 2, "data after the end-of-data marker"));
                    }
                }
                Some(RowEnd::Row(len)) => {
                    self.checked += len;
                    self.rows += 1;
                }
            }
        }
        Ok(())
    }

    /// Complete rows not yet taken.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes of complete rows not yet taken.
    pub(crate) fn bytes(&self) -> usize {
        self.checked
    }

    /// Takes the complete rows.
    pub fn take(&mut self) -> CopyRows {
        let data = self.pending.split_to(self.checked).freeze();
        let rows = std::mem::take(&mut self.rows);
        self.checked = 0;
        if self.ended {
            self.pending.clear();
        }
        CopyRows {
            data,
            rows,
            columns: self.columns,
        }
    }

    /// Checks, once the stream ended, that it ended with the end-of-data
    /// marker after whole rows.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if !self.ended {
            return Err(error(
                self.checked,
                "COPY ended without its end-of-data marker (in the middle of a row?)",
            ));
        }
        Ok(())
    }

    /// Consumes the header once all of it arrived; false until then.
    fn read_header(&mut self) -> Result<bool, DecodeError> {
        let p = &self.pending[..];
        let prefix = p.len().min(SIGNATURE.len());
        if p[..prefix] != SIGNATURE[..prefix] {
            return Err(error(0, "not a binary COPY stream (bad signature)"));
        }
        if p.len() < HEADER_LEN {
            return Ok(false);
        }
        let mut fields = &p[SIGNATURE.len()..];
        let flags = fields.get_u32();
        if flags & FLAG_OIDS != 0 {
            return Err(error(
                SIGNATURE.len(),
                "rows carry OIDs, which were not asked for",
            ));
        }
        let extension = fields.get_u32() as usize;
        let Some(total) = HEADER_LEN.checked_add(extension) else {
            return Err(error(HEADER_LEN, "header extension length out of range"));
        };
        if p.len() < total {
            return Ok(false);
        }
        self.pending.advance(total);
        Ok(true)
    }
}

enum RowEnd {
    Row(usize),
    Trailer,
}

/// The length of the row at the start of `bytes`: `None` while incomplete;
/// on error, the offset and the problem.
fn row_len(bytes: &[u8], columns: usize) -> Result<Option<RowEnd>, (usize, &'static str)> {
    let Some(count) = bytes.get(..2) else {
        return Ok(None);
    };
    let count = i16::from_be_bytes([count[0], count[1]]);
    if count == -1 {
        return Ok(Some(RowEnd::Trailer));
    }
    if usize::try_from(count).ok() != Some(columns) {
        return Err((0, "a row's field count is not the table's column count"));
    }
    let mut at = 2;
    for _ in 0..columns {
        let Some(len) = bytes.get(at..at + 4) else {
            return Ok(None);
        };
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        at += 4;
        if len == -1 {
            continue;
        }
        let Ok(len) = usize::try_from(len) else {
            return Err((at - 4, "negative field length"));
        };
        at += len;
        if at > bytes.len() {
            return Ok(None);
        }
    }
    Ok(Some(RowEnd::Row(at)))
}

fn error(offset: usize, problem: &str) -> DecodeError {
    DecodeError {
        message: "binary COPY data",
        field: "row",
        offset,
        problem: problem.to_owned(),
    }
}

impl CopyRows {
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Bytes the rows take on the wire.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Calls `f` with each row's fields in column order (`None` is NULL).
    pub fn for_each<E>(
        &self,
        mut f: impl FnMut(&mut Fields<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut rest = &self.data[..];
        for _ in 0..self.rows {
            let mut fields = Fields {
                rest: rest.get(2..).unwrap_or_default(),
                left: self.columns,
            };
            f(&mut fields)?;
            for _ in &mut fields {}
            rest = fields.rest;
        }
        Ok(())
    }
}

/// The fields of one checked row, in column order; `None` is NULL.
pub struct Fields<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for Fields<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Option<&'a [u8]>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (len, body) = self
            .rest
            .split_at_checked(4)
            .unwrap_or((&[0, 0, 0, 0], &[]));
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        let Ok(len) = usize::try_from(len) else {
            self.rest = body;
            return Some(None);
        };
        let (value, after) = body.split_at_checked(len).unwrap_or((body, &[]));
        self.rest = after;
        Some(Some(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Vec<u8> {
        let mut h = SIGNATURE.to_vec();
        h.extend_from_slice(&0u32.to_be_bytes());
        h.extend_from_slice(&0u32.to_be_bytes());
        h
    }

    fn row(fields: &[Option<&[u8]>]) -> Vec<u8> {
        let mut r = (fields.len() as i16).to_be_bytes().to_vec();
        for f in fields {
            match f {
                None => r.extend_from_slice(&(-1i32).to_be_bytes()),
                Some(b) => {
                    r.extend_from_slice(&(b.len() as i32).to_be_bytes());
                    r.extend_from_slice(b);
                }
            }
        }
        r
    }

    fn collect(rows: &CopyRows) -> Vec<Vec<Option<Vec<u8>>>> {
        let mut out = Vec::new();
        rows.for_each::<()>(|fields| {
            out.push(fields.map(|f| f.map(<[u8]>::to_vec)).collect());
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn rows_split_across_any_chunk_boundary_come_out_whole() {
        let mut stream = header();
        stream.extend(row(&[Some(b"1"), None]));
        stream.extend(row(&[Some(b""), Some(b"ab")]));
        stream.extend((-1i16).to_be_bytes());
        for cut in 0..stream.len() {
            let mut r = BinaryCopyReader::new(2);
            r.push(&stream[..cut]).unwrap();
            let first = r.take();
            r.push(&stream[cut..]).unwrap();
            r.finish().unwrap();
            let mut all = collect(&first);
            all.extend(collect(&r.take()));
            assert_eq!(
                all,
                vec![
                    vec![Some(b"1".to_vec()), None],
                    vec![Some(Vec::new()), Some(b"ab".to_vec())]
                ],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_stream_cut_short_or_malformed_is_an_error() {
        let mut r = BinaryCopyReader::new(2);
        let mut stream = header();
        stream.extend(row(&[Some(b"1"), None]));
        r.push(&stream[..stream.len() - 1]).unwrap();
        assert!(r.finish().is_err(), "no end marker");

        let mut wrong_count = header();
        wrong_count.extend(row(&[Some(b"1")]));
        let err = BinaryCopyReader::new(2).push(&wrong_count).unwrap_err();
        assert!(err.to_string().contains("field count"), "{err}");

        let mut oids = SIGNATURE.to_vec();
        oids.extend_from_slice(&FLAG_OIDS.to_be_bytes());
        oids.extend_from_slice(&0u32.to_be_bytes());
        assert!(BinaryCopyReader::new(1).push(&oids).is_err());

        assert!(
            BinaryCopyReader::new(1).push(b"1\tab\n").is_err(),
            "text COPY"
        );
    }

    #[test]
    fn header_extensions_are_skipped() {
        let mut stream = SIGNATURE.to_vec();
        stream.extend_from_slice(&0u32.to_be_bytes());
        stream.extend_from_slice(&3u32.to_be_bytes());
        stream.extend_from_slice(b"xyz");
        stream.extend(row(&[Some(b"7")]));
        stream.extend((-1i16).to_be_bytes());
        let mut r = BinaryCopyReader::new(1);
        r.push(&stream).unwrap();
        r.finish().unwrap();
        assert_eq!(collect(&r.take()), vec![vec![Some(b"7".to_vec())]]);
    }
}
