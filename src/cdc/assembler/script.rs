//! Random valid pgoutput sessions for the assembler's property test and
//! fuzz target, with the events a model of the protocol expects from them.
//!
//! Bytes choose what happens next, as a server could send it: ordinary
//! transactions, Relation messages sent again with other columns, Type,
//! Insert/Update/Delete with new, old and key tuples (nulls and unchanged
//! TOAST values included), Truncate of several relations, logical messages
//! in and out of transactions, Origin, and streamed transactions whose
//! chunks interleave, with subtransactions and whole transactions aborted
//! at any point. [`check`] feeds the session to an assembler and asserts
//! that it never panics and emits exactly the model's events. The model's
//! invariant for streams: a committed streamed transaction's changes are
//! those of its subtransactions not aborted, in the order they arrived,
//! decoded by the relations as they stand when it commits.

use std::collections::HashMap;

use bytes::Bytes;

use super::Assembler;
use crate::cdc::event::{Event, Op};
use crate::cdc::relation::MessageOnly;
use crate::model::Lsn;
use crate::model::TableName;
use crate::pg::pgoutput::{
    Begin, Commit, Delete, Insert, LogicalMessage, Message, OldTupleKind, Relation, RelationColumn,
    StreamAbort, StreamStart, Truncate, TupleValue, Type, Update,
};

/// Relations 1 to 3; the assembler replicates `t1` and `t2` only.
const RELATIONS: u32 = 3;

/// What the model expects and the assembler emitted, compared as such.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Begin(u32),
    Change {
        op: Op,
        oid: u32,
        xid: u32,
        seq: u64,
        lsn: u64,
    },
    Message {
        xid: Option<u32>,
        lsn: u64,
    },
    Ddl {
        xid: u32,
        lsn: u64,
    },
    Commit {
        xid: u32,
        end_lsn: u64,
    },
}

fn seen(event: &Event) -> Seen {
    match event {
        Event::Begin(tx) => Seen::Begin(tx.xid),
        Event::Change(c) => Seen::Change {
            op: c.op,
            oid: c.relation.oid,
            xid: c.tx.xid,
            seq: c.seq,
            lsn: c.lsn.0,
        },
        Event::Message { tx, lsn, .. } => Seen::Message {
            xid: tx.map(|t| t.xid),
            lsn: lsn.0,
        },
        Event::Rewritten { tx, lsn, .. } | Event::Described { tx, lsn, .. } => Seen::Ddl {
            xid: tx.xid,
            lsn: lsn.0,
        },
        Event::Commit { tx, end_lsn } => Seen::Commit {
            xid: tx.xid,
            end_lsn: end_lsn.0,
        },
    }
}

/// A message as the model applies it.
#[derive(Debug, Clone)]
enum Step {
    Relation {
        oid: u32,
        columns: usize,
    },
    Change {
        op: Op,
        oid: u32,
        tuples: Vec<usize>,
    },
    Truncate(Vec<u32>),
    Message,
    Type,
}

/// The bytes that choose; once they run out, every choice is 0.
struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn pick(&mut self, n: usize) -> usize {
        let byte = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        usize::from(byte) % n
    }

    fn exhausted(&self) -> bool {
        self.at >= self.data.len()
    }
}

struct StreamedTx {
    xid: u32,
    subxids: Vec<u32>,
    spooled: Vec<(u32, u64, Step)>,
    aborted: Vec<u32>,
}

impl StreamedTx {
    /// The transaction and its subtransactions not aborted.
    fn live(&self) -> Vec<u32> {
        std::iter::once(self.xid)
            .chain(
                self.subxids
                    .iter()
                    .copied()
                    .filter(|s| !self.aborted.contains(s)),
            )
            .collect()
    }
}

/// The session being written and the model's view of it.
struct Session {
    messages: Vec<(u64, Message)>,
    expected: Vec<Seen>,
    /// The message at which the model expects the assembler to fail.
    fails_at: Option<usize>,
    /// Relation columns as the assembler knows them (applied).
    applied: HashMap<u32, usize>,
    lsn: u64,
    next_xid: u32,
    streams: Vec<StreamedTx>,
}

impl Session {
    fn send(&mut self, message: Message) -> u64 {
        self.lsn += 0x10;
        self.messages.push((self.lsn, message));
        self.lsn
    }

