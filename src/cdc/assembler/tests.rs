use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::cdc::relation::MessageOnly;
use crate::pg::pgoutput::{
    Begin, Commit, Delete, Insert, LogicalMessage, Relation, RelationColumn, StreamAbort,
    StreamStart, TupleValue, Update,
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

/// Changes of one transaction, not streamed, for `public.t` (one key
/// column, `id`): each step is `d` (a delete), `c` (an insert), `u` (an
/// update), `m` (the moving-row message), `r` (the Relation message again)
/// or `x` (a message of another prefix) with its id. Returns each change as its op, seq and ids.
async fn ops_of(steps: &[(char, u32)]) -> Vec<(Op, u64, Option<String>, Option<String>)> {
    let text = |id: u32| vec![TupleValue::Text(Bytes::from(id.to_string()))];
    let message = |prefix: &str, content: String| {
        Message::Message(
            None,
            LogicalMessage {
                transactional: true,
                lsn: Lsn(0),
                prefix: prefix.into(),
                content: Bytes::from(content),
            },
        )
    };
    let mut messages = vec![
        Message::Begin(Begin {
            final_lsn: Lsn(0x900),
            commit_ts: 0,
            xid: 7,
        }),
        relation(None),
    ];
    for &(step, id) in steps {
        messages.push(match step {
            'd' => Message::Delete(
                None,
                Delete {
                    relation_oid: OID,
                    old_kind: OldTupleKind::Key,
                    old: text(id),
                },
            ),
            'c' => Message::Insert(
                None,
                Insert {
                    relation_oid: OID,
                    new: text(id),
                },
            ),
            'u' => Message::Update(
                None,
                Update {
                    relation_oid: OID,
                    old: None,
                    new: text(id),
                },
            ),
            'r' => relation(None),
            'm' => message(
                partition_rows::MOVING,
                format!(r#"{{"schema": "public", "table": "t", "row": {{"id": "{id}"}}}}"#),
            ),
            _ => message(partition_rows::FENCE, String::new()),
        });
    }
    messages.push(Message::Commit(Commit {
        flags: 0,
        commit_lsn: Lsn(0x900),
        end_lsn: Lsn(0x910),
        commit_ts: 0,
    }));
    let id = |row: Option<&Vec<Datum>>| match row.and_then(|r| r.first()) {
        Some(Datum::Value(v)) => Some(format!("{v:?}")),
        _ => None,
    };
    feed(&mut assembler(), messages)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            Event::Change(c) => Some((
                c.op,
                c.seq,
                id(c.before.as_ref().map(|b| &b.row)),
                id(c.after.as_ref()),
            )),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_row_moved_to_another_partition_is_one_update_numbered_as_its_delete() {
    // The server describes the table again before the first change of
    // each partition in a session.
    let moved = ops_of(&[('m', 1), ('x', 0), ('d', 1), ('r', 0), ('c', 101), ('c', 5)]).await;
    let ops: Vec<(Op, u64)> = moved.iter().map(|(op, seq, ..)| (*op, *seq)).collect();
    assert_eq!(ops, [(Op::Update, 0), (Op::Insert, 1)], "{moved:?}");
    assert_eq!(moved[0].2.as_deref(), Some("Int4(1)"), "the delete's key");
    assert_eq!(moved[0].3.as_deref(), Some("Int4(101)"), "the insert's row");
}

#[tokio::test]
async fn a_delete_and_insert_the_trigger_did_not_name_stay_as_they_are() {
    let ops = |changes: Vec<(Op, u64, Option<String>, Option<String>)>| -> Vec<(Op, u64)> {
        changes.iter().map(|(op, seq, ..)| (*op, *seq)).collect()
    };
    let d_c = [(Op::Delete, 0), (Op::Insert, 1)];
    // No message; a message naming another row; the row named, then its
    // update staying in its partition before the delete and insert.
    assert_eq!(ops(ops_of(&[('d', 1), ('c', 2)]).await), d_c);
    assert_eq!(ops(ops_of(&[('m', 9), ('d', 1), ('c', 2)]).await), d_c);
    assert_eq!(
        ops(ops_of(&[('m', 1), ('u', 2), ('d', 2), ('c', 3)]).await),
        [(Op::Update, 0), (Op::Delete, 1), (Op::Insert, 2)]
    );
    // A moving delete whose insert never came (a trigger cancelled it),
    // before an update, and before the commit.
    assert_eq!(
        ops(ops_of(&[('m', 1), ('d', 1), ('u', 2)]).await),
        [(Op::Delete, 0), (Op::Update, 1)]
    );
    assert_eq!(ops(ops_of(&[('m', 1), ('d', 1)]).await), [(Op::Delete, 0)]);
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

#[tokio::test]
async fn another_table_under_a_captured_name_stops_the_stream_before_its_rows() {
    let mut a = assembler();
    let Message::Relation(_, mut recreated) = relation(None) else {
        unreachable!()
    };
    recreated.oid = OID + 1;
    let begin = Message::Begin(Begin {
        final_lsn: Lsn(0x900),
        commit_ts: 0,
        xid: 7,
    });
    let messages = vec![begin, relation(None), Message::Relation(None, recreated)];
    let err = feed(&mut a, messages).await.unwrap_err().to_string();
    assert!(err.contains("dropped and created again"), "{err}");
    assert!(err.contains("public.t"), "{err}");
}
