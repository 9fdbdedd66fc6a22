//! Bronze replayed to a source position: the lake's state there.

use std::collections::HashMap;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, BooleanArray, RecordBatch};
use futures_util::TryStreamExt;
use iceberg::table::Table;

use super::{Shape, kept_entries, renamed_since};
use crate::error::{Error, ErrorKind, Result};
use crate::lake::files::align::align;
use crate::lake::files::scan::scan;
use crate::lake::schema::{VERBATIM, column_names};
use crate::lake::table::key::Key;
use crate::model::Lsn;

/// The order of bronze's changes: by commit, a load before the
/// transactions streamed at its own consistent point, then by sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Order {
    commit_lsn: i64,
    streamed: bool,
    seq: i64,
}

/// The commit LSN of bronze's newest load (initial or resync, whose reads
/// come in transaction 0) at or before `to`: its reads are the whole table
/// then, so nothing before it counts, and rows before a key's retype,
/// which lack that key, are never read. (An attached partition's rows are
/// reads too, of the attaching transaction, and of one partition only.)
///
/// A load after `to` is a concurrent error: a resync or a load beside the
/// stream read the table after `to`, so bronze may not hold the table as
/// it was at `to` (a column added with a default reaches bronze's rows
/// with the reload only), and the comparison is made again from a newer
/// snapshot.
async fn newest_load(bronze: &Table, to: i64) -> Result<i64> {
    let select = ["_cdc_commit_lsn", "_cdc_op", "_cdc_xid"].map(String::from);
    let mut batches = scan(bronze, None, &select).await?;
    let mut newest = i64::MIN;
    let mut later = None;
    while let Some(batch) = batches.try_next().await? {
        let (Some(lsn), Some(op), Some(xid)) = (
            batch
                .column_by_name("_cdc_commit_lsn")
                .and_then(|c| c.as_primitive_opt::<Int64Type>()),
            batch
                .column_by_name("_cdc_op")
                .and_then(|c| c.as_string_opt::<i32>()),
            batch
                .column_by_name("_cdc_xid")
                .and_then(|c| c.as_primitive_opt::<Int64Type>()),
        ) else {
            return Err(
                Error::new(ErrorKind::Lake, "a bronze column is not of bronze's type")
                    .with_context("table", bronze.identifier()),
            );
        };
        for i in 0..batch.num_rows() {
            if op.value(i) == "r" && xid.value(i) == 0 {
                if lsn.value(i) <= to {
                    newest = newest.max(lsn.value(i));
                } else {
                    later = later.max(Some(lsn.value(i)));
                }
            }
        }
    }
    match later {
        Some(lsn) => Err(Error::new(
            ErrorKind::Concurrent,
            "bronze holds a load read after the position verified (a resync or a table's \
             load finished meanwhile): verifying again from a new snapshot",
        )
        .with_context("table", bronze.identifier())
        .with_context("position", Lsn(to as u64))
        .with_context("load", Lsn(lsn as u64))),
        None => Ok(newest),
    }
}

