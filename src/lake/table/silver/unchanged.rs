//! Unchanged TOAST values: a change that left a value out is filled from
//! the row silver holds for its key (the open batch, then the table).

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::{Pending, SilverTable, lake_error};
use crate::cdc::event::{Change, Datum};
use crate::cdc::value::Value;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::files::align::align;
use crate::lake::files::arrow::{arrow_value, verbatim_entries};
use crate::lake::files::writer::read_row_group;
use crate::lake::schema::VERBATIM;

impl SilverTable {
    /// Replaces the unchanged TOAST values of an update's after image with
    /// the row's current values: from a complete before image (REPLICA
    /// IDENTITY FULL), else from the open batch or the row's data file. A
    /// value that cannot be found is an error, never a guess. Call before
    /// [`Self::stage`], and before the change goes to bronze too.
    pub async fn fill_unchanged(&mut self, lake: &Lake, change: &mut Change) -> Result<()> {
        change.fill_unchanged_from_before_image();
        let Some(after) = &change.after else {
            return Ok(());
        };
        let missing: Vec<usize> = after
            .iter()
            .enumerate()
            .filter(|(_, d)| matches!(d, Datum::UnchangedToast))
            .map(|(i, _)| i)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        // The row as it was: under its old key when the update moved it.
        let key = match &change.before {
            Some(before) => self.key_of(change, &before.row)?,
            None => self.key_of(change, after)?,
        };
        for column in missing {
            let value = self.current_value(lake, change, &key, column).await?;
            if let Some(after) = change.after.as_mut() {
                after[column] = Datum::Value(value);
            }
        }
        Ok(())
    }

    pub(super) async fn current_value(
        &mut self,
        lake: &Lake,
        change: &Change,
        key: &[u8],
        column: usize,
    ) -> Result<Value> {
        let name = &change.relation.columns[column].name;
        match self.pending.get(key) {
            Some(Pending::Upsert(previous)) => {
                return match previous
                    .column(name)
                    .and_then(|j| previous.after.as_ref()?.get(j))
                {
                    Some(Datum::Value(v)) => Ok(v.clone()),
                    _ => Err(change.unfilled(name)),
                };
            }
            Some(Pending::Delete) => return Err(change.unfilled(name)),
            None => {}
        }
        let Some((file, pos)) = self.index.get(key)? else {
            return Err(change.unfilled(name));
        };
        let pos = usize::try_from(pos).unwrap_or(usize::MAX);
        let (batches, mut row) = self.group_rows(lake, &file, pos).await?;
        for batch in batches {
            if row < batch.num_rows() {
                let Some(array) = batch.column_by_name(name) else {
                    return Err(change.unfilled(name));
                };
                let kept = batch
                    .column_by_name(VERBATIM)
                    .map(|v| verbatim_entries(v.as_ref(), row))
                    .unwrap_or_default()
                    .into_iter()
                    .find(|(column, _)| column == name);
                return match kept {
                    Some((_, text)) => Ok(Value::Unknown(text)),
                    None => {
                        arrow_value(array.as_ref(), row).map_err(|e| e.with_context("file", &file))
                    }
                };
            }
            row -= batch.num_rows();
        }
        Err(lake_error(
            "the key index points past the end of a data file",
            &self.ident,
        )
        .with_context("file", &file))
    }

    /// The rows of the row group that holds row `pos` of a data file, in
    /// the table's schema, and `pos` within them: read once and kept while
    /// the same group is asked for again, so a fill reads a row group,
    /// never a whole file.
    pub(super) async fn group_rows(
        &mut self,
        lake: &Lake,
        path: &Arc<str>,
        pos: usize,
    ) -> Result<(&[RecordBatch], usize)> {
        let held = self
            .cached_group
            .as_ref()
            .is_some_and(|(p, first, batches)| {
                let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
                p == path && (*first..first + rows).contains(&pos)
            });
        if !held {
            self.cached_group = None;
            let table = self.table(lake).await?;
            let (first, batches) = read_row_group(&table, path, pos).await?;
            let batches = batches
                .iter()
                .map(|batch| align(batch, &self.schema, path))
                .collect::<Result<Vec<_>>>()?;
            self.cached_group = Some((path.clone(), first, batches));
        }
        Ok(self
            .cached_group
            .as_ref()
            .map_or((&[], 0), |(_, first, b)| (b.as_slice(), pos - first)))
    }
}

/// The value of column `name`, at position `at` of the change's relation,
/// in its after image; null when the relation no longer has the column.
pub(super) fn after_cell<'a>(
    change: &'a Change,
    at: Option<usize>,
    name: &str,
) -> Result<Option<&'a Value>> {
    let Some(j) = at else {
        return Ok(None);
    };
    match change.after.as_ref().and_then(|row| row.get(j)) {
        None | Some(Datum::NotSent | Datum::Value(Value::Null)) => Ok(None),
        Some(Datum::Value(v)) => Ok(Some(v)),
        Some(Datum::UnchangedToast) => Err(change.unfilled(name)),
    }
}

pub(super) fn missing_image(change: &Change) -> Error {
    Error::new(
        ErrorKind::Protocol,
        "a change lacks the row image its kind needs",
    )
    .with_context("table", &change.relation.name)
    .with_context("lsn", change.lsn)
}
