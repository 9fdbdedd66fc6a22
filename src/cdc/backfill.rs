//! The chunked backfill's reader (docs/backfill.md): one table read in
//! key-range chunks on a connection of its own, beside the stream. For
//! each chunk it says which range comes ([`Chunk::Planned`]), writes the
//! low watermark, reads the range in a short transaction whose snapshot
//! sees everything committed before that watermark, hands the rows over
//! ([`Chunk::Read`]), and writes the high watermark. The pipeline meets
//! the watermarks in the stream, in commit order with the changes, and
//! takes the range's rows at the high one; nothing is held on the source
//! between chunks.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::relation::{Catalog, RelationInfo};
use super::snapshot::LoadRows;
use super::value::Wire;
use crate::error::{Error, ErrorKind, Result};
use crate::model::TableName;
use crate::pg::config::PgConfig;
use crate::pg::copy::BinaryCopyReader;
use crate::pg::source::chunk::{self, KeyColumn, ReadSnapshot};
/// The pipeline meets the watermarks and bounds through the domain.
pub(crate) use crate::pg::source::chunk::{Bound, WATERMARK};
use crate::pg::source::{self, CatalogTable, SourceClient};

/// A key range `(after, upto]`; `None` is the table's start, or its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Range {
    pub(crate) after: Option<Bound>,
    pub(crate) upto: Option<Bound>,
}

impl Range {
    pub(crate) const WHOLE: Range = Range {
        after: None,
        upto: None,
    };
}

/// What the reader hands the pipeline, before the watermark that the
/// pipeline needs it at.
pub(crate) enum Chunk {
    /// Chunk `chunk` reads `range`; its low watermark follows.
    Planned { chunk: u64, range: Range },
    /// Chunk `chunk`'s rows, read in `snapshot`; its high watermark
    /// follows.
    Read {
        chunk: u64,
        rows: Vec<LoadRows>,
        snapshot: ReadSnapshot,
        /// The table's row estimate then, once it was ever analyzed.
        estimate: Option<u64>,
    },
}

/// A watermark's content: the reader's run, the chunk and its edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Watermark {
    pub(crate) run: String,
    pub(crate) schema: String,
    pub(crate) name: String,
    pub(crate) chunk: u64,
    pub(crate) high: bool,
}

impl Watermark {
    pub(crate) fn parse(content: &[u8]) -> Option<Watermark> {
        serde_json::from_slice(content).ok()
    }
}

/// What the reader is to read: ranges left open by an earlier run first,
/// then the table from `next` on, chunk by chunk; ranges the pipeline
/// asks to be read again come through `again`.
pub(crate) struct ReadPlan {
    pub(crate) table: TableName,
    pub(crate) run: String,
    pub(crate) chunk_rows: u64,
    pub(crate) gaps: VecDeque<Range>,
    /// Where the chunks of the table's rest start; `None` once the last
    /// chunk was planned.
    pub(crate) next: Option<Option<Bound>>,
}

/// Rows of a chunk handed over in runs of about this many.
const RUN_ROWS: usize = 16 * 1024;

/// Reads `plan` on a connection of its own until nothing is left and the
/// pipeline closes `again`, or the pipeline drops `out`.
pub(crate) async fn read(
    config: PgConfig,
    mut plan: ReadPlan,
    mut again: mpsc::UnboundedReceiver<Range>,
    out: mpsc::Sender<Chunk>,
) -> Result<()> {
    let client = Arc::new(SourceClient::connect(&config).await?);
    let mut catalog = Catalog::new(client.clone());
    let described = source::describe_table(&client, &plan.table).await?;
    let key = match chunk::chunk_key(&client, &described).await? {
        Ok(key) => key,
        Err(why) => {
            return Err(Error::new(
                ErrorKind::Preflight,
                format!("the table can no longer be read in chunks: {why}"),
            )
            .with_context("table", &plan.table));
        }
    };
    let mut chunk = 0;
    loop {
        let range = match again.try_recv() {
            Ok(range) => range,
            Err(_) => match plan.gaps.pop_front() {
                Some(range) => range,
                None => match plan.next.take() {
                    Some(after) => {
                        let upto = chunk::chunk_end(
                            &client,
                            &described,
                            &key,
                            after.as_ref(),
                            plan.chunk_rows,
                        )
                        .await?;
                        plan.next = upto.clone().map(Some);
                        Range { after, upto }
                    }
                    // Everything planned: wait for a range to read again,
                    // until the pipeline has none left to ask for.
                    None => match again.recv().await {
                        Some(range) => range,
                        None => return Ok(()),
                    },
                },
            },
        };
        chunk += 1;
        let watermark = |high| {
            serde_json::to_string(&Watermark {
                run: plan.run.clone(),
                schema: plan.table.schema.clone(),
                name: plan.table.name.clone(),
                chunk,
                high,
            })
            .expect("a watermark serializes")
        };
        if out
            .send(Chunk::Planned {
                chunk,
                range: range.clone(),
            })
            .await
            .is_err()
        {
            return Ok(());
        }
        chunk::emit_watermark(&client, &watermark(false)).await?;
        let (rows, snapshot) = read_range(&client, &mut catalog, &described, &key, &range).await?;
        let estimate = chunk::row_estimate(&client, &described).await?;
        let read = Chunk::Read {
            chunk,
            rows,
            snapshot,
            estimate,
        };
        if out.send(read).await.is_err() {
            return Ok(());
        }
        chunk::emit_watermark(&client, &watermark(true)).await?;
    }
}

/// Reads `range` in a short transaction: its rows in runs, the
/// snapshot they were read in.
async fn read_range(
    client: &SourceClient,
    catalog: &mut Catalog,
    table: &CatalogTable,
    key: &[KeyColumn],
    range: &Range,
) -> Result<(Vec<LoadRows>, ReadSnapshot)> {
    let snapshot = chunk::begin_read(client, table).await?;
    crate::failpoint::stall("chunk-read").await;
    // The columns as they are in the read's snapshot.
    let described = source::describe_table(client, &table.name).await?;
    let relation: Arc<RelationInfo> = Arc::new(catalog.relation_from_table(&described).await?);
    let (wires, casts): (Vec<Wire>, Vec<bool>) = relation
        .columns
        .iter()
        .map(|c| Wire::of(c.type_oid))
        .unzip();
    let wires: Arc<[Wire]> = wires.into();
    let mut stream = Box::pin(
        chunk::copy_chunk(
            client,
            &described,
            &casts,
            key,
            (range.after.as_ref(), range.upto.as_ref()),
        )
        .await?,
    );
    let mut reader = BinaryCopyReader::new(relation.columns.len());
    let mut runs = Vec::new();
    let mut read = 0u64;
    let mut take = |reader: &mut BinaryCopyReader, runs: &mut Vec<LoadRows>| {
        let rows = reader.take();
        if rows.is_empty() {
            return;
        }
        read += rows.len() as u64;
        runs.push(LoadRows {
            relation: relation.clone(),
            wires: wires.clone(),
            first_seq: read - rows.len() as u64,
            table_rows: read,
            estimate: None,
            rows,
        });
    };
    while let Some(bytes) = source::next_copy_chunk(&mut stream, &table.name).await? {
        reader
            .push(&bytes)
            .map_err(|e| Error::from(e).with_context("table", &table.name))?;
        if reader.rows() >= RUN_ROWS {
            take(&mut reader, &mut runs);
        }
    }
    reader
        .finish()
        .map_err(|e| Error::from(e).with_context("table", &table.name))?;
    take(&mut reader, &mut runs);
    chunk::end_read(client, &table.name).await?;
    Ok((runs, snapshot))
}
