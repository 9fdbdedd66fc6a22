//! A bounds-checked reader over one protocol message.
//!
//! Every read checks what remains first, so no server input can make the
//! decoders panic or allocate more than the message holds. Errors name the
//! field that was being read and its byte offset.

use bytes::{Buf, Bytes};

use crate::error::{Error, ErrorKind};

/// A message, or a field in it, did not have the shape the protocol requires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {message}: {problem} (field `{field}` at byte {offset})")]
pub struct DecodeError {
    /// The message being decoded, e.g. `pgoutput Update`.
    pub(crate) message: &'static str,
    /// The field being read when the problem showed.
    pub(crate) field: &'static str,
    /// Byte offset of that field within the message.
    pub(crate) offset: usize,
    /// What was wrong.
    pub(crate) problem: String,
}

impl From<DecodeError> for Error {
    fn from(err: DecodeError) -> Error {
        Error::new(ErrorKind::Protocol, "the server sent a malformed message").with_source(err)
    }
}

pub(crate) struct Reader {
    buf: Bytes,
    len: usize,
    message: &'static str,
}

impl Reader {
    pub(crate) fn new(buf: Bytes, message: &'static str) -> Reader {
        Reader {
            len: buf.len(),
            buf,
            message,
        }
    }

    /// Names the message being decoded once its tag is known.
    pub(crate) fn set_message(&mut self, message: &'static str) {
        self.message = message;
    }

    pub(crate) fn offset(&self) -> usize {
        self.len - self.buf.len()
    }

    pub(crate) fn error(&self, field: &'static str, problem: impl Into<String>) -> DecodeError {
        DecodeError {
            message: self.message,
            field,
            offset: self.offset(),
            problem: problem.into(),
        }
    }

    fn need(&self, field: &'static str, n: usize) -> Result<(), DecodeError> {
        if self.buf.len() < n {
            return Err(self.error(field, format!("needs {n} bytes, {} remain", self.buf.len())));
        }
        Ok(())
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        self.need(field, 1)?;
        Ok(self.buf.get_u8())
    }

    pub(crate) fn i16(&mut self, field: &'static str) -> Result<i16, DecodeError> {
        self.need(field, 2)?;
        Ok(self.buf.get_i16())
    }

    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        self.need(field, 4)?;
        Ok(self.buf.get_i32())
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.need(field, 4)?;
        Ok(self.buf.get_u32())
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.need(field, 8)?;
        Ok(self.buf.get_i64())
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        self.need(field, 8)?;
        Ok(self.buf.get_u64())
    }

    /// A count that must be non-negative; `max` bounds it by what the rest of
    /// the message could possibly hold, so no allocation trusts the wire.
    pub(crate) fn count16(
        &mut self,
        field: &'static str,
        min_each: usize,
    ) -> Result<usize, DecodeError> {
        let n = self.i16(field)?;
        self.check_count(field, i64::from(n), min_each)
    }

    pub(crate) fn count32(
        &mut self,
        field: &'static str,
        min_each: usize,
    ) -> Result<usize, DecodeError> {
        let n = self.i32(field)?;
        self.check_count(field, i64::from(n), min_each)
    }

    fn check_count(
        &self,
        field: &'static str,
        n: i64,
        min_each: usize,
    ) -> Result<usize, DecodeError> {
        let n = usize::try_from(n).map_err(|_| self.error(field, format!("negative count {n}")))?;
        if n.saturating_mul(min_each) > self.buf.len() {
            return Err(self.error(
                field,
                format!(
                    "count {n} cannot fit in the {} bytes that remain",
                    self.buf.len()
                ),
            ));
        }
        Ok(n)
    }

    /// A null-terminated string, valid UTF-8 (the connection's client encoding).
    pub(crate) fn cstr(&mut self, field: &'static str) -> Result<Bytes, DecodeError> {
        let end = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.error(field, "string has no terminating NUL"))?;
        if std::str::from_utf8(&self.buf[..end]).is_err() {
            return Err(self.error(field, "string is not valid UTF-8"));
        }
        let s = self.buf.split_to(end);
        self.buf.advance(1);
        Ok(s)
    }

    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let raw = self.cstr(field)?;
        Ok(String::from_utf8_lossy(&raw).into_owned())
    }

    pub(crate) fn bytes(&mut self, field: &'static str, n: usize) -> Result<Bytes, DecodeError> {
        self.need(field, n)?;
        Ok(self.buf.split_to(n))
    }

    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }

    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if !self.buf.is_empty() {
            return Err(self.error(
                "end of message",
                format!("{} unexpected trailing bytes", self.buf.len()),
            ));
        }
        Ok(())
    }
}
