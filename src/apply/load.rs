//! The initial load into the pipeline: runs of rows decoded on their
//! connections' tasks ([`load_columns`]: the COPY cells to Arrow, the
//! one place the load's wire formats meet the lake's types), staged into
//! both tables of each sink, committed as one batch at the snapshot's
//! position.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use tokio::time::Instant;

use super::RunOptions;
use super::pipeline::Pipeline;
use crate::cdc::event::{Op, TxInfo};
use crate::cdc::relation::RelationInfo;
use crate::cdc::snapshot::{LoadRows, SnapshotLoad};
use crate::cdc::value::{BinaryNumeric, PgType, Wire};
use crate::error::Error;
use crate::error::Result;
use crate::failpoint;
use crate::lake::files::arrow::{ColumnBuilder, Verbatim};
use crate::lake::files::writer::Position;
use crate::lake::schema::evolve::{self, Mode};
use crate::lake::schema::source_arrow_fields;
use crate::metrics::metrics;
use crate::model::Lsn;
use crate::model::TableName;
use crate::pg::config::PgConfig;

/// A run of the initial load's rows, decoded into silver-typed Arrow
/// columns on its connection's task.
struct LoadBatch {
    relation: Arc<RelationInfo>,
    first_seq: u64,
    fields: Vec<FieldRef>,
    columns: Vec<ArrayRef>,
    /// The values `columns` cannot hold.
    verbatim: Verbatim,
    rows: usize,
    /// Bytes of COPY data the rows came in.
    bytes: usize,
    /// Rows of the table read so far, these included, and its estimate.
    table_rows: u64,
    estimate: Option<u64>,
}

impl LoadBatch {
    fn decode(rows: LoadRows, lsn: Lsn) -> Result<LoadBatch> {
        let fields = source_arrow_fields(&rows.relation)?;
        let (columns, verbatim) = load_columns(&fields, &rows, lsn)?;
        Ok(LoadBatch {
            first_seq: rows.first_seq,
            fields,
            columns,
            verbatim,
            rows: rows.rows.len(),
            bytes: rows.rows.bytes(),
            table_rows: rows.table_rows,
            estimate: rows.estimate,
            relation: rows.relation,
        })
    }
}

/// Log lines on the initial load's progress: rows done of the estimate,
/// rate and time left, every few seconds.
struct ProgressLog {
    next: Instant,
    /// Per table: when its first run came, and the rows read by then (its
    /// runs interleave with other tables' when loads run in parallel).
    since: HashMap<TableName, (Instant, u64)>,
}

impl ProgressLog {
    const EVERY: Duration = Duration::from_secs(5);

    fn new() -> ProgressLog {
        ProgressLog {
            next: Instant::now() + Self::EVERY,
            since: HashMap::new(),
        }
    }

    fn tick(&mut self, load: &LoadBatch) {
        let now = Instant::now();
        let table = &load.relation.name;
        let (since, rows_at_since) = *self
            .since
            .entry(table.clone())
            .or_insert((now, load.table_rows));
        if now < self.next {
            return;
        }
        self.next = now + Self::EVERY;
        let seconds = (now - since).as_secs_f64().max(0.001);
        // The ranges of a table split over connections count its rows
        // together, and their runs may come in another order.
        let rate = load.table_rows.saturating_sub(rows_at_since) as f64 / seconds;
        let left = load
            .estimate
            .map(|e| e.saturating_sub(load.table_rows) as f64 / rate.max(1.0));
        tracing::info!(
            %table,
            rows = load.table_rows,
            estimate = load.estimate,
            rows_per_second = rate.round(),
            seconds_left = left.map(f64::round),
            "initial load progress"
        );
    }
}

