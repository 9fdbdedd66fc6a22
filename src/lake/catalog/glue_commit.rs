//! Glue's side of a commit, as Iceberg's Java `GlueTableOperations`
//! makes it: the new metadata file is written (a completed PUT), then
//! `GetTable` must still point at the metadata the change was planned on,
//! and `UpdateTable` swaps the pointer under the `VersionId` that
//! `GetTable` gave, so Glue refuses it when another writer updated the
//! table in between (`ConcurrentModificationException`). Glue has no
//! transaction across tables. Also a table's creation, whose columns
//! Glue shows in Hive's types (`iceberg-catalog-glue` 0.10 cannot name a
//! `timestamptz`). Kept narrow so an upstream public `TableCommit` and a
//! fuller type mapping can replace it.

use aws_sdk_glue::error::SdkError;
use aws_sdk_glue::operation::get_table::GetTableError;
use aws_sdk_glue::operation::update_table::UpdateTableError;
use aws_sdk_glue::types::{Column, StorageDescriptor, Table as GlueTable, TableInput};
use iceberg::TableIdent;
use iceberg::spec::{PrimitiveType, Schema, TableMetadata, TableMetadataBuildResult, Type};
use iceberg::table::Table;

use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;
use crate::lake::catalog::commit::{delete_expired_metadata, write_next_metadata};

/// The parameters Glue keeps an Iceberg table's kind and pointer in.
const TABLE_TYPE: &str = "table_type";
const ICEBERG: &str = "ICEBERG";
const METADATA_LOCATION: &str = "metadata_location";
const PREVIOUS_METADATA_LOCATION: &str = "previous_metadata_location";

/// Glue's API, for what wal2iceberg does itself there.
#[derive(Clone)]
pub(crate) struct GlueCommits {
    pub(in crate::lake) client: aws_sdk_glue::Client,
    pub(in crate::lake) catalog_id: Option<String>,
}

impl GlueCommits {
    /// Commits `built`, planned on `table`: false when another commit got
    /// there first.
    pub(crate) async fn commit(
        &self,
        table: &Table,
        built: &TableMetadataBuildResult,
    ) -> Result<bool> {
        let ident = table.identifier();
        let (current, new_location) = write_next_metadata(table, built).await?;
        failpoint::hit("before-catalog-commit");
        if !self
            .swap(ident, current, &new_location, &built.metadata)
            .await?
        {
            return Ok(false);
        }
        delete_expired_metadata(table, built).await;
        Ok(true)
    }

    /// Glue's table `ident`.
    async fn get(&self, ident: &TableIdent) -> Result<GlueTable> {
        let found = self
            .client
            .get_table()
            .database_name(ident.namespace().join("."))
            .name(ident.name())
            .set_catalog_id(self.catalog_id.clone())
            .send()
            .await
            .map_err(|e| match e.into_service_error() {
                GetTableError::EntityNotFoundException(_) => vanished(ident),
                e => glue_error(ident, "cannot read the table from Glue", e),
            })?;
        found.table().cloned().ok_or_else(|| vanished(ident))
    }

