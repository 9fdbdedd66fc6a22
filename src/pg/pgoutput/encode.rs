//! The inverse of [`Decoder::decode`](super::Decoder::decode): pgoutput messages as the server
//! sends them, for the assembler's property test and fuzz target, which
//! drive it with valid message sequences.

use bytes::{BufMut, Bytes, BytesMut};

use super::{Commit, Message, OldTupleKind, Relation, TupleValue};

impl Message {
    /// The message's bytes; a change-carrying variant with an xid is in the
    /// streamed form, which only a decoder inside a stream block reads.
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            Message::Begin(m) => {
                b.put_u8(b'B');
                b.put_u64(m.final_lsn.0);
                b.put_i64(m.commit_ts);
                b.put_u32(m.xid);
            }
            Message::Commit(c) => {
                b.put_u8(b'C');
                put_commit(&mut b, c);
            }
            Message::Origin { commit_lsn, name } => {
                b.put_u8(b'O');
                b.put_u64(commit_lsn.0);
                put_str(&mut b, name);
            }
            Message::Relation(xid, r) => {
                put_tag(&mut b, b'R', *xid);
                put_relation(&mut b, r);
            }
            Message::Type(xid, t) => {
                put_tag(&mut b, b'Y', *xid);
                b.put_u32(t.oid);
                put_str(&mut b, &t.namespace);
                put_str(&mut b, &t.name);
            }
            Message::Insert(xid, m) => {
                put_tag(&mut b, b'I', *xid);
                b.put_u32(m.relation_oid);
                b.put_u8(b'N');
                put_tuple(&mut b, &m.new);
            }
            Message::Update(xid, m) => {
                put_tag(&mut b, b'U', *xid);
                b.put_u32(m.relation_oid);
                if let Some((kind, old)) = &m.old {
                    b.put_u8(old_kind_tag(*kind));
                    put_tuple(&mut b, old);
                }
                b.put_u8(b'N');
                put_tuple(&mut b, &m.new);
            }
            Message::Delete(xid, m) => {
                put_tag(&mut b, b'D', *xid);
                b.put_u32(m.relation_oid);
                b.put_u8(old_kind_tag(m.old_kind));
                put_tuple(&mut b, &m.old);
            }
            Message::Truncate(xid, m) => {
                put_tag(&mut b, b'T', *xid);
                b.put_u32(m.relation_oids.len() as u32);
                b.put_u8(m.options);
                for oid in &m.relation_oids {
                    b.put_u32(*oid);
                }
            }
            Message::Message(xid, m) => {
                put_tag(&mut b, b'M', *xid);
                b.put_u8(u8::from(m.transactional));
                b.put_u64(m.lsn.0);
                put_str(&mut b, &m.prefix);
                b.put_u32(m.content.len() as u32);
                b.put_slice(&m.content);
            }
            Message::StreamStart(s) => {
                b.put_u8(b'S');
                b.put_u32(s.xid);
                b.put_u8(u8::from(s.first_segment));
            }
            Message::StreamStop => b.put_u8(b'E'),
            Message::StreamCommit { xid, commit } => {
                b.put_u8(b'c');
                b.put_u32(*xid);
                put_commit(&mut b, commit);
            }
            Message::StreamAbort(a) => {
                b.put_u8(b'A');
                b.put_u32(a.xid);
                b.put_u32(a.subxid);
            }
        }
        b.freeze()
    }
}

fn put_tag(b: &mut BytesMut, tag: u8, xid: Option<u32>) {
    b.put_u8(tag);
    if let Some(xid) = xid {
        b.put_u32(xid);
    }
}

fn put_str(b: &mut BytesMut, s: &str) {
    b.put_slice(s.as_bytes());
    b.put_u8(0);
}

fn put_commit(b: &mut BytesMut, c: &Commit) {
    b.put_u8(c.flags);
    b.put_u64(c.commit_lsn.0);
    b.put_u64(c.end_lsn.0);
    b.put_i64(c.commit_ts);
}

fn put_relation(b: &mut BytesMut, r: &Relation) {
    b.put_u32(r.oid);
    put_str(b, &r.namespace);
    put_str(b, &r.name);
    b.put_u8(r.replica_identity);
    b.put_u16(r.columns.len() as u16);
    for c in &r.columns {
        b.put_u8(u8::from(c.is_key));
        put_str(b, &c.name);
        b.put_u32(c.type_oid);
        b.put_i32(c.type_modifier);
    }
}

fn put_tuple(b: &mut BytesMut, values: &[TupleValue]) {
    b.put_u16(values.len() as u16);
    for value in values {
        match value {
            TupleValue::Null => b.put_u8(b'n'),
            TupleValue::UnchangedToast => b.put_u8(b'u'),
            TupleValue::Text(data) => put_value(b, b't', data),
            TupleValue::Binary(data) => put_value(b, b'b', data),
        }
    }
}

fn put_value(b: &mut BytesMut, kind: u8, data: &[u8]) {
    b.put_u8(kind);
    b.put_u32(data.len() as u32);
    b.put_slice(data);
}

fn old_kind_tag(kind: OldTupleKind) -> u8 {
    match kind {
        OldTupleKind::Key => b'K',
        OldTupleKind::Full => b'O',
    }
}