impl Pipeline<'_> {
    /// Reads the initial load and commits it as one batch at its
    /// snapshot's position; false when a stop request came first (nothing
    /// of it is committed then).
    pub(crate) async fn load(
        &mut self,
        load: SnapshotLoad,
        config: &PgConfig,
        options: &RunOptions,
    ) -> Result<bool> {
        let mut progress = ProgressLog::new();
        let tx = load.tx();
        let mut load = load
            .in_parallel(config, options.run.load_connections, move |rows| {
                LoadBatch::decode(rows, tx.commit_lsn)
            })
            .await?;
        while let Some(batch) = load.next().await? {
            failpoint::stall("load").await;
            progress.tick(&batch);
            if options.shutdown.is_requested() {
                tracing::info!("stopping during the initial load: nothing of it is committed");
                return Ok(false);
            }
            self.take_load(tx, &batch).await?;
            let m = metrics();
            m.initial_load_rows.inc_by(batch.rows as u64);
            m.initial_load_bytes.inc_by(batch.bytes as u64);
            failpoint::hit("initial-load");
        }
        for relation in load.relations() {
            self.ensure_sink(relation).await?;
        }
        self.batch_end = Some(Position {
            commit_lsn: tx.commit_lsn,
            end_lsn: tx.commit_lsn,
            commit_ts: tx.commit_ts,
        });
        self.flush().await?;
        Ok(true)
    }

    /// Stages a run of the initial load's rows, whose columns bronze and
    /// silver both take.
    async fn take_load(&mut self, tx: TxInfo, load: &LoadBatch) -> Result<()> {
        let relation = &load.relation;
        self.ensure_sink(relation).await?;
        let sink = self
            .sinks
            .get_mut(&relation.name)
            .expect("ensure_sink just ran");
        let to_bronze = sink.bronze_at.is_none() || sink.resync.is_some();
        let to_silver = sink.silver.is_some() && sink.silver_at.is_none();
        // A resync's relation may be ahead of bronze's stream.
        let bronze_mode = match sink.bronze_at {
            None => Mode::Bronze,
            Some(_) => Mode::BronzeAhead,
        };
        self.resync_asked |= sink
            .follow(
                &self.lake,
                relation,
                to_bronze.then_some(bronze_mode),
                to_silver.then_some(Mode::SilverReload),
            )
            .await?;
        // A table that lost its key takes no more rows in silver.
        let to_silver = to_silver && !sink.reloading;
        if !to_bronze && !to_silver {
            return Ok(());
        }
        if to_bronze {
            let renamed;
            let fields = match bronze_mode {
                Mode::BronzeAhead => {
                    let table = sink.bronze.table(&self.lake).await?;
                    renamed = evolve::held_names(&table, relation)
                        .iter()
                        .zip(&load.fields)
                        .map(|(name, f)| Arc::new(f.as_ref().clone().with_name(name)))
                        .collect::<Vec<FieldRef>>();
                    &renamed
                }
                _ => &load.fields,
            };
            sink.bronze
                .stage_load(
                    &self.lake,
                    tx,
                    load.first_seq,
                    fields,
                    &load.columns,
                    &load.verbatim,
                )
                .await?;
            sink.bronze_dirty = true;
        }
        if let Some(silver) = sink.silver.as_mut().filter(|_| to_silver) {
            silver
                .stage_load(&self.lake, tx, &load.fields, &load.columns, &load.verbatim)
                .await?;
            sink.silver_dirty = true;
        }
        let n = load.rows;
        self.batch_changes += n;
        self.batch_bytes += load.bytes;
        *sink.ops.entry(Op::Read.code()).or_default() += n as u64;
        Ok(())
    }
}

/// The initial load's rows as arrays of `fields`, the relation's columns
/// as the tables map them, and the values those cannot hold. Text reaches
/// string columns, and a `numeric` its decimal column, without a
/// [`Value`] between.
pub fn load_columns(
    fields: &[FieldRef],
    rows: &LoadRows,
    lsn: Lsn,
) -> Result<(Vec<ArrayRef>, Verbatim)> {
    let relation = &rows.relation;
    let mut builders = fields
        .iter()
        .map(|f| ColumnBuilder::new(f, rows.rows.len()))
        .collect::<Result<Vec<_>>>()
        .map_err(|e| e.with_context("table", &relation.name))?;
    let mut verbatim = Verbatim::default();
    let mut row = 0;
    rows.rows.for_each(|cells| {
        for (((cell, builder), wire), column) in cells
            .zip(&mut builders)
            .zip(rows.wires.iter())
            .zip(&relation.columns)
        {
            let Some(bytes) = cell else {
                builder.append_null();
                continue;
            };
            let done = match wire {
                Wire::Text => {
                    matches!(
                        column.pg_type,
                        PgType::Text
                            | PgType::Json
                            | PgType::Jsonb
                            | PgType::Inet
                            | PgType::Cidr
                            | PgType::Enum
                            | PgType::Unknown
                    ) && std::str::from_utf8(bytes).is_ok_and(|text| builder.append_str(text))
                }
                Wire::Numeric => {
                    BinaryNumeric::parse(bytes).is_some_and(|n| builder.append_numeric(&n))
                }
                _ => false,
            };
            if done {
                continue;
            }
            let value = relation.decode_field(column, *wire, bytes, lsn)?;
            builder
                .append_keeping(Some(&value), row, &mut verbatim)
                .map_err(|e| {
                    e.with_context("table", &relation.name)
                        .with_context("lsn", lsn)
                })?;
        }
        row += 1;
        Ok::<(), Error>(())
    })?;
    let columns = builders
        .iter_mut()
        .map(ColumnBuilder::finish)
        .collect::<Result<_>>()?;
    Ok((columns, verbatim))
}
