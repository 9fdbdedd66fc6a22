//! Changes bronze takes alone. When silver was loaded again from a newer
//! snapshot than bronze's position (silver lost while bronze held changes
//! after its load), the stream replays the changes in between to bronze
//! only: silver already holds their outcome, as rows of a later time, so
//! it cannot fill their unchanged TOAST values. [`Gap`] fills them from the
//! gap's own earlier change of the row, or else from bronze's newest row of
//! its key, which is the row as it was when the gap began. Exact, and slow
//! where it reads bronze: each value not changed earlier in the gap reads
//! bronze's key columns whole, and its value columns where the newest
//! change of the row is.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{BooleanArray, RecordBatch};
use arrow_schema::{Field, FieldRef};
use arrow_select::filter::filter_record_batch;
use futures_util::TryStreamExt;
use iceberg::expr::Reference;
use iceberg::spec::Datum as IcebergDatum;

use crate::cdc::event::{Change, Datum, Op};
use crate::cdc::relation::{ColumnInfo, RelationInfo};
use crate::cdc::value::Value;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::files::arrow::{arrow_value, verbatim_entries};
use crate::lake::files::scan::{scan, scan_where};
use crate::lake::schema::{COMMIT_LSN, OP, SEQ, VERBATIM, column_names, source_arrow_fields};
use crate::lake::table::bronze::BronzeTable;
use crate::lake::table::key::{Key, KeyCodec};

/// The changes of one table that bronze took alone so far in a run.
#[derive(Default)]
pub(crate) struct Gap {
    /// Each key the gap changed: its newest change, `None` once deleted.
    newest: HashMap<Key, Option<Arc<Change>>>,
    /// A truncate in the gap: no row from before it is left.
    truncated: bool,
    /// How the gap's changes are told apart, from the newest of them.
    key: Option<GapKey>,
}

impl Gap {
    /// Replaces the unchanged TOAST values of `change`, bound for bronze
    /// alone, with the row's values at that point; one that cannot be
    /// found is an error, never a guess.
    pub(crate) async fn fill_unchanged(
        &mut self,
        lake: &Lake,
        bronze: &BronzeTable,
        change: &mut Change,
    ) -> Result<()> {
        change.fill_unchanged_from_before_image();
        let Some(after) = &change.after else {
            return Ok(());
        };
        let missing: Vec<String> = after
            .iter()
            .zip(&change.relation.columns)
            .filter(|(d, _)| matches!(d, Datum::UnchangedToast))
            .map(|(_, c)| c.name.clone())
            .collect();
        let Some(first) = missing.first() else {
            return Ok(());
        };
        // The row as it was: under its old key when the update moved it.
        let image = change.before.as_ref().map_or(after, |b| &b.row);
        let key_of = self.key_for(&change.relation)?;
        let key = key_of.key(change, image)?;
        let values = match self.newest.get(&key) {
            Some(Some(previous)) => missing
                .iter()
                .map(|name| {
                    let column = change.column(name).map(|j| &change.relation.columns[j])?;
                    match previous
                        .column_like(column)
                        .and_then(|j| previous.after.as_ref()?.get(j))
                    {
                        Some(Datum::Value(v)) => Some(v.clone()),
                        _ => None,
                    }
                })
                .collect(),
            Some(None) => None,
            None if self.truncated => None,
            None => {
                tracing::info!(
                    table = %change.relation.name, lsn = %change.lsn,
                    "reading bronze's history for an unchanged TOAST value that silver, loaded at a later point, cannot give"
                );
                let key_of = self.key.as_ref().expect("key_for just set it");
                newest_values(lake, bronze, &key_of.names, &key_of.codec, &key, &missing).await?
            }
        };
        let values = values.ok_or_else(|| change.unfilled(first))?;
        let after = change.after.as_mut().expect("checked above");
        for (name, value) in missing.iter().zip(values) {
            if let Some(j) = change.relation.columns.iter().position(|c| &c.name == name) {
                after[j] = Datum::Value(value);
            }
        }
        Ok(())
    }

    /// Remembers `change`, which bronze took alone, for the gap's later
    /// changes of the same row.
    pub(crate) fn record(&mut self, change: &Arc<Change>) -> Result<()> {
        match change.op {
            Op::Truncate => {
                self.newest.clear();
                self.truncated = true;
            }
            Op::Delete => {
                if let Some(before) = &change.before {
                    let old = self.key_for(&change.relation)?.key(change, &before.row)?;
                    self.newest.insert(old, None);
                }
            }
            Op::Read | Op::Insert | Op::Update => {
                let Some(after) = &change.after else {
                    return Ok(());
                };
                let key_of = self.key_for(&change.relation)?;
                let key = key_of.key(change, after)?;
                let old = match &change.before {
                    Some(before) => Some(key_of.key(change, &before.row)?),
                    None => None,
                };
                if let Some(old) = old.filter(|old| *old != key) {
                    self.newest.insert(old, None);
                }
                self.newest.insert(key, Some(change.clone()));
            }
        }
        Ok(())
    }

