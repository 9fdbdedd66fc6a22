//! The helper objects wal2iceberg installs at the source (DDL and
//! partition-row triggers), under one advisory lock.

use tokio_postgres::Client;

use super::describe_table;
use crate::error::{Result, postgres};
use crate::model::TableName;

/// The advisory lock key under which wal2iceberg installs its helper
/// objects ("w2i_inst" in ASCII): every run and setup on a database takes
/// it, so runs started together install each object once.
const INSTALL_LOCK: i64 = 0x7732_695f_696e_7374;

/// Runs `steps` (idempotent installs on `client`) in one transaction that
/// holds [`INSTALL_LOCK`]: a second run waits for the first to commit, then
/// finds everything there. `CREATE SCHEMA IF NOT EXISTS` and its kin are
/// not safe against each other without it.
pub(crate) async fn installing<T>(
    client: &Client,
    steps: impl Future<Output = Result<T>>,
) -> Result<T> {
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({INSTALL_LOCK})"
        ))
        .await
        .map_err(|e| postgres(e, "cannot take the lock wal2iceberg installs under"))?;
    let result = steps.await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = client
        .batch_execute(end)
        .await
        .map_err(|e| postgres(e, "cannot commit the installation of the helper objects"));
    let value = result?;
    ended?;
    Ok(value)
}

/// The event trigger that sends the rows of attached partitions and puts
/// the triggers on new ones ([`crate::cdc::partition_rows`]), and the
/// migration that installs them.
pub(crate) const PARTITION_ROWS_TRIGGER: &str = "wal2iceberg_partition_rows";
pub(crate) const PARTITION_ROWS_MIGRATION: &str = "004_wal2iceberg_partition_rows.sql";
pub(crate) const PARTITION_ROWS_SQL: &str =
    include_str!("../../../migrations/004_wal2iceberg_partition_rows.sql");

/// An event trigger wal2iceberg installs where it can (a superuser), and
/// the migration that holds it.
pub(crate) struct DdlTrigger {
    pub(crate) name: &'static str,
    pub(crate) migration: &'static str,
    pub(crate) sql: &'static str,
    /// What a run without it cannot see.
    pub(crate) without: &'static str,
}

/// The event trigger that sends each table's column numbers after an
/// ALTER TABLE ([`crate::cdc::relation::COLUMNS`]).
pub(crate) const COLUMN_NUMBERS: DdlTrigger = DdlTrigger {
    name: "wal2iceberg_columns",
    migration: "005_wal2iceberg_column_numbers.sql",
    sql: include_str!("../../../migrations/005_wal2iceberg_column_numbers.sql"),
    without: "a rename the stream meets after later DDL of its table is followed as a drop and an add",
};

/// The event trigger that marks where DDL rewrote a table's rows
/// ([`crate::cdc::relation::REWRITE`]).
pub(crate) const REWRITES: DdlTrigger = DdlTrigger {
    name: "wal2iceberg_rewrites",
    migration: "006_wal2iceberg_rewrites.sql",
    sql: include_str!("../../../migrations/006_wal2iceberg_rewrites.sql"),
    without: "a retype whose USING changes values, and no change to the table follows, \
              leaves silver with the old values until a resync",
};

/// Installs [`COLUMN_NUMBERS`] and [`REWRITES`], in order, when either is
/// missing (the later migration also brings the earlier one's function up
/// to date) and the role is a superuser; says what is not seen without
/// them otherwise (docs/tables.md, Schema changes).
pub(crate) async fn ensure_ddl_triggers(client: &Client) -> Result<()> {
    let triggers = [COLUMN_NUMBERS, REWRITES];
    let mut missing = Vec::new();
    for trigger in &triggers {
        let installed: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = $1 AND evtenabled <> 'D')",
                &[&trigger.name],
            )
            .await
            .map_err(|e| postgres(e, "cannot read pg_event_trigger"))?
            .get(0);
        if !installed {
            missing.push(trigger);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    if !is_superuser(client).await? {
        for trigger in missing {
            tracing::info!(
                "the event trigger {} is not installed: {}. Install it with wal2iceberg setup \
                 as a superuser (migrations/{})",
                trigger.name,
                trigger.without,
                trigger.migration
            );
        }
        return Ok(());
    }
    for trigger in &triggers {
        client.batch_execute(trigger.sql).await.map_err(|e| {
            postgres(e, "cannot install an event trigger").with_context("file", trigger.migration)
        })?;
    }
    tracing::info!(
        "installed the event triggers that mark schema changes and rewrites in the stream"
    );
    Ok(())
}

pub(super) async fn is_superuser(client: &Client) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_roles"))?;
    Ok(row.get(0))
}

/// Whether the event trigger is enabled, `root` has its moving-row
/// trigger, and every table of its partition tree its TRUNCATE trigger.
pub(super) async fn partition_rows_ready(client: &Client, root: &TableName) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = $1 AND evtenabled <> 'D') \
                    AND EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = $2::text::regclass \
                                AND g.tgname = 'wal2iceberg_truncated_end') \
                    AND EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = $2::text::regclass \
                                AND g.tgname = 'wal2iceberg_moving_rows' AND g.tgenabled <> 'D') \
                    AND NOT EXISTS (SELECT 1 FROM pg_partition_tree($2::text::regclass) t \
                                    WHERE NOT EXISTS (SELECT 1 FROM pg_trigger g \
                                                      WHERE g.tgrelid = t.relid AND g.tgenabled <> 'D' \
                                                        AND g.tgname = 'wal2iceberg_truncated_rows'))",
            &[&PARTITION_ROWS_TRIGGER, &root.quoted()],
        )
        .await
        .map_err(|e| postgres(e, "cannot read the partition triggers").with_context("table", root))?;
    Ok(row.get(0))
}

/// Installs what sends the rows of partitions attached, truncated or moved
/// out of for each partitioned table of `tables` that lacks it, as a
/// superuser (the preflight refuses the tables otherwise). Putting a
/// trigger on a partition takes a brief SHARE ROW EXCLUSIVE lock on it,
/// once.
pub(crate) async fn ensure_partition_rows(client: &Client, tables: &[TableName]) -> Result<()> {
    let mut unready = Vec::new();
    for table in tables {
        if describe_table(client, table).await?.partitioned
            && !partition_rows_ready(client, table).await?
        {
            unready.push(table);
        }
    }
    if unready.is_empty() || !is_superuser(client).await? {
        return Ok(());
    }
    let failed = |e| {
        postgres(e, "cannot install the partition triggers")
            .with_context("file", PARTITION_ROWS_MIGRATION)
    };
    client
        .batch_execute(PARTITION_ROWS_SQL)
        .await
        .map_err(failed)?;
    for table in unready {
        client
            .execute(
                "SELECT wal2iceberg.watch_partitions($1::text::regclass)",
                &[&table.quoted()],
            )
            .await
            .map_err(failed)?;
        tracing::info!(
            %table,
            "installed the triggers that send the rows of attached, truncated and moving partitions"
        );
    }
    Ok(())
}
