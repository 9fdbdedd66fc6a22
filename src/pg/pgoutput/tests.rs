use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;

use super::*;

/// Builds message bytes field by field, in the order the docs list them.
#[derive(Default)]
struct Msg(BytesMut);

impl Msg {
    fn tag(t: u8) -> Msg {
        let mut m = Msg::default();
        m.0.put_u8(t);
        m
    }
    fn u8(mut self, v: u8) -> Self {
        self.0.put_u8(v);
        self
    }
    fn i16(mut self, v: i16) -> Self {
        self.0.put_i16(v);
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.put_u32(v);
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.put_i32(v);
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.put_u64(v);
        self
    }
    fn str(mut self, s: &str) -> Self {
        self.0.put_slice(s.as_bytes());
        self.0.put_u8(0);
        self
    }
    fn text(mut self, s: &str) -> Self {
        self.0.put_u8(b't');
        self.0.put_i32(s.len() as i32);
        self.0.put_slice(s.as_bytes());
        self
    }
    fn raw(mut self, b: &[u8]) -> Self {
        self.0.put_slice(b);
        self
    }
    fn bytes(self) -> Bytes {
        self.0.freeze()
    }
}

fn relation_message(xid: Option<u32>) -> Bytes {
    let mut m = Msg::tag(b'R');
    if let Some(x) = xid {
        m = m.u32(x);
    }
    m.u32(16384)
        .str("public")
        .str("customers")
        .u8(b'f')
        .i16(2)
        .u8(1)
        .str("id")
        .u32(23)
        .i32(-1)
        .u8(0)
        .str("name")
        .u32(25)
        .i32(-1)
        .bytes()
}

fn update_message() -> Bytes {
    Msg::tag(b'U')
        .u32(16384)
        .u8(b'O')
        .i16(2)
        .text("1")
        .text("Ada")
        .u8(b'N')
        .i16(2)
        .text("1")
        .u8(b'u')
        .bytes()
}

fn valid_messages() -> Vec<Bytes> {
    vec![
        Msg::tag(b'B').u64(0x100).u64(7).u32(42).bytes(),
        Msg::tag(b'C').u8(0).u64(0x100).u64(0x128).u64(7).bytes(),
        relation_message(None),
        Msg::tag(b'Y').u32(99999).str("public").str("mood").bytes(),
        Msg::tag(b'I')
            .u32(16384)
            .u8(b'N')
            .i16(2)
            .text("4")
            .u8(b'n')
            .bytes(),
        update_message(),
        Msg::tag(b'D')
            .u32(16384)
            .u8(b'K')
            .i16(2)
            .text("3")
            .u8(b'n')
            .bytes(),
        Msg::tag(b'T').i32(2).u8(3).u32(1).u32(2).bytes(),
        Msg::tag(b'M')
            .u8(1)
            .u64(5)
            .str("pfx")
            .i32(3)
            .raw(b"abc")
            .bytes(),
        Msg::tag(b'O').u64(9).str("node").bytes(),
    ]
}

#[test]
fn decodes_begin_and_commit() {
    let mut d = Decoder::new();
    let begin = d
        .decode(Msg::tag(b'B').u64(0x100).u64(7).u32(42).bytes())
        .unwrap();
    assert_eq!(
        begin,
        Message::Begin(Begin {
            final_lsn: Lsn(0x100),
            commit_ts: 7,
            xid: 42
        })
    );
    let commit = d
        .decode(Msg::tag(b'C').u8(0).u64(0x100).u64(0x128).u64(7).bytes())
        .unwrap();
    assert_eq!(
        commit,
        Message::Commit(Commit {
            flags: 0,
            commit_lsn: Lsn(0x100),
            end_lsn: Lsn(0x128),
            commit_ts: 7
        })
    );
}

#[test]
fn decodes_relation_with_key_flags_and_identity() {
    let Message::Relation(None, rel) = Decoder::new().decode(relation_message(None)).unwrap()
    else {
        panic!("not a relation");
    };
    assert_eq!(rel.oid, 16384);
    assert_eq!(rel.namespace, "public");
    assert_eq!(rel.replica_identity, b'f');
    assert!(rel.columns[0].is_key);
    assert!(!rel.columns[1].is_key);
    assert_eq!(rel.columns[1].type_oid, 25);
}

#[test]
fn decodes_update_with_full_old_tuple_and_unchanged_toast() {
    let Message::Update(None, up) = Decoder::new().decode(update_message()).unwrap() else {
        panic!("not an update");
    };
    let (kind, old) = up.old.unwrap();
    assert_eq!(kind, OldTupleKind::Full);
    assert_eq!(old[1], TupleValue::Text(Bytes::from_static(b"Ada")));
    assert_eq!(up.new[1], TupleValue::UnchangedToast);
}