/// Bronze's state at `to`: each live key's row hash.
///
/// A change is in it when its transaction committed before `to` (a load's
/// rows, committed at their consistent point, when that is `to` itself):
/// exactly what a snapshot exported at `to` sees, and what a table whose
/// position ends at `to` holds (see [`crate::lake::files::writer::Position`]).
pub(super) async fn replay(bronze: &Table, shape: &Shape, to: Lsn) -> Result<HashMap<Key, u64>> {
    let ident = bronze.identifier().to_string();
    let renamed = renamed_since(bronze);
    let names = column_names(bronze);
    let mut select: Vec<String> = ["_cdc_commit_lsn", "_cdc_seq", "_cdc_op", "_cdc_before"]
        .map(String::from)
        .to_vec();
    select.extend(
        shape
            .columns()
            .into_iter()
            .chain([VERBATIM.to_owned()])
            .filter(|c| names.contains(c)),
    );
    let mut latest: HashMap<Key, (Order, Option<u64>)> = HashMap::new();
    let mut truncated: Option<Order> = None;
    let to = to.0 as i64;
    let since = newest_load(bronze, to).await?;
    let mut batches = scan(bronze, None, &select).await?;
    while let Some(batch) = batches.try_next().await? {
        let malformed = || {
            Error::new(ErrorKind::Lake, "a bronze column is not of bronze's type")
                .with_context("table", &ident)
        };
        let long = |name: &str| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
                .ok_or_else(malformed)
        };
        let (commit_lsn, seq) = (long("_cdc_commit_lsn")?, long("_cdc_seq")?);
        let op = batch
            .column_by_name("_cdc_op")
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(malformed)?;
        let orders: Vec<Option<(Order, &str)>> = (0..batch.num_rows())
            .map(|i| {
                let (lsn, op) = (commit_lsn.value(i), op.value(i));
                let load = op == "r";
                (lsn >= since && (lsn < to || load && lsn == to)).then_some((
                    Order {
                        commit_lsn: lsn,
                        streamed: !load,
                        seq: seq.value(i),
                    },
                    op,
                ))
            })
            .collect();
        for (order, op) in orders.iter().flatten() {
            if *op == "t" {
                truncated = truncated.max(Some(*order));
            }
        }
        // Row changes only: a truncate's row has no key.
        let rows_mask = BooleanArray::from(
            orders
                .iter()
                .map(|o| o.is_some_and(|(_, op)| op != "t"))
                .collect::<Vec<_>>(),
        );
        let picked = arrow_select::filter::filter_record_batch(&batch, &rows_mask)
            .map_err(|e| malformed().with_source(e))?;
        let picked_orders: Vec<(Order, &str)> = orders
            .iter()
            .flatten()
            .filter(|(_, op)| *op != "t")
            .copied()
            .collect();
        let kept = picked.column_by_name(VERBATIM).cloned();
        let image = align(&picked, &shape.schema, &ident)?;
        let hashed = shape.hash(&image, |row| kept_entries(kept.as_ref(), row, &renamed))?;
        let old_keys = old_keys(&picked, shape, &picked_orders, &ident)?;
        let mut put = |key: Key, order: Order, hash: Option<u64>| {
            let entry = latest.entry(key).or_insert((order, hash));
            if order >= entry.0 {
                *entry = (order, hash);
            }
        };
        for (((order, op), (key, hash)), old) in picked_orders.iter().zip(hashed).zip(old_keys) {
            if let Some(old) = old.filter(|old| *old != key) {
                put(old, *order, None);
            }
            put(key, *order, (*op != "d").then_some(hash));
        }
    }
    Ok(latest
        .into_iter()
        .filter(|(_, (order, _))| truncated.is_none_or(|t| *order > t))
        .filter_map(|(key, (_, hash))| hash.map(|h| (key, h)))
        .collect())
}

/// The key before an update, where bronze's before image holds one.
fn old_keys(
    batch: &RecordBatch,
    shape: &Shape,
    orders: &[(Order, &str)],
    ident: &str,
) -> Result<Vec<Option<Key>>> {
    let mut old = vec![None; batch.num_rows()];
    let Some(before) = batch
        .column_by_name("_cdc_before")
        .and_then(|c| c.as_struct_opt())
    else {
        return Ok(old);
    };
    let with_before: Vec<usize> = (0..batch.num_rows())
        .filter(|&i| orders[i].1 == "u" && before.is_valid(i))
        .collect();
    if with_before.is_empty() {
        return Ok(old);
    }
    let indices = arrow_array::UInt32Array::from_iter_values(with_before.iter().map(|&i| i as u32));
    let columns = shape
        .key_fields()
        .iter()
        .map(|f| {
            let column = before.column_by_name(f.name()).ok_or_else(|| {
                Error::new(ErrorKind::Lake, "bronze's before image lacks a key column")
                    .with_context("table", ident)
                    .with_context("column", f.name())
            })?;
            arrow_select::take::take(column, &indices, None)
                .and_then(|c| arrow_cast::cast(&c, f.data_type()))
                .map_err(|e| {
                    Error::new(ErrorKind::Lake, "cannot read bronze's before image")
                        .with_context("table", ident)
                        .with_source(e)
                })
        })
        .collect::<Result<Vec<_>>>()?;
    for (i, key) in with_before.into_iter().zip(shape.keys(&columns)?) {
        old[i] = Some(key);
    }
    Ok(old)
}
