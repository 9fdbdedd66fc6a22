//! `wal2iceberg setup`: prepares the source as an owner or superuser, so
//! that wal2iceberg itself can run with least privilege. It applies the
//! versioned, idempotent SQL in `migrations/` in order (the same files an
//! operator may run by hand with psql), then grants the role SELECT on each
//! table and adds the tables to the publication. A table whose UPDATE and
//! DELETE publishing would break (no primary key, no replica identity) is
//! refused before anything is granted or published.

use crate::cdc::capture::preflight_error;
use crate::error::{Result, postgres};
use crate::model::TableName;
use crate::pg::config::PgConfig;
use crate::pg::replication::quote_ident;
use crate::pg::source::{self, SourceClient};

/// The role and publication the migrations create.
pub const ROLE: &str = "wal2iceberg";
pub const PUBLICATION: &str = "wal2iceberg";

/// The migrations, in the order they apply.
pub(crate) const MIGRATIONS: &[(&str, &str)] = &[
    (
        "001_wal2iceberg_role.sql",
        include_str!("../../migrations/001_wal2iceberg_role.sql"),
    ),
    (
        "002_wal2iceberg_publication.sql",
        include_str!("../../migrations/002_wal2iceberg_publication.sql"),
    ),
    (
        "003_wal2iceberg_publish_via_root.sql",
        include_str!("../../migrations/003_wal2iceberg_publish_via_root.sql"),
    ),
    (source::PARTITION_ROWS_MIGRATION, source::PARTITION_ROWS_SQL),
    (source::COLUMN_NUMBERS.migration, source::COLUMN_NUMBERS.sql),
    (source::REWRITES.migration, source::REWRITES.sql),
];

pub async fn setup(config: &PgConfig, tables: &[TableName]) -> Result<()> {
    let client = SourceClient::connect(config).await?;
    // Refused before anything is installed: nothing replicates until the
    // server restarted with it.
    let mut failures: Vec<_> = source::wal_level(&client).await?.into_iter().collect();
    for table in tables {
        failures.extend(
            source::check_table(&client, table, true)
                .await?
                .into_iter()
                .filter(|f| f.check != "select_privilege"),
        );
    }
    if !failures.is_empty() {
        return Err(preflight_error(&failures));
    }
    source::installing(&client, async {
        for (name, sql) in MIGRATIONS {
            client.batch_execute(sql).await.map_err(|e| {
                postgres(e, "a migration failed (setup needs an owner or superuser)")
                    .with_context("file", name)
            })?;
            tracing::info!(migration = name, "applied");
        }
        for table in tables {
            client
                .batch_execute(&format!(
                    "GRANT USAGE ON SCHEMA {} TO {role}; GRANT SELECT ON {} TO {role};",
                    quote_ident(&table.schema),
                    table.quoted(),
                    role = quote_ident(ROLE),
                ))
                .await
                .map_err(|e| postgres(e, "cannot grant SELECT").with_context("table", table))?;
        }
        source::ensure_publication(&client, PUBLICATION, tables).await?;
        source::ensure_partition_rows(&client, tables).await
    })
    .await
}