    /// Points `ident` at `new_location` (holding `metadata`) if it still
    /// points at `base`: false when it does not, or when another writer
    /// updated it after it was read. A refusal or an error is checked
    /// against the table as Glue has it then, as Iceberg's Java catalog
    /// checks a commit's status: the SDK retries a call whose answer was
    /// lost, and Glue refuses the retry of an update that landed; a table
    /// pointing at `new_location` (a name no other commit has) took it. An
    /// outcome still unknown (a timeout, a 5xx) is an error: a restart
    /// reads where the table is.
    pub(in crate::lake) async fn swap(
        &self,
        ident: &TableIdent,
        base: String,
        new_location: &str,
        metadata: &TableMetadata,
    ) -> Result<bool> {
        let database = ident.namespace().join(".");
        let glue_table = self.get(ident).await?;
        let mut parameters = glue_table.parameters().cloned().unwrap_or_default();
        if parameters.get(METADATA_LOCATION) != Some(&base) {
            return Ok(false);
        }
        parameters.insert(TABLE_TYPE.to_owned(), ICEBERG.to_owned());
        parameters.insert(METADATA_LOCATION.to_owned(), new_location.to_owned());
        parameters.insert(PREVIOUS_METADATA_LOCATION.to_owned(), base);
        let input = table_input(
            ident,
            parameters,
            metadata,
            glue_table.description().map(str::to_owned),
            glue_table
                .storage_descriptor()
                .map(StorageDescriptor::columns),
        )?;
        let updated = self
            .client
            .update_table()
            .database_name(&database)
            .table_input(input)
            .set_version_id(glue_table.version_id().map(str::to_owned))
            .skip_archive(true)
            .set_catalog_id(self.catalog_id.clone())
            .send()
            .await;
        let refused = match updated.map_err(SdkError::into_service_error) {
            Ok(_) => return Ok(true),
            Err(e) => e,
        };
        let landed = self.get(ident).await.ok().is_some_and(|now| {
            now.parameters()
                .and_then(|p| p.get(METADATA_LOCATION))
                .map(String::as_str)
                == Some(new_location)
        });
        match refused {
            _ if landed => Ok(true),
            UpdateTableError::ConcurrentModificationException(_) => Ok(false),
            UpdateTableError::EntityNotFoundException(_) => Err(vanished(ident)),
            e => Err(glue_error(
                ident,
                "Glue did not take the commit, or its answer was lost: the outcome is unknown; \
                 a restart reads where the table is",
                e,
            )),
        }
    }

    /// Registers `ident` in Glue, pointing at `location` (holding
    /// `metadata`).
    pub(in crate::lake) async fn create(
        &self,
        ident: &TableIdent,
        location: &str,
        metadata: &TableMetadata,
    ) -> Result<()> {
        let parameters = [(TABLE_TYPE, ICEBERG), (METADATA_LOCATION, location)]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into();
        let input = table_input(ident, parameters, metadata, None, None)?;
        self.client
            .create_table()
            .database_name(ident.namespace().join("."))
            .table_input(input)
            .set_catalog_id(self.catalog_id.clone())
            .send()
            .await
            .map_err(|e| {
                glue_error(
                    ident,
                    "Glue did not take the new table",
                    e.into_service_error(),
                )
            })?;
        Ok(())
    }
}

/// Glue's description of a table at `metadata`; a column without a doc
/// keeps the comment Glue has for it in `kept` (another engine's).
fn table_input(
    ident: &TableIdent,
    parameters: std::collections::HashMap<String, String>,
    metadata: &TableMetadata,
    description: Option<String>,
    kept: Option<&[Column]>,
) -> Result<TableInput> {
    let kept = kept.unwrap_or_default();
    let mut columns = columns(metadata.current_schema());
    for column in columns.iter_mut().filter(|c| c.comment.is_none()) {
        column.comment = kept
            .iter()
            .find(|k| k.name == column.name)
            .and_then(|k| k.comment.clone());
    }
    let storage = StorageDescriptor::builder()
        .set_columns(Some(columns))
        .location(metadata.location())
        .build();
    TableInput::builder()
        .name(ident.name())
        .table_type("EXTERNAL_TABLE")
        .set_description(description)
        .set_parameters(Some(parameters))
        .storage_descriptor(storage)
        .build()
        .map_err(|e| glue_error(ident, "cannot describe the table to Glue", e))
}

fn vanished(ident: &TableIdent) -> Error {
    Error::new(ErrorKind::Lake, "the table vanished from the catalog").with_context("table", ident)
}

fn glue_error(
    ident: &TableIdent,
    message: &str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::new(ErrorKind::Lake, message)
        .with_context("table", ident)
        .with_source(e)
}