#[test]
fn streamed_changes_carry_an_xid_only_inside_stream_blocks() {
    let mut d = Decoder::new();
    assert_eq!(
        d.decode(Msg::tag(b'S').u32(77).u8(1).bytes()).unwrap(),
        Message::StreamStart(StreamStart {
            xid: 77,
            first_segment: true
        })
    );
    let Message::Relation(Some(78), rel) = d.decode(relation_message(Some(78))).unwrap() else {
        panic!("streamed relation lost its xid");
    };
    assert_eq!(rel.name, "customers");
    // Without the xid, every field after the tag is misread inside a stream.
    assert!(!matches!(
        d.decode(relation_message(None)),
        Ok(Message::Relation(_, r)) if r.oid == 16384 && r.name == "customers"
    ));
    assert_eq!(
        d.decode(Msg::tag(b'E').bytes()).unwrap(),
        Message::StreamStop
    );
    // And after Stop, the streamed form is misread the other way.
    assert!(!matches!(
        d.decode(relation_message(Some(78))),
        Ok(Message::Relation(_, r)) if r.oid == 16384 && r.name == "customers"
    ));
    assert_eq!(
        d.decode(Msg::tag(b'A').u32(77).u32(79).bytes()).unwrap(),
        Message::StreamAbort(StreamAbort {
            xid: 77,
            subxid: 79
        })
    );
    let Message::StreamCommit { xid: 77, commit } = d
        .decode(Msg::tag(b'c').u32(77).u8(0).u64(10).u64(20).u64(30).bytes())
        .unwrap()
    else {
        panic!("not a stream commit");
    };
    assert_eq!(commit.end_lsn, Lsn(20));
}

#[test]
fn decodes_truncate_of_several_relations() {
    let m = Decoder::new()
        .decode(Msg::tag(b'T').i32(2).u8(3).u32(1).u32(2).bytes())
        .unwrap();
    assert_eq!(
        m,
        Message::Truncate(
            None,
            Truncate {
                options: TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY,
                relation_oids: vec![1, 2]
            }
        )
    );
}

#[test]
fn errors_name_the_malformed_field() {
    let err = Decoder::new()
        .decode(
            Msg::tag(b'I')
                .u32(1)
                .u8(b'N')
                .i16(1)
                .u8(b't')
                .i32(-5)
                .bytes(),
        )
        .unwrap_err();
    assert_eq!(err.message, "pgoutput Insert");
    assert_eq!(err.field, "tuple value length");
    assert!(err.to_string().contains("negative count -5"), "{err}");

    let err = Decoder::new()
        .decode(Msg::tag(b'I').u32(1).u8(b'N').i16(1).u8(b'x').bytes())
        .unwrap_err();
    assert!(err.to_string().contains("unknown kind 0x78"), "{err}");

    let err = Decoder::new().decode(Msg::tag(b'Z').bytes()).unwrap_err();
    assert!(
        err.to_string().contains("unknown message tag 0x5a"),
        "{err}"
    );

    let err = Decoder::new()
        .decode(Msg::tag(b'I').u32(1).u8(b'N').i16(30000).bytes())
        .unwrap_err();
    assert!(err.to_string().contains("cannot fit"), "{err}");
}

#[test]
fn every_truncation_of_a_valid_message_is_an_error() {
    for msg in valid_messages() {
        Decoder::new().decode(msg.clone()).expect("fixture decodes");
        for cut in 0..msg.len() {
            let err = Decoder::new()
                .decode(msg.slice(..cut))
                .expect_err("a truncated message must not decode");
            assert!(err.message.starts_with("pgoutput"), "{err}");
            assert!(!err.field.is_empty() && err.offset <= cut, "{err}");
            let says_why = ["remain", "no terminating NUL", "cannot fit"];
            assert!(
                cut == 0 || says_why.iter().any(|w| err.problem.contains(w)),
                "{err}"
            );
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    for msg in valid_messages() {
        let mut long = BytesMut::from(&msg[..]);
        long.put_u8(0);
        assert!(Decoder::new().decode(long.freeze()).is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256), in_stream: bool) {
        let mut d = Decoder { in_stream };
        let _ = d.decode(Bytes::from(data));
    }

    #[test]
    fn mutated_valid_messages_never_panic(
        which in 0usize..10,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let mut msg = BytesMut::from(&valid_messages()[which][..]);
        for (at, byte) in flips {
            let i = at % msg.len();
            msg[i] = byte;
        }
        let _ = Decoder::new().decode(msg.freeze());
    }
}
