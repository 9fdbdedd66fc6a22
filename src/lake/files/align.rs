//! A file's rows in a table's current schema. A data file holds the
//! columns of the schema it was written under; since then a column may
//! have been added, dropped, renamed or promoted to a wider type. Each
//! column of the target is found in the file by its Iceberg field id
//! (`PARQUET:field_id`), so a renamed column keeps its values, and by name
//! where either side carries no ids (another writer's file, or a shape
//! that is not a table's, such as verify's); it is null where the file
//! lacks it and cast where its type is narrower. The same holds inside
//! struct columns (bronze's `_cdc_before`).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, StructArray, new_null_array};
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema as ArrowSchema};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

use crate::error::{Error, ErrorKind, Result};

/// `batch`, read from `path`, in `schema`.
pub(crate) fn align(
    batch: &RecordBatch,
    schema: &Arc<ArrowSchema>,
    path: &str,
) -> Result<RecordBatch> {
    let bad = |e: ArrowError| {
        Error::new(
            ErrorKind::Lake,
            "cannot read a data file in the table's schema",
        )
        .with_context("file", path)
        .with_source(e)
    };
    let columns = schema
        .fields()
        .iter()
        .map(|field| match find(batch.schema().fields(), field) {
            None => Ok(new_null_array(field.data_type(), batch.num_rows())),
            Some(i) => align_array(batch.column(i), field.data_type()),
        })
        .collect::<std::result::Result<Vec<ArrayRef>, _>>()
        .map_err(bad)?;
    RecordBatch::try_new(schema.clone(), columns).map_err(bad)
}

/// The Iceberg field id an Arrow field carries.
pub(crate) fn field_id(field: &Field) -> Option<i32> {
    field
        .metadata()
        .get(PARQUET_FIELD_ID_META_KEY)?
        .parse()
        .ok()
}

/// The index among `fields` of the one that holds `target`'s values.
pub(crate) fn find(fields: &Fields, target: &Field) -> Option<usize> {
    let by_id = field_id(target).filter(|_| fields.iter().any(|f| field_id(f).is_some()));
    match by_id {
        Some(id) => fields.iter().position(|f| field_id(f) == Some(id)),
        None => fields.iter().position(|f| f.name() == target.name()),
    }
}

fn align_array(array: &ArrayRef, to: &DataType) -> std::result::Result<ArrayRef, ArrowError> {
    match (array.data_type(), to) {
        (from, to) if from == to => Ok(array.clone()),
        (DataType::Struct(from), DataType::Struct(fields)) => {
            let source = array.as_struct();
            let children = fields
                .iter()
                .map(|f| match find(from, f) {
                    None => Ok(new_null_array(f.data_type(), array.len())),
                    Some(i) => align_array(source.column(i), f.data_type()),
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok(Arc::new(StructArray::try_new(
                fields.clone(),
                children,
                source.nulls().cloned(),
            )?))
        }
        _ => arrow_cast::cast(array, to),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow_array::{Decimal128Array, Int32Array, StringArray};

    use super::*;

    fn with_id(field: Field, id: i32) -> Field {
        field.with_metadata(HashMap::from([(
            PARQUET_FIELD_ID_META_KEY.to_owned(),
            id.to_string(),
        )]))
    }

    #[test]
    fn an_older_file_gains_the_columns_added_since_inside_structs_too() {
        let old_inner = Fields::from(vec![Field::new("plan", DataType::Utf8, true)]);
        let new_inner = Fields::from(vec![
            Field::new("plan", DataType::Utf8, true),
            Field::new("rating", DataType::Int32, true),
        ]);
        let before: ArrayRef = Arc::new(
            StructArray::try_new(
                old_inner.clone(),
                vec![Arc::new(StringArray::from(vec![Some("free"), None]))],
                Some(vec![true, false].into()),
            )
            .unwrap(),
        );
        let old = Arc::new(ArrowSchema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("before", DataType::Struct(old_inner), true),
        ]));
        let batch = RecordBatch::try_new(old, vec![Arc::new(Int32Array::from(vec![1, 2])), before])
            .unwrap();
        let new = Arc::new(ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("before", DataType::Struct(new_inner), true),
            Field::new("rating", DataType::Int32, true),
        ]));
        let aligned = align(&batch, &new, "f").unwrap();
        assert_eq!(aligned.schema(), new);
        let before = aligned.column(1).as_struct();
        assert_eq!(before.column(0).as_string::<i32>().value(0), "free");
        assert_eq!(before.column(1).null_count(), 2, "rating is null inside");
        assert!(before.is_null(1), "a null before image stays null");
        assert_eq!(aligned.column(2).null_count(), 2);
    }

    #[test]
    fn a_renamed_and_promoted_column_is_found_by_its_field_id() {
        let old = Arc::new(ArrowSchema::new(vec![
            with_id(Field::new("id", DataType::Int32, false), 1),
            with_id(Field::new("customer", DataType::Utf8, true), 2),
            with_id(Field::new("price", DataType::Decimal128(10, 2), true), 3),
        ]));
        let batch = RecordBatch::try_new(
            old,
            vec![
                Arc::new(Int32Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("ann"), None])),
                Arc::new(
                    Decimal128Array::from(vec![Some(1050), Some(7)])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
            ],
        )
        .unwrap();
        // `customer` renamed `customer_name`; a new column took the name
        // `customer`; `price` widened; `id` promoted to a long.
        let new = Arc::new(ArrowSchema::new(vec![
            with_id(Field::new("id", DataType::Int64, false), 1),
            with_id(Field::new("customer", DataType::Utf8, true), 4),
            with_id(Field::new("customer_name", DataType::Utf8, true), 2),
            with_id(Field::new("price", DataType::Decimal128(12, 2), true), 3),
        ]));
        let aligned = align(&batch, &new, "f").unwrap();
        assert_eq!(aligned.schema(), new);
        assert_eq!(aligned.column(1).null_count(), 2, "the new column is null");
        let renamed = aligned.column(2).as_string::<i32>();
        assert_eq!(renamed.value(0), "ann");
        assert!(renamed.is_null(1));
        let price = aligned
            .column(3)
            .as_primitive::<arrow_array::types::Decimal128Type>();
        assert_eq!(price.value(0), 1050);
        assert_eq!(
            aligned
                .column(0)
                .as_primitive::<arrow_array::types::Int64Type>()
                .value(1),
            2
        );
    }
}