/// The columns Glue shows for a table (Athena's and the console's view;
/// engines read the schema from the metadata file), as Iceberg's Java
/// catalog names them: Hive's type names, the field's id and whether it
/// is optional in the column's parameters.
fn columns(schema: &Schema) -> Vec<Column> {
    schema
        .as_struct()
        .fields()
        .iter()
        .map(|field| {
            Column::builder()
                .name(&field.name)
                .r#type(hive_type(&field.field_type))
                .set_comment(field.doc.clone())
                .parameters("iceberg.field.id", field.id.to_string())
                .parameters("iceberg.field.optional", (!field.required).to_string())
                .parameters("iceberg.field.current", "true")
                .build()
                .expect("a column has its name")
        })
        .collect()
}

/// Hive's name of an Iceberg type.
fn hive_type(field_type: &Type) -> String {
    match field_type {
        Type::Primitive(p) => match p {
            PrimitiveType::Boolean => "boolean".to_owned(),
            PrimitiveType::Int => "int".to_owned(),
            PrimitiveType::Long => "bigint".to_owned(),
            PrimitiveType::Float => "float".to_owned(),
            PrimitiveType::Double => "double".to_owned(),
            PrimitiveType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            PrimitiveType::Date => "date".to_owned(),
            PrimitiveType::Timestamp
            | PrimitiveType::Timestamptz
            | PrimitiveType::TimestampNs
            | PrimitiveType::TimestamptzNs => "timestamp".to_owned(),
            PrimitiveType::Time | PrimitiveType::String | PrimitiveType::Uuid => {
                "string".to_owned()
            }
            PrimitiveType::Binary | PrimitiveType::Fixed(_) => "binary".to_owned(),
        },
        Type::Struct(s) => format!(
            "struct<{}>",
            s.fields()
                .iter()
                .map(|f| format!("{}:{}", f.name, hive_type(&f.field_type)))
                .collect::<Vec<_>>()
                .join(",")
        ),
        Type::List(l) => format!("array<{}>", hive_type(&l.element_field.field_type)),
        Type::Map(m) => format!(
            "map<{},{}>",
            hive_type(&m.key_field.field_type),
            hive_type(&m.value_field.field_type)
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use iceberg::spec::{ListType, NestedField};

    use super::*;

    #[test]
    fn columns_carry_hive_types_ids_and_optionality() {
        let schema = Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::required(
                    1,
                    "id",
                    Type::Primitive(PrimitiveType::Long),
                )),
                Arc::new(NestedField::optional(
                    2,
                    "price",
                    Type::Primitive(PrimitiveType::Decimal {
                        precision: 12,
                        scale: 2,
                    }),
                )),
                Arc::new(NestedField::optional(
                    3,
                    "tags",
                    Type::List(ListType::new(Arc::new(NestedField::list_element(
                        4,
                        Type::Primitive(PrimitiveType::String),
                        false,
                    )))),
                )),
                Arc::new(NestedField::required(
                    5,
                    "_cdc_commit_ts",
                    Type::Primitive(PrimitiveType::Timestamptz),
                )),
            ])
            .build()
            .unwrap();
        let shown: Vec<_> = columns(&schema)
            .iter()
            .map(|c| {
                let p = c.parameters().unwrap();
                (
                    c.name().to_owned(),
                    c.r#type().unwrap().to_owned(),
                    p["iceberg.field.id"].clone(),
                    p["iceberg.field.optional"].clone(),
                )
            })
            .collect();
        let want = [
            ("id", "bigint", "1", "false"),
            ("price", "decimal(12,2)", "2", "true"),
            ("tags", "array<string>", "3", "true"),
            ("_cdc_commit_ts", "timestamp", "5", "false"),
        ]
        .map(|(a, b, c, d)| (a.into(), b.into(), c.into(), d.into()));
        assert_eq!(shown, want);
    }
}