    fn failed(&self) -> bool {
        self.fails_at.is_some()
    }

    /// Applies a step of transaction `xid` as the assembler must; `seq`
    /// counts the transaction's emitted changes.
    fn apply(&mut self, xid: u32, seq: &mut u64, lsn: u64, step: &Step) {
        let known = |applied: &HashMap<u32, usize>, oid| applied.get(&oid).copied();
        match step {
            Step::Relation { oid, columns } => {
                self.applied.insert(*oid, *columns);
            }
            Step::Type => {}
            Step::Message => self.expected.push(Seen::Message {
                xid: Some(xid),
                lsn,
            }),
            Step::Change { op, oid, tuples } => {
                // A relation never described fails; a tuple of another
                // shape fails only for a captured table, whose rows are
                // decoded.
                match known(&self.applied, *oid) {
                    None => return self.fail(),
                    Some(n) if *oid != RELATIONS && tuples.iter().any(|&t| t != n) => {
                        return self.fail();
                    }
                    Some(_) => {}
                }
                self.emit(*op, *oid, xid, seq, lsn);
            }
            Step::Truncate(oids) => {
                if oids.iter().any(|&oid| known(&self.applied, oid).is_none()) {
                    return self.fail();
                }
                for &oid in oids {
                    self.emit(Op::Truncate, oid, xid, seq, lsn);
                }
            }
        }
    }

    fn emit(&mut self, op: Op, oid: u32, xid: u32, seq: &mut u64, lsn: u64) {
        if oid != RELATIONS {
            self.expected.push(Seen::Change {
                op,
                oid,
                xid,
                seq: *seq,
                lsn,
            });
            *seq += 1;
        }
    }

    fn fail(&mut self) {
        self.fails_at = Some(self.messages.len() - 1);
    }

    /// One change-carrying message for a transaction whose relations look
    /// like `view`; the message, and the step it is for the model.
    fn step(
        &mut self,
        input: &mut Input,
        view: &HashMap<u32, usize>,
        xid: Option<u32>,
    ) -> (Message, Step) {
        let oid = 1 + input.pick(RELATIONS as usize) as u32;
        let choice = if view.contains_key(&oid) {
            input.pick(8)
        } else {
            0
        };
        match choice {
            0 => {
                let columns = 1 + input.pick(4);
                let relation = Relation {
                    oid,
                    namespace: "public".into(),
                    name: format!("t{oid}"),
                    replica_identity: if input.pick(2) == 0 { b'd' } else { b'f' },
                    columns: (0..columns)
                        .map(|i| RelationColumn {
                            is_key: i == 0,
                            name: format!("c{i}"),
                            // int4, text, or a type that is not built in.
                            type_oid: [23, 25, 99999][input.pick(3)],
                            type_modifier: -1,
                        })
                        .collect(),
                };
                (
                    Message::Relation(xid, relation),
                    Step::Relation { oid, columns },
                )
            }
            1 => {
                let message = Type {
                    oid: 99999,
                    namespace: "public".into(),
                    name: "mood".into(),
                };
                (Message::Type(xid, message), Step::Type)
            }
            2 => {
                let lsn = Lsn(self.lsn + 0x10);
                let message = LogicalMessage {
                    transactional: true,
                    lsn,
                    prefix: "w2i".into(),
                    content: Bytes::from_static(b"in"),
                };
                (Message::Message(xid, message), Step::Message)
            }
            3 => {
                let oids: Vec<u32> = (1..=RELATIONS)
                    .filter(|o| *o == oid || (view.contains_key(o) && input.pick(2) == 0))
                    .collect();
                let message = Truncate {
                    options: input.pick(4) as u8,
                    relation_oids: oids.clone(),
                };
                (Message::Truncate(xid, message), Step::Truncate(oids))
            }
            op => {
                let n = view[&oid];
                let (message, op, tuples) = match op {
                    4 | 5 => {
                        let m = Insert {
                            relation_oid: oid,
                            new: tuple(input, n, TupleShape::Complete),
                        };
                        (Message::Insert(xid, m), Op::Insert, vec![n])
                    }
                    6 => {
                        let old = match input.pick(3) {
                            0 => None,
                            1 => Some((OldTupleKind::Key, tuple(input, n, TupleShape::Key))),
                            _ => Some((OldTupleKind::Full, tuple(input, n, TupleShape::Complete))),
                        };
                        let tuples = if old.is_some() { vec![n, n] } else { vec![n] };
                        let m = Update {
                            relation_oid: oid,
                            old,
                            new: tuple(input, n, TupleShape::New),
                        };
                        (Message::Update(xid, m), Op::Update, tuples)
                    }
                    _ => {
                        let (old_kind, shape) = if input.pick(2) == 0 {
                            (OldTupleKind::Key, TupleShape::Key)
                        } else {
                            (OldTupleKind::Full, TupleShape::Complete)
                        };
                        let m = Delete {
                            relation_oid: oid,
                            old_kind,
                            old: tuple(input, n, shape),
                        };
                        (Message::Delete(xid, m), Op::Delete, vec![n])
                    }
                };
                (message, Step::Change { op, oid, tuples })
            }
        }
    }

