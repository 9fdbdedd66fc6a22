//! Schema changes staged with a batch, committed in the same snapshot as
//! the rows written under them.
//!
//! A schema change committed on its own, ahead of the batch whose changes
//! brought it, would leave a crash window: the stream then replays the
//! changes before it, with the columns as they were, against a table that
//! no longer has them (a renamed column would come back under its old
//! name). Staged here instead, the change is part of the batch: every
//! write of the open batch sees the table as it will be ([`Self::over`]),
//! and its commit applies the updates ahead of the snapshot
//! ([`Self::apply`]), or nothing lands at all.
//!
//! The updates are Iceberg's own `TableUpdate`s, checked against the
//! table they were planned on as a REST catalog checks a commit's
//! requirements, so that this can move to upstream's transactions.

use iceberg::spec::TableMetadataBuilder;
use iceberg::table::Table;
use iceberg::{Runtime, TableIdent, TableRequirement, TableUpdate};

use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::lake::iceberg_error;

/// The schema updates of a table's open batch, in the order planned.
#[derive(Debug, Default, Clone)]
pub struct StagedSchema {
    updates: Vec<TableUpdate>,
    /// The schema and highest field id the first update was planned on:
    /// a commit on a table another writer evolved since is refused.
    requirements: Vec<TableRequirement>,
}

impl StagedSchema {
    pub(crate) fn is_empty(&self) -> bool {
        self.updates.is_empty()
    }

    /// Whether a staged update changes the schema (not only properties).
    pub(crate) fn changes_schema(&self) -> bool {
        self.updates
            .iter()
            .any(|u| matches!(u, TableUpdate::AddSchema { .. }))
    }

    /// Adds `updates`, planned on `table` as this batch sees it.
    pub(crate) fn stage(&mut self, table: &Table, updates: Vec<TableUpdate>) {
        if updates.is_empty() {
            return;
        }
        if self.updates.is_empty() {
            let metadata = table.metadata();
            self.requirements = vec![
                TableRequirement::CurrentSchemaIdMatch {
                    current_schema_id: metadata.current_schema_id(),
                },
                TableRequirement::LastAssignedFieldIdMatch {
                    last_assigned_field_id: metadata.last_column_id(),
                },
            ];
        }
        self.updates.extend(updates);
    }

    /// The catalog's table as the open batch will commit it.
    pub(crate) async fn table(&self, lake: &Lake, ident: &TableIdent) -> Result<Table> {
        let base = lake.catalog_table(ident).await?;
        self.over(&base)
    }

    /// `base` with the staged updates; its metadata location stays
    /// `base`'s, the one a commit swaps from.
    pub(crate) fn over(&self, base: &Table) -> Result<Table> {
        if self.is_empty() {
            return Ok(base.clone());
        }
        let context = |e: iceberg::Error| {
            iceberg_error(e, "cannot stage the table's schema change")
                .with_context("table", base.identifier())
        };
        let metadata = self
            .apply(base, base.metadata().clone().into_builder(None))?
            .build()
            .map_err(context)?
            .metadata;
        let mut builder = Table::builder()
            .metadata(metadata)
            .identifier(base.identifier().clone())
            .file_io(base.file_io().clone())
            .runtime(Runtime::try_current().map_err(context)?);
        if let Some(location) = base.metadata_location() {
            builder = builder.metadata_location(location);
        }
        builder.build().map_err(context)
    }

    /// Applies the staged updates to `builder`, which builds on `base`.
    /// A `base` whose schema another writer changed after the updates were
    /// planned is a [`ErrorKind::Concurrent`] error: the batch is written
    /// again from the stream.
    pub(crate) fn apply(
        &self,
        base: &Table,
        mut builder: TableMetadataBuilder,
    ) -> Result<TableMetadataBuilder> {
        for requirement in &self.requirements {
            requirement.check(Some(base.metadata())).map_err(|e| {
                Error::new(
                    ErrorKind::Concurrent,
                    "another writer changed the table's schema under the open batch",
                )
                .with_context("table", base.identifier())
                .with_source(e)
            })?;
        }
        for update in &self.updates {
            builder = update.clone().apply(builder).map_err(|e| {
                iceberg_error(e, "cannot change the table's schema")
                    .with_context("table", base.identifier())
            })?;
        }
        Ok(builder)
    }
}
