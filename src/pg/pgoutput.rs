//! Messages of the `pgoutput` logical decoding plugin, decoded over [`Bytes`].
//!
//! Formats: PostgreSQL docs, "Logical Replication Message Formats"
//! (<https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html>).
//! We request protocol version 1 or 2 and never `two_phase`, so the
//! prepared-transaction messages (protocol 3) and the parallel Stream Abort
//! fields (protocol 4) are not sent to us and are reported as unsupported.
//!
//! Inside a streamed transaction (between Stream Start and Stream Stop,
//! protocol 2 with `streaming on`), Insert, Update, Delete, Truncate,
//! Relation, Type and Message carry an extra `Int32` xid right after the tag.
//! [`Decoder`] tracks the stream brackets so that callers cannot get this
//! wrong.

use bytes::Bytes;

use super::wire::{DecodeError, Reader};
use crate::model::Lsn;

/// Microseconds since 2000-01-01 00:00:00 UTC, as the server sends timestamps.
pub(crate) type PgTimestamp = i64;

/// `Begin`: a transaction whose changes follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    /// The LSN of the commit record (called "final LSN" in the docs).
    pub(crate) final_lsn: Lsn,
    pub(crate) commit_ts: PgTimestamp,
    pub(crate) xid: u32,
}

/// `Commit` (and the commit part of `Stream Commit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub(crate) flags: u8,
    pub(crate) commit_lsn: Lsn,
    /// The end of the commit record: the position to confirm once durable.
    pub(crate) end_lsn: Lsn,
    pub(crate) commit_ts: PgTimestamp,
}

/// One column of a `Relation` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelationColumn {
    /// True when the column is part of the replica identity key.
    pub(crate) is_key: bool,
    pub(crate) name: String,
    pub(crate) type_oid: u32,
    pub(crate) type_modifier: i32,
}

/// `Relation`: the shape of a table, sent before its first change in a
/// session and again whenever its definition changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub(crate) oid: u32,
    /// Empty for `pg_catalog`.
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// `relreplident`: `d` default, `n` nothing, `f` full, `i` index.
    pub(crate) replica_identity: u8,
    pub(crate) columns: Vec<RelationColumn>,
}

/// `Type`: the name of a non-built-in type used by a following Relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Type {
    pub(crate) oid: u32,
    pub(crate) namespace: String,
    pub(crate) name: String,
}

/// One column value of a TupleData.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TupleValue {
    /// `n`: SQL NULL (or, in a key-only old tuple, a column not sent).
    Null,
    /// `u`: an unchanged TOASTed value whose content was not sent.
    UnchangedToast,
    /// `t`: the value in text format.
    Text(Bytes),
    /// `b`: the value in binary format.
    Binary(Bytes),
}

/// Which old tuple an Update or Delete carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OldTupleKind {
    /// `K`: the replica identity key columns only.
    Key,
    /// `O`: the complete old row (REPLICA IDENTITY FULL).
    Full,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    pub(crate) relation_oid: u32,
    pub(crate) new: Vec<TupleValue>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub(crate) relation_oid: u32,
    pub(crate) old: Option<(OldTupleKind, Vec<TupleValue>)>,
    pub(crate) new: Vec<TupleValue>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    pub(crate) relation_oid: u32,
    pub(crate) old_kind: OldTupleKind,
    pub(crate) old: Vec<TupleValue>,
}

/// Truncate option bit: `CASCADE`.
pub const TRUNCATE_CASCADE: u8 = 1;
/// Truncate option bit: `RESTART IDENTITY`.
pub const TRUNCATE_RESTART_IDENTITY: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    pub(crate) options: u8,
    pub(crate) relation_oids: Vec<u32>,
}

/// A logical decoding message written by `pg_logical_emit_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalMessage {
    pub(crate) transactional: bool,
    pub(crate) lsn: Lsn,
    pub(crate) prefix: String,
    pub(crate) content: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStart {
    pub(crate) xid: u32,
    pub(crate) first_segment: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAbort {
    pub(crate) xid: u32,
    /// Equal to `xid` when the whole transaction aborted.
    pub(crate) subxid: u32,
}

/// A decoded pgoutput message. Change-carrying variants hold the xid that
/// a streamed transaction sends with them (`None` outside streams).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin(Begin),
    Commit(Commit),
    Origin { commit_lsn: Lsn, name: String },
    Relation(Option<u32>, Relation),
    Type(Option<u32>, Type),
    Insert(Option<u32>, Insert),
    Update(Option<u32>, Update),
    Delete(Option<u32>, Delete),
    Truncate(Option<u32>, Truncate),
    Message(Option<u32>, LogicalMessage),
    StreamStart(StreamStart),
    StreamStop,
    StreamCommit { xid: u32, commit: Commit },
    StreamAbort(StreamAbort),
}