    /// An ordinary transaction, whole: Begin, changes, Commit.
    fn transaction(&mut self, input: &mut Input) {
        self.next_xid += 1;
        let xid = self.next_xid;
        self.send(Message::Begin(Begin {
            final_lsn: Lsn(self.lsn),
            commit_ts: 0,
            xid,
        }));
        self.expected.push(Seen::Begin(xid));
        if input.pick(4) == 0 {
            self.origin();
        }
        let mut seq = 0;
        while !input.exhausted() && input.pick(6) != 0 {
            let view = self.applied.clone();
            let (message, step) = self.step(input, &view, None);
            let lsn = self.send(message);
            self.apply(xid, &mut seq, lsn, &step);
            if self.failed() {
                return;
            }
        }
        let end_lsn = self.commit_lsns();
        self.send(Message::Commit(Commit {
            flags: 0,
            commit_lsn: Lsn(end_lsn - 1),
            end_lsn: Lsn(end_lsn),
            commit_ts: 0,
        }));
        self.expected.push(Seen::Commit { xid, end_lsn });
    }

    /// The end LSN of the commit about to be sent.
    fn commit_lsns(&self) -> u64 {
        self.lsn + 0x18
    }

    fn origin(&mut self) {
        self.send(Message::Origin {
            commit_lsn: Lsn(self.lsn),
            name: "node".into(),
        });
    }

    /// One chunk of a streamed transaction, new or in progress.
    fn chunk(&mut self, input: &mut Input) {
        let at = input.pick(self.streams.len() + 1);
        if at == self.streams.len() {
            self.next_xid += 1;
            self.streams.push(StreamedTx {
                xid: self.next_xid,
                subxids: Vec::new(),
                spooled: Vec::new(),
                aborted: Vec::new(),
            });
        }
        let xid = self.streams[at].xid;
        self.send(Message::StreamStart(StreamStart {
            xid,
            first_segment: self.streams[at].spooled.is_empty(),
        }));
        if input.pick(4) == 0 {
            self.origin();
        }
        while !input.exhausted() && input.pick(8) != 0 {
            // Relations as this transaction will see them, so far as a
            // sender can know: what it sent itself, else what was applied.
            let mut view = self.applied.clone();
            for (_, _, step) in &self.streams[at].spooled {
                if let Step::Relation { oid, columns } = step {
                    view.insert(*oid, *columns);
                }
            }
            let live = self.streams[at].live();
            let pick = input.pick(live.len() + 1);
            let subxid = if pick == live.len() {
                self.next_xid += 1;
                self.streams[at].subxids.push(self.next_xid);
                self.next_xid
            } else {
                live[pick]
            };
            let (message, step) = self.step(input, &view, Some(subxid));
            let lsn = self.send(message);
            self.streams[at].spooled.push((subxid, lsn, step));
        }
        self.send(Message::StreamStop);
    }

    fn stream_abort(&mut self, input: &mut Input) {
        let at = input.pick(self.streams.len());
        let choices = self.streams[at].live();
        let subxid = choices[input.pick(choices.len())];
        let xid = self.streams[at].xid;
        self.send(Message::StreamAbort(StreamAbort { xid, subxid }));
        if subxid == xid {
            self.streams.remove(at);
        } else {
            self.streams[at].aborted.push(subxid);
        }
    }

