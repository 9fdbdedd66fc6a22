//! Replication commands and the CopyBoth stream's messages.
//!
//! See "Streaming Replication Protocol"
//! (<https://www.postgresql.org/docs/current/protocol-replication.html>).
//! Inside CopyBoth the server sends XLogData (`w`) and PrimaryKeepalive
//! (`k`); we send StandbyStatusUpdate (`r`). The stream itself runs on a
//! task of its own ([`stream`]), which holds the feedback rule.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use postgres_protocol::message::backend::Message;

use super::conn::{Frame, ReplicationConnection, ServerError, copy_data};
use super::wire::{DecodeError, Reader};
use crate::error::{Error, ErrorKind, Result};
use crate::model::Lsn;

mod stream;

pub(crate) use stream::ReplicationStream;

/// XLogData tag within CopyData.
const XLOG_DATA: u8 = b'w';
/// PrimaryKeepalive tag within CopyData.
const PRIMARY_KEEPALIVE: u8 = b'k';
/// StandbyStatusUpdate tag within CopyData.
const STANDBY_STATUS_UPDATE: u8 = b'r';

/// Microseconds between the Unix epoch and the PostgreSQL epoch.
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// The answer to IDENTIFY_SYSTEM.
#[derive(Debug, Clone)]
pub struct SystemIdentity {
    pub system_id: String,
    pub(crate) timeline: u32,
    pub(crate) xlogpos: Lsn,
}

/// A logical slot just created, with the snapshot it exported.
#[derive(Debug, Clone)]
pub(crate) struct CreatedSlot {
    pub(crate) slot_name: String,
    /// Changes that commit after this position are streamed; everything
    /// before it is in the exported snapshot.
    pub(crate) consistent_point: Lsn,
    /// Valid until the next command on the replication connection.
    pub(crate) snapshot_name: String,
}

/// Options for START_REPLICATION with pgoutput.
#[derive(Debug, Clone)]
pub struct StartOptions {
    pub slot: String,
    /// Where to start; `0/0` lets the server start at the slot's confirmed
    /// position.
    pub start_lsn: Lsn,
    /// pgoutput protocol version: 1, or 2 for streamed transactions.
    pub proto_version: u32,
    pub publications: Vec<String>,
    /// Also send logical decoding messages (`pg_logical_emit_message`).
    pub messages: bool,
    /// Stream large in-progress transactions (protocol version 2).
    pub streaming: bool,
}

impl ReplicationConnection {
    pub async fn identify_system(&mut self) -> Result<SystemIdentity> {
        let r = self.simple_query("IDENTIFY_SYSTEM").await?;
        let field = |name: &str| {
            r.get(name).map(str::to_owned).ok_or_else(|| {
                Error::new(
                    ErrorKind::Protocol,
                    format!("IDENTIFY_SYSTEM returned no {name}"),
                )
            })
        };
        Ok(SystemIdentity {
            system_id: field("systemid")?,
            timeline: field("timeline")?.parse().map_err(|_| {
                Error::new(
                    ErrorKind::Protocol,
                    "IDENTIFY_SYSTEM returned a non-numeric timeline",
                )
            })?,
            xlogpos: parse_lsn(&field("xlogpos")?)?,
        })
    }

