//! A streamed transaction's messages spooled to an anonymous temporary
//! file until its Stream Commit, then read back in order.

use std::collections::HashSet;

use tokio::io::{AsyncSeekExt, AsyncWriteExt, BufReader, BufWriter};

use crate::cdc::event::TxInfo;
use crate::error::{Error, ErrorKind, Result};
use crate::model::Lsn;
use crate::pg::pgoutput::Decoder;

/// Spooled messages of one streamed top-level transaction.
pub(super) struct Spool {
    pub(super) writer: BufWriter<tokio::fs::File>,
    /// Subtransactions rolled back while streaming: their messages are skipped.
    pub(super) aborted: HashSet<u32>,
    pub(super) messages: u64,
}

impl Spool {
    pub(super) fn create() -> Result<Spool> {
        let file = tempfile::tempfile().map_err(|e| {
            Error::new(
                ErrorKind::Io,
                "cannot create a spool file for a streamed transaction",
            )
            .with_source(e)
        })?;
        Ok(Spool {
            writer: BufWriter::new(tokio::fs::File::from_std(file)),
            aborted: HashSet::new(),
            messages: 0,
        })
    }

    /// Frame: wal_start u64, subxid u32, length u32, payload.
    pub(super) async fn append(&mut self, lsn: Lsn, subxid: u32, payload: &[u8]) -> Result<()> {
        let len = u32::try_from(payload.len())
            .map_err(|_| Error::new(ErrorKind::Protocol, "a streamed message exceeds 4 GiB"))?;
        self.writer.write_u64(lsn.0).await?;
        self.writer.write_u32(subxid).await?;
        self.writer.write_u32(len).await?;
        self.writer.write_all(payload).await?;
        self.messages += 1;
        Ok(())
    }

    pub(super) async fn into_replay(mut self, tx: TxInfo, end_lsn: Lsn) -> Result<Replay> {
        self.writer.flush().await?;
        let mut file = self.writer.into_inner();
        file.rewind().await?;
        Ok(Replay {
            reader: BufReader::new(file),
            remaining: self.messages,
            aborted: self.aborted,
            decoder: Decoder::streamed(),
            tx,
            end_lsn,
            seq: 0,
        })
    }
}

/// A committed streamed transaction being read back from its spool.
pub(super) struct Replay {
    pub(super) reader: BufReader<tokio::fs::File>,
    pub(super) remaining: u64,
    pub(super) aborted: HashSet<u32>,
    pub(super) decoder: Decoder,
    pub(super) tx: TxInfo,
    pub(super) end_lsn: Lsn,
    pub(super) seq: u64,
}