    fn stream_commit(&mut self, at: usize) {
        let tx = self.streams.remove(at);
        let end_lsn = self.commit_lsns();
        self.send(Message::StreamCommit {
            xid: tx.xid,
            commit: Commit {
                flags: 0,
                commit_lsn: Lsn(end_lsn - 1),
                end_lsn: Lsn(end_lsn),
                commit_ts: 0,
            },
        });
        self.expected.push(Seen::Begin(tx.xid));
        let mut seq = 0;
        for (subxid, lsn, step) in &tx.spooled {
            if !tx.aborted.contains(subxid) {
                self.apply(tx.xid, &mut seq, *lsn, step);
                if self.failed() {
                    return;
                }
            }
        }
        self.expected.push(Seen::Commit {
            xid: tx.xid,
            end_lsn,
        });
    }
}

#[derive(Clone, Copy, PartialEq)]
enum TupleShape {
    /// Every column, nulls allowed.
    Complete,
    /// A new tuple: non-key columns may be unchanged TOAST values.
    New,
    /// A key-only old tuple: the key, the rest sent as nulls.
    Key,
}

/// Values that every column type of the session decodes: numerals.
fn tuple(input: &mut Input, columns: usize, shape: TupleShape) -> Vec<TupleValue> {
    (0..columns)
        .map(|i| match (i, shape, input.pick(6)) {
            (0, _, n) => TupleValue::Text(Bytes::from(n.to_string())),
            (_, TupleShape::Key, _) => TupleValue::Null,
            (_, _, 0) => TupleValue::Null,
            (_, TupleShape::New, 1) => TupleValue::UnchangedToast,
            (_, _, n) => TupleValue::Text(Bytes::from((n * 1000).to_string())),
        })
        .collect()
}

/// A session the bytes choose, and what the model expects of it.
fn session(data: &[u8]) -> Session {
    let mut input = Input { data, at: 0 };
    let mut s = Session {
        messages: Vec::new(),
        expected: Vec::new(),
        fails_at: None,
        applied: HashMap::new(),
        lsn: 0x1000,
        next_xid: 700,
        streams: Vec::new(),
    };
    while !input.exhausted() && !s.failed() {
        match input.pick(6) {
            0 | 1 => s.transaction(&mut input),
            2 => s.chunk(&mut input),
            3 if !s.streams.is_empty() => {
                let at = input.pick(s.streams.len());
                s.stream_commit(at);
            }
            4 if !s.streams.is_empty() => s.stream_abort(&mut input),
            5 => {
                let lsn = Lsn(s.lsn + 0x10);
                s.send(Message::Message(
                    None,
                    LogicalMessage {
                        transactional: false,
                        lsn,
                        prefix: "w2i".into(),
                        content: Bytes::from_static(b"out"),
                    },
                ));
                s.expected.push(Seen::Message {
                    xid: None,
                    lsn: lsn.0,
                });
            }
            _ => s.origin(),
        }
    }
    // The server ends what it began: every stream still open commits.
    while !s.failed() && !s.streams.is_empty() {
        s.stream_commit(0);
    }
    s
}

/// Feeds the session the bytes choose to an assembler: it must not panic,
/// must emit exactly the model's events, and must fail exactly where the
/// model says a change names a relation unknown or of another shape.
pub async fn check(data: &[u8]) {
    let s = session(data);
    let tables = [
        TableName::parse("public.t1").unwrap(),
        TableName::parse("public.t2").unwrap(),
    ];
    let mut assembler = Assembler::new(MessageOnly, &tables);
    let mut emitted = Vec::new();
    let mut failed_at = None;
    'feed: for (i, (lsn, message)) in s.messages.iter().enumerate() {
        if assembler.push(Lsn(*lsn), message.encode()).await.is_err() {
            failed_at = Some(i);
            break;
        }
        loop {
            match assembler.next_event().await {
                Ok(Some(event)) => emitted.push(seen(&event)),
                Ok(None) => break,
                Err(_) => {
                    failed_at = Some(i);
                    break 'feed;
                }
            }
        }
    }
    assert_eq!(failed_at, s.fails_at, "where the assembler failed");
    assert_eq!(emitted, s.expected, "the events");
    if failed_at.is_none() {
        assert!(assembler.is_idle(), "idle after every transaction ended");
    }
}
