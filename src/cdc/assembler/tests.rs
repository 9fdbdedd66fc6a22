use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::cdc::relation::MessageOnly;
use crate::pg::pgoutput::{
    Commit, Insert, Relation, RelationColumn, StreamAbort, StreamStart, TupleValue,
};

const OID: u32 = 16384;

fn assembler() -> Assembler<MessageOnly> {
    Assembler::new(MessageOnly, &[TableName::parse("public.t").unwrap()])
}

fn relation(xid: Option<u32>) -> Message {
    Message::Relation(
        xid,
        Relation {
            oid: OID,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: vec![RelationColumn {
                is_key: true,
                name: "id".into(),
                type_oid: 23,
                type_modifier: -1,
            }],
        },
    )
}

fn insert(xid: u32, id: u32) -> Message {
    Message::Insert(
        Some(xid),
        Insert {
            relation_oid: OID,
            new: vec![TupleValue::Text(Bytes::from(id.to_string()))],
        },
    )
}

fn stream_start(xid: u32) -> Message {
    Message::StreamStart(StreamStart {
        xid,
        first_segment: true,
    })
}

fn stream_commit(xid: u32) -> Message {
    Message::StreamCommit {
        xid,
        commit: Commit {
            flags: 0,
            commit_lsn: Lsn(0x900),
            end_lsn: Lsn(0x910),
            commit_ts: 0,
        },
    }
}

/// Pushes the messages at LSNs 0x100, 0x101, ... and drains every event.
async fn feed(a: &mut Assembler<MessageOnly>, messages: Vec<Message>) -> Result<Vec<Event>> {
    let mut events = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        a.push(Lsn(0x100 + i as u64), m.encode()).await?;
        while let Some(e) = a.next_event().await? {
            events.push(e);
        }
    }
    Ok(events)
}

#[tokio::test]
async fn a_stream_abort_inside_a_stream_block_is_a_protocol_error() {
    let abort = Message::StreamAbort(StreamAbort { xid: 7, subxid: 7 });
    let err = feed(
        &mut assembler(),
        vec![stream_start(7), insert(7, 1), abort, insert(7, 2)],
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert!(
        err.to_string()
            .contains("Stream Abort inside a stream block"),
        "{err}"
    );
}

#[tokio::test]
async fn a_stream_commit_inside_a_stream_block_is_a_protocol_error() {
    let err = feed(
        &mut assembler(),
        vec![
            stream_start(7),
            relation(Some(7)),
            insert(7, 1),
            stream_commit(7),
            insert(7, 2),
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert!(
        err.to_string()
            .contains("Stream Commit inside a stream block"),
        "{err}"
    );
}

#[tokio::test]
async fn a_subtransaction_abort_discards_only_that_subtransactions_changes() {
    let events = feed(
        &mut assembler(),
        vec![
            stream_start(7),
            relation(Some(7)),
            insert(7, 1),
            insert(8, 2),
            insert(9, 3),
            Message::StreamStop,
            Message::StreamAbort(StreamAbort { xid: 7, subxid: 8 }),
            stream_start(7),
            insert(7, 5),
            Message::StreamStop,
            stream_commit(7),
        ],
    )
    .await
    .unwrap();
    let lsns: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Change(c) => Some(c.lsn.0),
            _ => None,
        })
        .collect();
    assert_eq!(lsns, [0x102, 0x104, 0x108]);
    assert!(matches!(events.first(), Some(Event::Begin(tx)) if tx.xid == 7));
    assert!(matches!(events.last(), Some(Event::Commit { end_lsn, .. }) if end_lsn.0 == 0x910));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random valid sessions (src/cdc/assembler/script.rs): no panic, and
    /// exactly the events the model expects, streamed transactions with
    /// aborted subtransactions included.
    #[test]
    fn random_valid_sessions_emit_what_the_model_expects(
        data in proptest::collection::vec(any::<u8>(), 0..400)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(super::script::check(&data));
    }
}