/// Decodes a sequence of pgoutput messages from one replication session,
/// tracking whether a Stream Start/Stop block is open.
#[derive(Debug, Default)]
pub struct Decoder {
    in_stream: bool,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// A decoder inside a Stream Start/Stop block, for messages that were
    /// set aside while a transaction streamed and are read back later.
    pub fn streamed() -> Decoder {
        Decoder { in_stream: true }
    }

    /// Decodes one message: the payload of one XLogData.
    pub fn decode(&mut self, payload: Bytes) -> Result<Message, DecodeError> {
        let mut r = Reader::new(payload, "pgoutput message");
        let tag = r.u8("tag")?;
        let message = match tag {
            b'B' => {
                r.set_message("pgoutput Begin");
                Message::Begin(Begin {
                    final_lsn: Lsn(r.u64("final_lsn")?),
                    commit_ts: r.i64("commit_ts")?,
                    xid: r.u32("xid")?,
                })
            }
            b'C' => {
                r.set_message("pgoutput Commit");
                Message::Commit(read_commit(&mut r)?)
            }
            b'O' => {
                r.set_message("pgoutput Origin");
                Message::Origin {
                    commit_lsn: Lsn(r.u64("commit_lsn")?),
                    name: r.string("name")?,
                }
            }
            b'R' => {
                r.set_message("pgoutput Relation");
                let xid = self.stream_xid(&mut r)?;
                Message::Relation(xid, read_relation(&mut r)?)
            }
            b'Y' => {
                r.set_message("pgoutput Type");
                let xid = self.stream_xid(&mut r)?;
                Message::Type(
                    xid,
                    Type {
                        oid: r.u32("type oid")?,
                        namespace: r.string("namespace")?,
                        name: r.string("name")?,
                    },
                )
            }
            b'I' => {
                r.set_message("pgoutput Insert");
                let xid = self.stream_xid(&mut r)?;
                let relation_oid = r.u32("relation oid")?;
                expect_tag(&mut r, "new tuple marker", b"N")?;
                let new = read_tuple(&mut r)?;
                Message::Insert(xid, Insert { relation_oid, new })
            }
            b'U' => {
                r.set_message("pgoutput Update");
                let xid = self.stream_xid(&mut r)?;
                let relation_oid = r.u32("relation oid")?;
                let old = match expect_tag(&mut r, "tuple marker", b"KON")? {
                    b'N' => None,
                    kind => {
                        let old = read_tuple(&mut r)?;
                        expect_tag(&mut r, "new tuple marker", b"N")?;
                        Some((old_kind(kind), old))
                    }
                };
                let new = read_tuple(&mut r)?;
                Message::Update(
                    xid,
                    Update {
                        relation_oid,
                        old,
                        new,
                    },
                )
            }
            b'D' => {
                r.set_message("pgoutput Delete");
                let xid = self.stream_xid(&mut r)?;
                let relation_oid = r.u32("relation oid")?;
                let kind = expect_tag(&mut r, "old tuple marker", b"KO")?;
                let old = read_tuple(&mut r)?;
                Message::Delete(
                    xid,
                    Delete {
                        relation_oid,
                        old_kind: old_kind(kind),
                        old,
                    },
                )
            }
            b'T' => {
                r.set_message("pgoutput Truncate");
                let xid = self.stream_xid(&mut r)?;
                let n = r.count32("relation count", 4)?;
                let options = r.u8("options")?;
                let mut relation_oids = Vec::with_capacity(n);
                for _ in 0..n {
                    relation_oids.push(r.u32("relation oid")?);
                }
                Message::Truncate(
                    xid,
                    Truncate {
                        options,
                        relation_oids,
                    },
                )
            }
            b'M' => {
                r.set_message("pgoutput Message");
                let xid = self.stream_xid(&mut r)?;
                let flags = r.u8("flags")?;
                let lsn = Lsn(r.u64("lsn")?);
                let prefix = r.string("prefix")?;
                let len = r.count32("content length", 1)?;
                let content = r.bytes("content", len)?;
                Message::Message(
                    xid,
                    LogicalMessage {
                        transactional: flags & 1 == 1,
                        lsn,
                        prefix,
                        content,
                    },
                )
            }
            b'S' => {
                r.set_message("pgoutput Stream Start");
                if self.in_stream {
                    return Err(r.error("tag", "Stream Start inside an open stream block"));
                }
                let start = StreamStart {
                    xid: r.u32("xid")?,
                    first_segment: r.u8("first segment")? == 1,
                };
                r.finish()?;
                self.in_stream = true;
                return Ok(Message::StreamStart(start));
            }
            b'E' => {
                r.set_message("pgoutput Stream Stop");
                if !self.in_stream {
                    return Err(r.error("tag", "Stream Stop without Stream Start"));
                }
                r.finish()?;
                self.in_stream = false;
                return Ok(Message::StreamStop);
            }
            b'c' => {
                r.set_message("pgoutput Stream Commit");
                let xid = r.u32("xid")?;
                Message::StreamCommit {
                    xid,
                    commit: read_commit(&mut r)?,
                }
            }
            b'A' => {
                r.set_message("pgoutput Stream Abort");
                Message::StreamAbort(StreamAbort {
                    xid: r.u32("xid")?,
                    subxid: r.u32("subxid")?,
                })
            }
            b'b' | b'P' | b'K' | b'r' | b'p' => {
                return Err(r.error(
                    "tag",
                    format!(
                        "two-phase message {:?} was not requested (two_phase is off)",
                        char::from(tag)
                    ),
                ));
            }
            other => {
                return Err(r.error("tag", format!("unknown message tag 0x{other:02x}")));
            }
        };
        r.finish()?;
        Ok(message)
    }