    /// CREATE_REPLICATION_SLOT ... LOGICAL pgoutput, exporting a snapshot.
    /// The snapshot stays usable only while this connection sends nothing
    /// else: run the whole initial load before calling anything on it.
    pub(crate) async fn create_slot(&mut self, slot: &str, temporary: bool) -> Result<CreatedSlot> {
        let temporary = if temporary { " TEMPORARY" } else { "" };
        // The parenthesized option list exists from PostgreSQL 15 on.
        let sql = if self.server_version_num() >= 150_000 {
            format!(
                "CREATE_REPLICATION_SLOT {}{temporary} LOGICAL pgoutput (SNAPSHOT 'export')",
                quote_ident(slot)
            )
        } else {
            format!(
                "CREATE_REPLICATION_SLOT {}{temporary} LOGICAL pgoutput EXPORT_SNAPSHOT",
                quote_ident(slot)
            )
        };
        let r = self
            .simple_query(&sql)
            .await
            .map_err(|e| slot_error(e, slot))?;
        let consistent_point = parse_lsn(r.get("consistent_point").unwrap_or(""))?;
        let snapshot_name = r
            .get("snapshot_name")
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Protocol,
                    "CREATE_REPLICATION_SLOT exported no snapshot",
                )
            })?
            .to_owned();
        Ok(CreatedSlot {
            slot_name: slot.to_owned(),
            consistent_point,
            snapshot_name,
        })
    }

    /// START_REPLICATION; the connection becomes a [`ReplicationStream`].
    pub async fn start_replication(mut self, options: &StartOptions) -> Result<ReplicationStream> {
        let publications = options
            .publications
            .iter()
            .map(|p| quote_ident(p))
            .collect::<Vec<_>>()
            .join(",");
        let mut sql = format!(
            "START_REPLICATION SLOT {} LOGICAL {} (proto_version '{}', publication_names {}",
            quote_ident(&options.slot),
            options.start_lsn,
            options.proto_version,
            quote_literal(&publications),
        );
        if options.messages {
            sql.push_str(", messages 'true'");
        }
        if options.streaming {
            sql.push_str(", streaming 'on'");
        }
        sql.push(')');
        let wal_sender_timeout = self.wal_sender_timeout().await;
        self.send_query(&sql).await?;
        loop {
            match self.read_frame().await {
                Ok(Frame::CopyBothResponse) => break,
                Ok(Frame::Message(Message::NoticeResponse(_))) => {}
                Ok(Frame::Message(_)) => {
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        "unexpected message in reply to START_REPLICATION",
                    ));
                }
                Err(e) => return Err(slot_error(e, &options.slot)),
            }
        }
        Ok(ReplicationStream::spawn(
            self,
            options.slot.clone(),
            options.start_lsn,
            wal_sender_timeout,
        ))
    }

    /// The server's `wal_sender_timeout` for this connection; `None` when
    /// it is off or cannot be read (SHOW is a replication command from
    /// PostgreSQL 10 on).
    async fn wal_sender_timeout(&mut self) -> Option<Duration> {
        let shown = self.simple_query("SHOW wal_sender_timeout").await.ok()?;
        parse_guc_duration(shown.get("wal_sender_timeout")?).filter(|d| !d.is_zero())
    }
}

/// A time setting as SHOW prints it: `60s`, `500ms`, `1min`, `0`.
fn parse_guc_duration(text: &str) -> Option<Duration> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let millis = match unit.trim() {
        "us" => return Some(Duration::from_micros(n)),
        "ms" | "" => n,
        "s" => n * 1000,
        "min" => n * 60_000,
        "h" => n * 3_600_000,
        "d" => n * 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(millis))
}

/// The cadence of status updates for a server that drops a connection
/// silent for `wal_sender_timeout`: a quarter of it, at most
/// [`DEFAULT_STATUS_INTERVAL`].
fn status_interval_for(wal_sender_timeout: Option<Duration>) -> Duration {
    wal_sender_timeout.map_or(DEFAULT_STATUS_INTERVAL, |t| {
        (t / 4).clamp(Duration::from_millis(50), DEFAULT_STATUS_INTERVAL)
    })
}

/// How often a status update is sent when nothing else prompts one, at
/// most: well inside the default `wal_sender_timeout` of 60 s.
pub(crate) const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// A message of the CopyBoth stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationMessage {
    XLogData {
        /// The WAL position of the start of this data.
        wal_start: Lsn,
        /// The server's current end of WAL.
        wal_end: Lsn,
        /// Server clock, microseconds since 2000-01-01 UTC.
        send_time: i64,
        data: Bytes,
    },
    PrimaryKeepalive {
        wal_end: Lsn,
        send_time: i64,
        reply_requested: bool,
    },
}

impl ReplicationMessage {
    /// Decodes the body of one CopyData message.
    pub fn decode(data: Bytes) -> Result<ReplicationMessage, DecodeError> {
        let mut r = Reader::new(data, "replication CopyData");
        match r.u8("tag")? {
            XLOG_DATA => {
                r.set_message("XLogData");
                Ok(ReplicationMessage::XLogData {
                    wal_start: Lsn(r.u64("wal_start")?),
                    wal_end: Lsn(r.u64("wal_end")?),
                    send_time: r.i64("send_time")?,
                    data: r.rest(),
                })
            }
            PRIMARY_KEEPALIVE => {
                r.set_message("PrimaryKeepalive");
                let message = ReplicationMessage::PrimaryKeepalive {
                    wal_end: Lsn(r.u64("wal_end")?),
                    send_time: r.i64("send_time")?,
                    reply_requested: r.u8("reply_requested")? == 1,
                };
                r.finish()?;
                Ok(message)
            }
            other => Err(r.error("tag", format!("unknown CopyData tag 0x{other:02x}"))),
        }
    }
}

