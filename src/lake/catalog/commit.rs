//! How a planned change of table metadata lands in the catalog, for one
//! table or several at once. A SQL catalog: each new metadata file is
//! written, then the tables' pointers are swapped by compare-and-swap (an
//! UPDATE that only matches the location the change was planned on, as
//! `iceberg-catalog-sql` and Iceberg's JDBC catalog make it), several in
//! one database transaction, so they become visible together. A REST
//! catalog: the changes as a table update, several as one multi-table
//! transaction (`rest_commit`).

use std::str::FromStr;

use iceberg::spec::TableMetadataBuildResult;
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableIdent};
use sqlx::Row;

use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;
use crate::lake::catalog::db::CatalogDb;
use crate::lake::catalog::{Commits, Lake};
use crate::lake::{current_location, iceberg_error};

/// A change of a table's metadata, planned on `table` as it was loaded.
pub(crate) struct Planned {
    pub(crate) table: Table,
    pub(crate) built: TableMetadataBuildResult,
}

/// Commits `built`, planned on `table`: false when another commit got
/// there first.
pub async fn commit_metadata(
    lake: &Lake,
    table: &Table,
    built: TableMetadataBuildResult,
) -> Result<bool> {
    let planned = Planned {
        table: table.clone(),
        built,
    };
    commit_all(lake, vec![planned]).await
}

/// Commits every change of `planned` at once: all of them, or none and
/// false when another commit came first to any of their tables. In a SQL
/// catalog the metadata files that dropped out of a table's log
/// (`write.metadata.previous-versions-max`, 100 by default) are deleted
/// once it is current, so they do not pile up; a REST catalog writes and
/// keeps the metadata itself.
pub(crate) async fn commit_all(lake: &Lake, planned: Vec<Planned>) -> Result<bool> {
    let (pool, db, name) = match lake.commits() {
        Commits::Sql { pool, db, name } => (pool, db, name),
        Commits::Rest(rest) => {
            failpoint::hit("before-catalog-commit");
            let changes: Vec<_> = planned.iter().map(|p| (&p.table, &p.built)).collect();
            return rest.commit(&changes).await;
        }
        Commits::Glue(glue) => {
            let [Planned { table, built }] = planned.as_slice() else {
                return Err(Error::new(
                    ErrorKind::Lake,
                    "Glue commits one table at a time: a change of several is not atomic there",
                ));
            };
            return glue.commit(table, built).await;
        }
    };
    // The metadata files at once: on object storage each is a round trip.
    let swaps =
        crate::lake::each_table(planned.iter().map(|Planned { table, built }| async move {
            let (current, new_location) = write_next_metadata(table, built).await?;
            Ok::<_, Error>((table.identifier(), current, new_location))
        }))
        .await?;
    failpoint::hit("before-catalog-commit");
    if !swap_metadata_locations(pool, (db, name), &swaps).await? {
        return Ok(false);
    }
    for Planned { table, built } in &planned {
        delete_expired_metadata(table, built).await;
    }
    Ok(true)
}

/// Writes the metadata `built` plans for `table` as the table's next
/// metadata file: the table's current location, and the new one.
pub(crate) async fn write_next_metadata(
    table: &Table,
    built: &TableMetadataBuildResult,
) -> Result<(String, String)> {
    let context = |e: iceberg::Error| {
        iceberg_error(e, "cannot write the table metadata")
            .with_context("table", table.identifier())
    };
    let current = current_location(table)?;
    let new_location = MetadataLocation::from_str(&current)
        .map_err(context)?
        .with_next_version()
        .with_new_metadata(&built.metadata);
    built
        .metadata
        .write_to(table.file_io(), &new_location)
        .await
        .map_err(context)?;
    Ok((current, new_location.to_string()))
}

/// Deletes the metadata files that `built`, committed, dropped from
/// `table`'s log; one that cannot be deleted is left, and logged.
pub(crate) async fn delete_expired_metadata(table: &Table, built: &TableMetadataBuildResult) {
    for old in &built.expired_metadata_logs {
        if let Err(e) = table.file_io().delete(&old.metadata_file).await {
            tracing::warn!(table = %table.identifier(), file = %old.metadata_file, error = %e, "cannot delete an old metadata file");
        }
    }
}

/// The compare-and-swap of each `(table, expected, new)` pointer in the
/// SQL catalog `name`'s database, in one transaction: true when every new
/// metadata became current, false (and none did) when another commit got
/// to one of them first.
async fn swap_metadata_locations(
    pool: &sqlx::AnyPool,
    (db, name): (&CatalogDb, &str),
    swaps: &[(&TableIdent, String, String)],
) -> Result<bool> {
    let db_error = |e: sqlx::Error| {
        Error::new(ErrorKind::Lake, "the catalog database refused the commit")
            .with_context("catalog", db)
            .with_source(e)
    };
    let swap = db.placeholders(
        "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
         WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? AND metadata_location = ?",
    );
    let mut transaction = pool.begin().await.map_err(db_error)?;
    let mut lost = None;
    for (ident, expected, new) in swaps {
        let result = sqlx::query(&swap)
            .bind(new)
            .bind(expected)
            .bind(name)
            .bind(ident.namespace().join("."))
            .bind(ident.name())
            .bind(expected)
            .execute(&mut *transaction)
            .await
            .map_err(|e| db_error(e).with_context("table", ident))?;
        if result.rows_affected() != 1 {
            lost = Some(*ident);
            break;
        }
    }
    let Some(ident) = lost else {
        transaction.commit().await.map_err(db_error)?;
        return Ok(true);
    };
    transaction.rollback().await.map_err(db_error)?;
    // Tell a lost race from a table that is gone.
    let count = db.placeholders(
        "SELECT count(*) FROM iceberg_tables \
         WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?",
    );
    let exists = sqlx::query(&count)
        .bind(name)
        .bind(ident.namespace().join("."))
        .bind(ident.name())
        .fetch_one(pool)
        .await
        .map_err(db_error)?
        .get::<i64, _>(0);
    if exists == 0 {
        return Err(
            Error::new(ErrorKind::Lake, "the table vanished from the catalog")
                .with_context("table", ident),
        );
    }
    Ok(false)
}
