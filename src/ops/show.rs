//! Reading a lake table back through our own reader (iceberg-rust's scan)
//! and printing it as a text table, as the seed's show.py does.

use arrow_array::RecordBatch;
use arrow_ord::sort::{SortColumn, lexsort_to_indices};
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use futures_util::TryStreamExt;
use iceberg::TableIdent;

use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::{Lake, iceberg_error};
use crate::lake::writer::arrow_schema;

/// The table's current rows, `columns` only, sorted by `order_by`.
pub async fn table_text(
    lake: &Lake,
    ident: &TableIdent,
    columns: &[&str],
    order_by: &[&str],
) -> Result<String> {
    let context =
        |e: iceberg::Error| iceberg_error(e, "cannot scan the table").with_context("table", ident);
    let table = lake.catalog_table(ident).await?;
    let batches: Vec<RecordBatch> = table
        .scan()
        .select(columns.iter().copied())
        .build()
        .map_err(context)?
        .to_arrow()
        .await
        .map_err(context)?
        .try_collect()
        .await
        .map_err(context)?;
    let schema = match batches.first() {
        Some(b) => b.schema(),
        None => {
            let full = arrow_schema(&table)?;
            let projected = full
                .project(&indices_of(&full, columns)?)
                .map_err(|e| arrow_error(e, ident))?;
            std::sync::Arc::new(projected)
        }
    };
    let all = concat_batches(&schema, &batches).map_err(|e| arrow_error(e, ident))?;
    let sort: Vec<SortColumn> = order_by
        .iter()
        .map(|name| {
            all.column_by_name(name)
                .map(|values| SortColumn {
                    values: values.clone(),
                    options: None,
                })
                .ok_or_else(|| {
                    Error::new(ErrorKind::Config, format!("no column {name}"))
                        .with_context("table", ident)
                })
        })
        .collect::<Result<_>>()?;
    let sorted = if sort.is_empty() || all.num_rows() == 0 {
        all
    } else {
        let indices = lexsort_to_indices(&sort, None).map_err(|e| arrow_error(e, ident))?;
        take_record_batch(&all, &indices).map_err(|e| arrow_error(e, ident))?
    };
    let text =
        arrow_cast::pretty::pretty_format_batches(&[sorted]).map_err(|e| arrow_error(e, ident))?;
    Ok(text.to_string())
}

fn indices_of(schema: &arrow_schema::Schema, columns: &[&str]) -> Result<Vec<usize>> {
    columns
        .iter()
        .map(|c| {
            schema
                .index_of(c)
                .map_err(|e| Error::new(ErrorKind::Config, format!("no column {c}")).with_source(e))
        })
        .collect()
}

fn arrow_error(e: arrow_schema::ArrowError, ident: &TableIdent) -> Error {
    Error::new(ErrorKind::Lake, "cannot prepare the table for printing")
        .with_context("table", ident)
        .with_source(e)
}