/// Encodes a StandbyStatusUpdate.
/// We never ask the server to reply: its keepalives arrive on their own.
pub(crate) fn standby_status_update(
    write: Lsn,
    flush: Lsn,
    apply: Lsn,
    now_pg_micros: i64,
) -> Bytes {
    let mut buf = BytesMut::with_capacity(34);
    buf.put_u8(STANDBY_STATUS_UPDATE);
    buf.put_u64(write.0);
    buf.put_u64(flush.0);
    buf.put_u64(apply.0);
    buf.put_i64(now_pg_micros);
    buf.put_u8(0);
    buf.freeze()
}

/// What a backend message inside CopyBoth means for the stream.
#[derive(Debug, PartialEq)]
enum InCopyBoth {
    CopyData(Bytes),
    /// The server ended the copy; ours is still to be sent.
    CopyDone,
    /// At a server shutdown the walsender sends what WAL is left and then
    /// CommandComplete, without CopyDone (walsender.c, WalSndDone).
    Ended,
    /// Nothing for the stream.
    Skip,
}

/// The protocol allows NoticeResponse and ParameterStatus at any time
/// ("Asynchronous Operations" in the protocol chapter), CopyBoth included.
fn in_copy_both(frame: Frame) -> Result<InCopyBoth> {
    match frame {
        Frame::Message(Message::NoticeResponse(body)) => {
            let notice = ServerError::from_fields(body.fields());
            tracing::warn!(
                severity = %notice.severity,
                code = %notice.code,
                message = %notice.message,
                "notice from the server inside the replication stream"
            );
            Ok(InCopyBoth::Skip)
        }
        Frame::Message(Message::ParameterStatus(body)) => {
            tracing::debug!(
                name = body.name().unwrap_or("?"),
                value = body.value().unwrap_or("?"),
                "parameter status from the server inside the replication stream"
            );
            Ok(InCopyBoth::Skip)
        }
        Frame::Message(Message::CopyDone) => Ok(InCopyBoth::CopyDone),
        Frame::Message(Message::CommandComplete(_)) => Ok(InCopyBoth::Ended),
        Frame::Message(m) => copy_data(m).map(InCopyBoth::CopyData).ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                "unexpected message inside the replication stream",
            )
        }),
        Frame::CopyBothResponse => {
            Err(Error::new(ErrorKind::Protocol, "a second CopyBothResponse"))
        }
    }
}

fn pg_now_micros() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    unix - PG_EPOCH_OFFSET_MICROS
}

fn parse_lsn(text: &str) -> Result<Lsn> {
    text.parse().map_err(|e| {
        Error::new(ErrorKind::Protocol, "the server returned an invalid LSN").with_source(e)
    })
}

/// The SQLSTATE of a slot another process holds (`object_in_use`).
pub(crate) const SLOT_IN_USE: &str = "55006";

/// Turns the server's slot errors into errors that say what to do.
fn slot_error(err: Error, slot: &str) -> Error {
    let message = match err.sqlstate() {
        Some(SLOT_IN_USE) => format!(
            "replication slot {slot:?} is in use by another process: stop the other consumer \
             (see pg_replication_slots.active_pid) or use another slot name"
        ),
        Some("42704") => format!(
            "replication slot {slot:?} does not exist: it was dropped; run again to create it \
             (this takes a new initial load)"
        ),
        Some("42710") => format!("replication slot {slot:?} already exists"),
        Some("53400") => {
            "no free replication slot: raise max_replication_slots or drop an unused slot \
                          (see pg_replication_slots)"
                .to_owned()
        }
        Some("55000")
            if err.to_string().contains("invalidated")
                || err.to_string().contains("can no longer") =>
        {
            format!(
                "replication slot {slot:?} was invalidated (it retained more WAL than \
                 max_slot_wal_keep_size allows): drop it and start again with a new initial load"
            )
        }
        _ => return err.with_context("slot", slot),
    };
    Error::new(ErrorKind::Slot, message).with_source(err)
}

/// Quotes an identifier for a replication command.
pub(crate) fn quote_ident(ident: &str) -> String {
    postgres_protocol::escape::escape_identifier(ident)
}