    fn stream_xid(&self, r: &mut Reader) -> Result<Option<u32>, DecodeError> {
        if self.in_stream {
            Ok(Some(r.u32("streamed xid")?))
        } else {
            Ok(None)
        }
    }
}

fn read_commit(r: &mut Reader) -> Result<Commit, DecodeError> {
    Ok(Commit {
        flags: r.u8("flags")?,
        commit_lsn: Lsn(r.u64("commit_lsn")?),
        end_lsn: Lsn(r.u64("end_lsn")?),
        commit_ts: r.i64("commit_ts")?,
    })
}

fn read_relation(r: &mut Reader) -> Result<Relation, DecodeError> {
    let oid = r.u32("relation oid")?;
    let namespace = r.string("namespace")?;
    let name = r.string("relation name")?;
    let replica_identity = r.u8("replica identity")?;
    if !b"dnfi".contains(&replica_identity) {
        return Err(r.error(
            "replica identity",
            format!("unknown setting 0x{replica_identity:02x}"),
        ));
    }
    // Each column needs at least flags, an empty name's NUL, type and typmod.
    let n = r.count16("column count", 10)?;
    let mut columns = Vec::with_capacity(n);
    for _ in 0..n {
        let flags = r.u8("column flags")?;
        columns.push(RelationColumn {
            is_key: flags & 1 == 1,
            name: r.string("column name")?,
            type_oid: r.u32("column type oid")?,
            type_modifier: r.i32("column type modifier")?,
        });
    }
    Ok(Relation {
        oid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn read_tuple(r: &mut Reader) -> Result<Vec<TupleValue>, DecodeError> {
    let n = r.count16("tuple column count", 1)?;
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        let value = match r.u8("tuple value kind")? {
            b'n' => TupleValue::Null,
            b'u' => TupleValue::UnchangedToast,
            kind @ (b't' | b'b') => {
                let len = r.count32("tuple value length", 1)?;
                let data = r.bytes("tuple value", len)?;
                if kind == b't' {
                    TupleValue::Text(data)
                } else {
                    TupleValue::Binary(data)
                }
            }
            other => {
                return Err(r.error(
                    "tuple value kind",
                    format!("unknown kind 0x{other:02x} (expected n, u, t or b)"),
                ));
            }
        };
        values.push(value);
    }
    Ok(values)
}

fn expect_tag(r: &mut Reader, field: &'static str, allowed: &[u8]) -> Result<u8, DecodeError> {
    let tag = r.u8(field)?;
    if !allowed.contains(&tag) {
        return Err(r.error(
            field,
            format!(
                "got 0x{tag:02x}, expected one of {:?}",
                String::from_utf8_lossy(allowed)
            ),
        ));
    }
    Ok(tag)
}

fn old_kind(tag: u8) -> OldTupleKind {
    if tag == b'K' {
        OldTupleKind::Key
    } else {
        OldTupleKind::Full
    }
}

#[cfg(any(test, feature = "fuzzing"))]
mod encode;
#[cfg(test)]
mod tests;