    /// The key of `relation`'s changes. A relation keyed otherwise than
    /// the one before (its key changed within the gap, or a key column was
    /// retyped) keys the rows remembered so far anew, each from its newest
    /// change; a deleted row is forgotten, as no later change can update
    /// it before inserting it again.
    fn key_for(&mut self, relation: &Arc<RelationInfo>) -> Result<&GapKey> {
        if !self
            .key
            .as_ref()
            .is_some_and(|k| Arc::ptr_eq(&k.relation, relation))
        {
            let next = GapKey::of(relation)?;
            if self.key.as_ref().is_some_and(|k| !k.same_as(&next)) {
                let newest = std::mem::take(&mut self.newest);
                for change in newest.into_values().flatten() {
                    if let Some(key) = next.key_like(&change) {
                        self.newest.insert(key, Some(change));
                    }
                }
            }
            self.key = Some(next);
        }
        Ok(self.key.as_ref().expect("set above"))
    }
}

/// How the gap tells a relation's rows apart: by the columns of its replica
/// identity as the server sent them with the change (DEFAULT: the primary
/// key at that point of the stream; an index), else by its primary key.
/// Not by silver's key: silver, loaded at a later point, may be keyed by
/// columns the gap's changes do not have yet.
struct GapKey {
    relation: Arc<RelationInfo>,
    names: Vec<String>,
    fields: Vec<FieldRef>,
    codec: KeyCodec,
}

impl GapKey {
    fn of(relation: &Arc<RelationInfo>) -> Result<GapKey> {
        let by_identity = matches!(relation.replica_identity, b'd' | b'i')
            && relation.columns.iter().any(|c| c.is_identity_key);
        let keyed = |c: &ColumnInfo| {
            if by_identity {
                c.is_identity_key
            } else {
                c.is_primary_key
            }
        };
        let (names, fields): (Vec<String>, Vec<FieldRef>) = relation
            .columns
            .iter()
            .zip(source_arrow_fields(relation)?)
            .filter(|(c, _)| keyed(c))
            .map(|(c, f)| (c.name.clone(), f))
            .unzip();
        if names.is_empty() {
            return Err(Error::new(
                ErrorKind::Decode,
                "a change bronze takes alone has no key to tell its row by",
            )
            .with_context("table", &relation.name));
        }
        let codec = KeyCodec::new(&fields.iter().map(AsRef::as_ref).collect::<Vec<_>>())
            .map_err(|e| e.with_context("table", &relation.name))?;
        Ok(GapKey {
            relation: relation.clone(),
            names,
            fields,
            codec,
        })
    }

    /// Whether keys of `other` are keys of this one.
    fn same_as(&self, other: &GapKey) -> bool {
        self.names == other.names && self.fields == other.fields
    }

    /// The key of a row image of `change`.
    fn key(&self, change: &Change, row: &[Datum]) -> Result<Key> {
        let values = self
            .names
            .iter()
            .map(|name| match change.column(name).and_then(|j| row.get(j)) {
                Some(Datum::Value(v)) => Ok(v),
                _ => Err(Error::new(ErrorKind::Decode, "a change lacks its key")
                    .with_context("table", &change.relation.name)
                    .with_context("column", name)
                    .with_context("lsn", change.lsn)),
            })
            .collect::<Result<Vec<_>>>()?;
        let fields: Vec<&Field> = self.fields.iter().map(AsRef::as_ref).collect();
        self.codec.encode_values(&fields, &values).map_err(|e| {
            e.with_context("table", &change.relation.name)
                .with_context("lsn", change.lsn)
        })
    }