/// Quotes a string literal for a replication command. Not
/// `postgres_protocol::escape::escape_literal`: for a backslash that
/// writes `E'..'`, which the walsender's command grammar does not take.
pub(crate) fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_xlogdata_and_keepalive() {
        let mut buf = BytesMut::new();
        buf.put_u8(b'w');
        buf.put_u64(0x10);
        buf.put_u64(0x20);
        buf.put_i64(5);
        buf.put_slice(b"payload");
        assert_eq!(
            ReplicationMessage::decode(buf.freeze()).unwrap(),
            ReplicationMessage::XLogData {
                wal_start: Lsn(0x10),
                wal_end: Lsn(0x20),
                send_time: 5,
                data: Bytes::from_static(b"payload"),
            }
        );
        let mut buf = BytesMut::new();
        buf.put_u8(b'k');
        buf.put_u64(0x30);
        buf.put_i64(6);
        buf.put_u8(1);
        assert_eq!(
            ReplicationMessage::decode(buf.freeze()).unwrap(),
            ReplicationMessage::PrimaryKeepalive {
                wal_end: Lsn(0x30),
                send_time: 6,
                reply_requested: true
            }
        );
    }

    #[test]
    fn truncated_copy_data_is_an_error() {
        let mut buf = BytesMut::new();
        buf.put_u8(b'k');
        buf.put_u64(0x30);
        buf.put_i64(6);
        buf.put_u8(0);
        let full = buf.freeze();
        for cut in 0..full.len() {
            assert!(ReplicationMessage::decode(full.slice(..cut)).is_err());
        }
        assert!(ReplicationMessage::decode(Bytes::from_static(b"x")).is_err());
    }

    /// One backend message: tag, length, body.
    fn backend(tag: u8, body: &[u8]) -> Frame {
        let mut buf = BytesMut::new();
        buf.put_u8(tag);
        buf.put_i32(4 + body.len() as i32);
        buf.put_slice(body);
        Frame::Message(Message::parse(&mut buf).unwrap().unwrap())
    }

    #[test]
    fn notices_and_parameter_status_inside_copy_both_are_skipped() {
        let notice = backend(b'N', b"SWARNING\0VWARNING\0C01000\0Mslot is lagging\0\0");
        assert_eq!(in_copy_both(notice).unwrap(), InCopyBoth::Skip);
        let status = backend(b'S', b"in_hot_standby\0off\0");
        assert_eq!(in_copy_both(status).unwrap(), InCopyBoth::Skip);
        assert_eq!(
            in_copy_both(backend(b'd', b"w...")).unwrap(),
            InCopyBoth::CopyData(Bytes::from_static(b"w..."))
        );
        assert_eq!(
            in_copy_both(backend(b'c', b"")).unwrap(),
            InCopyBoth::CopyDone
        );
        assert_eq!(
            in_copy_both(backend(b'C', b"COPY 0\0")).unwrap(),
            InCopyBoth::Ended
        );
        let err = in_copy_both(backend(b'Z', b"I")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol);
    }

    #[test]
    fn a_malformed_notice_inside_copy_both_is_skipped_too() {
        // A notice without its terminating NUL: logged as far as it reads.
        let notice = backend(b'N', b"SWARNING\0Mhalf");
        assert_eq!(in_copy_both(notice).unwrap(), InCopyBoth::Skip);
    }

    #[test]
    fn encodes_standby_status_update() {
        let update = standby_status_update(Lsn(3), Lsn(2), Lsn(1), 9);
        assert_eq!(update.len(), 34);
        assert_eq!(update[0], b'r');
        assert_eq!(&update[1..9], &3u64.to_be_bytes());
        assert_eq!(&update[9..17], &2u64.to_be_bytes());
        assert_eq!(&update[17..25], &1u64.to_be_bytes());
        assert_eq!(&update[25..33], &9i64.to_be_bytes());
        assert_eq!(update[33], 0);
    }

    #[test]
    fn status_updates_go_out_four_times_per_wal_sender_timeout() {
        let shown = |text| status_interval_for(parse_guc_duration(text).filter(|d| !d.is_zero()));
        assert_eq!(shown("2s"), Duration::from_millis(500));
        assert_eq!(shown("1min"), DEFAULT_STATUS_INTERVAL);
        assert_eq!(shown("0"), DEFAULT_STATUS_INTERVAL, "off");
        assert_eq!(shown("100ms"), Duration::from_millis(50));
        assert_eq!(parse_guc_duration("3h"), Some(Duration::from_secs(10_800)));
        assert_eq!(parse_guc_duration("5 fortnights"), None);
        assert_eq!(parse_guc_duration(""), None);
    }

    #[test]
    fn quotes_identifiers_and_literals() {
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
