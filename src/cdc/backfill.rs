//! The chunked backfill's reader (docs/backfill.md): one table read in
//! key-range chunks on connections of its own, beside the stream. For
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
use tokio::task::JoinSet;

use super::relation::{Catalog, RelationInfo};
use super::snapshot::LoadRows;
use super::value::Wire;
use crate::error::{Error, ErrorKind, Result};
use crate::model::TableName;
use crate::pg::config::PgConfig;
use crate::pg::copy::BinaryCopyReader;
use crate::pg::source::chunk::{self, KeyColumn};
/// The pipeline meets the watermarks and bounds through the domain.
pub(crate) use crate::pg::source::chunk::{Bound, ReadSnapshot, WATERMARK};
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

/// A connection of the reader's, with its catalog.
struct Connection {
    client: Arc<SourceClient>,
    catalog: Catalog,
}

impl Connection {
    async fn open(config: &PgConfig) -> Result<Connection> {
        let client = Arc::new(SourceClient::connect(config).await?);
        let catalog = Catalog::new(client.clone());
        Ok(Connection { client, catalog })
    }
}

/// A chunk's read done on `connection`, for its high watermark.
type Done = (Connection, Chunk, String);

/// Reads `plan` on up to `connections` connections of its own until
/// nothing is left and the pipeline closes `again`, or the pipeline drops
/// `out`. Chunks are planned, their low watermarks written and their
/// snapshots taken one after another, so that each snapshot is taken
/// after the one before it; their reads then run at once, one per
/// connection, and each one's high watermark follows its rows.
pub(crate) async fn read(
    config: PgConfig,
    mut plan: ReadPlan,
    mut again: mpsc::UnboundedReceiver<Range>,
    out: mpsc::Sender<Chunk>,
    connections: usize,
) -> Result<()> {
    let first = Connection::open(&config).await?;
    let described = source::describe_table(&first.client, &plan.table).await?;
    let key = match chunk::chunk_key(&first.client, &described).await? {
        Ok(key) => key,
        Err(why) => {
            return Err(Error::new(
                ErrorKind::Preflight,
                format!("the table can no longer be read in chunks: {why}"),
            )
            .with_context("table", &plan.table));
        }
    };
    let mut idle = vec![first];
    let mut opened = 1;
    let mut reads: JoinSet<Result<Done>> = JoinSet::new();
    let mut chunk = 0;
    loop {
        // A connection for the next chunk: an idle one, a new one, or the
        // first whose read ends (its high watermark written first).
        let connection = loop {
            if let Some(connection) = idle.pop() {
                break connection;
            }
            if opened < connections {
                opened += 1;
                break Connection::open(&config).await?;
            }
            let done = reads.join_next().await.expect("a read runs");
            match hand_over(&out, done).await? {
                Some(connection) => idle.push(connection),
                None => return Ok(()),
            }
        };
        let range = match again.try_recv() {
            Ok(range) => range,
            Err(_) => match plan.gaps.pop_front() {
                Some(range) => range,
                None => match plan.next.take() {
                    Some(after) => {
                        // On the connection that reads it, idle now.
                        let upto = chunk::chunk_end(
                            &connection.client,
                            &described,
                            &key,
                            after.as_ref(),
                            plan.chunk_rows,
                        )
                        .await?;
                        plan.next = upto.clone().map(Some);
                        Range { after, upto }
                    }
                    // Everything planned: the reads in flight end, then a
                    // range to read again is waited for, until the
                    // pipeline has none left to ask for.
                    None => {
                        idle.push(connection);
                        match reads.join_next().await {
                            Some(done) => match hand_over(&out, done).await? {
                                Some(connection) => idle.push(connection),
                                None => return Ok(()),
                            },
                            None => match again.recv().await {
                                Some(range) => plan.gaps.push_front(range),
                                None => return Ok(()),
                            },
                        }
                        continue;
                    }
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
        chunk::emit_watermark(&connection.client, &watermark(false)).await?;
        let snapshot = chunk::begin_read(&connection.client, &described).await?;
        let (described, key, high) = (described.clone(), key.clone(), watermark(true));
        reads.spawn(async move {
            let mut connection = connection;
            let rows = read_range(&mut connection, &described, &key, &range).await?;
            // The last run counts the chunk's rows.
            let count = rows.last().map_or(0, |run| run.table_rows);
            tracing::debug!(table = %described.name, chunk, rows = count, "backfill chunk read");
            let estimate = chunk::row_estimate(&connection.client, &described).await?;
            let read = Chunk::Read {
                chunk,
                rows,
                snapshot,
                estimate,
            };
            Ok((connection, read, high))
        });
    }
}

/// Hands a read's rows over and writes its high watermark; the connection
/// it was read on, or `None` once the pipeline is gone.
async fn hand_over(
    out: &mpsc::Sender<Chunk>,
    done: std::result::Result<Result<Done>, tokio::task::JoinError>,
) -> Result<Option<Connection>> {
    let (connection, read, high) = done.map_err(|e| {
        Error::new(ErrorKind::Connection, "a chunk's read ended abnormally").with_source(e)
    })??;
    if out.send(read).await.is_err() {
        return Ok(None);
    }
    chunk::emit_watermark(&connection.client, &high).await?;
    Ok(Some(connection))
}

/// Reads `range` in the transaction [`chunk::begin_read`] began on
/// `connection`, and ends it: its rows in runs.
async fn read_range(
    connection: &mut Connection,
    table: &CatalogTable,
    key: &[KeyColumn],
    range: &Range,
) -> Result<Vec<LoadRows>> {
    let client = &connection.client;
    crate::failpoint::stall("chunk-read").await;
    // The columns as they are in the read's snapshot.
    let described = source::describe_table(client, &table.name).await?;
    let relation: Arc<RelationInfo> =
        Arc::new(connection.catalog.relation_from_table(&described).await?);
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
    Ok(runs)
}