    /// The key of an earlier change's row under this key, its columns
    /// found by number where renamed since; `None` when it lacks one.
    fn key_like(&self, change: &Change) -> Option<Key> {
        let after = change.after.as_ref()?;
        let values = self
            .relation
            .columns
            .iter()
            .filter(|c| self.names.contains(&c.name))
            .map(|c| match change.column_like(c).and_then(|j| after.get(j)) {
                Some(Datum::Value(v)) => Some(v),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        let fields: Vec<&Field> = self.fields.iter().map(AsRef::as_ref).collect();
        self.codec.encode_values(&fields, &values).ok()
    }
}

/// The values of the columns `wanted` in bronze's newest row of `key`
/// (encoded by `codec` over the columns `key_names`), or `None` when that
/// row's newest change deleted it, a truncate came after it, or bronze has
/// none. Two reads: the key columns of every row find the newest change's
/// place, and the wanted columns (TOAST values, large) are read only where
/// the files' statistics of that place allow.
async fn newest_values(
    lake: &Lake,
    bronze: &BronzeTable,
    key_names: &[String],
    codec: &KeyCodec,
    key: &[u8],
    wanted: &[String],
) -> Result<Option<Vec<Value>>> {
    let table = bronze.table(lake).await?;
    let unreadable = || {
        Error::new(ErrorKind::Lake, "cannot read bronze's history of a row")
            .with_context("table", bronze.ident())
    };
    let with_keys = |first: &[&str], more: &[String]| {
        let mut columns: Vec<String> = first.iter().map(|c| (*c).to_owned()).collect();
        for name in key_names.iter().chain(more) {
            if !columns.contains(name) {
                columns.push(name.clone());
            }
        }
        columns
    };
    // The newest truncate, and the key's newest change.
    let mut truncated = (i64::MIN, i64::MIN);
    let mut newest: Option<(Place, bool)> = None;
    let columns = with_keys(&[OP, COMMIT_LSN, SEQ], &[]);
    let mut rows = std::pin::pin!(scan(&table, None, &columns).await?);
    while let Some(batch) = rows.try_next().await? {
        let ops = batch
            .column_by_name(OP)
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(unreadable)?;
        let keyed = BooleanArray::from_iter(ops.iter().map(|op| Some(op != Some("t"))));
        for row in (0..batch.num_rows()).filter(|&i| !keyed.value(i)) {
            truncated = truncated.max(position(&batch, row).ok_or_else(unreadable)?);
        }
        let batch = filter_record_batch(&batch, &keyed).map_err(|e| unreadable().with_source(e))?;
        let ops = batch
            .column_by_name(OP)
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(unreadable)?;
        for row in matching(&batch, key_names, codec, key)? {
            let at = position(&batch, row).ok_or_else(unreadable)?;
            if newest.is_none_or(|(n, _)| at > n) {
                newest = Some((at, ops.value(row) == Op::Delete.code()));
            }
        }
    }
    let Some((at, false)) = newest.filter(|(at, _)| *at > truncated) else {
        return Ok(None);
    };
    let mut columns = with_keys(&[COMMIT_LSN, SEQ], wanted);
    if column_names(&table).iter().any(|c| c == VERBATIM) {
        columns.push(VERBATIM.into());
    }
    let place = Reference::new(COMMIT_LSN)
        .equal_to(IcebergDatum::long(at.0))
        .and(Reference::new(SEQ).equal_to(IcebergDatum::long(at.1)));
    let mut rows = std::pin::pin!(scan_where(&table, None, &columns, Some(place)).await?);
    while let Some(batch) = rows.try_next().await? {
        for row in matching(&batch, key_names, codec, key)? {
            if position(&batch, row) == Some(at) {
                return row_values(&batch, row, wanted).map(Some);
            }
        }
    }
    Err(unreadable()
        .with_context("commit_lsn", at.0)
        .with_context("seq", at.1))
}

/// The rows of `batch` whose key is `key`.
fn matching(
    batch: &RecordBatch,
    key_names: &[String],
    codec: &KeyCodec,
    key: &[u8],
) -> Result<Vec<usize>> {
    let key_columns = key_names
        .iter()
        .map(|name| {
            batch.column_by_name(name).cloned().ok_or_else(|| {
                Error::new(ErrorKind::Lake, "bronze lacks a column of its table")
                    .with_context("column", name)
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let keys = codec.encode_columns(&key_columns)?;
    Ok(keys
        .iter()
        .enumerate()
        .filter(|(_, k)| k.as_slice() == key)
        .map(|(row, _)| row)
        .collect())
}

/// A bronze row's place in the stream: (commit LSN, seq).
type Place = (i64, i64);

fn position(batch: &RecordBatch, row: usize) -> Option<Place> {
    let long = |name| {
        batch
            .column_by_name(name)?
            .as_primitive_opt::<Int64Type>()
            .map(|a| a.value(row))
    };
    Some((long(COMMIT_LSN)?, long(SEQ)?))
}

/// The values of `names` in a bronze row, those kept verbatim as their text.
fn row_values(batch: &RecordBatch, row: usize, names: &[String]) -> Result<Vec<Value>> {
    let verbatim = batch
        .column_by_name(VERBATIM)
        .map(|v| verbatim_entries(v.as_ref(), row))
        .unwrap_or_default();
    names
        .iter()
        .map(|name| {
            if let Some((_, text)) = verbatim.iter().find(|(c, _)| c == name) {
                return Ok(Value::Unknown(text.clone()));
            }
            let array = batch.column_by_name(name).ok_or_else(|| {
                Error::new(ErrorKind::Lake, "bronze lacks a column of its table")
                    .with_context("column", name)
            })?;
            arrow_value(array.as_ref(), row)
        })
        .collect()
}
