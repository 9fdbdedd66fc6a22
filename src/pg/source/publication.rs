//! The publication: which tables it holds, and adding to it only tables
//! whose UPDATE and DELETE keep working once published.

use tokio_postgres::Client;

use crate::error::{Result, postgres};
use crate::model::TableName;
use crate::pg::replication::quote_ident;

/// The tables of `tables` the publication does not publish: all of them
/// when it does not exist.
pub(crate) async fn unpublished(
    client: &Client,
    publication: &str,
    tables: &[TableName],
) -> Result<Vec<TableName>> {
    let all = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| {
            postgres(e, "cannot read pg_publication").with_context("publication", publication)
        })?;
    match all {
        None => Ok(tables.to_vec()),
        Some(row) if row.get::<_, bool>(0) => Ok(Vec::new()),
        Some(_) => {
            // Members named in it (a partitioned table itself) or through
            // it (a table of a published schema, a partition).
            let mut published = published_tables(client, publication).await?;
            published.extend(published_relations(client, publication).await?);
            Ok(tables
                .iter()
                .filter(|t| !published.contains(t))
                .cloned()
                .collect())
        }
    }
}

/// The relations named in a publication (`pg_publication_rel`: a
/// partitioned table itself, not its partitions).
pub(super) async fn published_relations(
    client: &Client,
    publication: &str,
) -> Result<Vec<TableName>> {
    table_names(
        client,
        "SELECT n.nspname::text, c.relname::text FROM pg_publication_rel r \
         JOIN pg_publication p ON p.oid = r.prpubid \
         JOIN pg_class c ON c.oid = r.prrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE p.pubname = $1",
        publication,
    )
    .await
}

/// The tables a publication publishes, in name order; empty when it does
/// not exist.
pub(crate) async fn published_tables(client: &Client, publication: &str) -> Result<Vec<TableName>> {
    table_names(
        client,
        "SELECT schemaname::text, tablename::text FROM pg_publication_tables \
         WHERE pubname = $1 ORDER BY 1, 2",
        publication,
    )
    .await
}

/// The (schema, name) rows `sql` gives for `publication`, as table names.
async fn table_names(client: &Client, sql: &str, publication: &str) -> Result<Vec<TableName>> {
    let rows = client.query(sql, &[&publication]).await.map_err(|e| {
        postgres(e, "cannot read the publication's tables").with_context("publication", publication)
    })?;
    Ok(rows
        .iter()
        .map(|r| TableName {
            schema: r.get(0),
            name: r.get(1),
        })
        .collect())
}

/// The comment a publication wal2iceberg created carries, so that
/// `teardown` drops only those.
pub(crate) const CREATED_BY_MARK: &str = "created by wal2iceberg";

/// Creates the publication for `tables`, or adds the tables it lacks.
/// Call only after [`preflight`] passed for these tables.
pub(crate) async fn ensure_publication(
    client: &Client,
    publication: &str,
    tables: &[TableName],
) -> Result<()> {
    let q = |e| postgres(e, "cannot read pg_publication").with_context("publication", publication);
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(q)?
        .is_some();
    let adding = unpublished(client, publication, tables).await?;
    if adding.is_empty() {
        return Ok(());
    }
    let list = adding
        .iter()
        .map(TableName::quoted)
        .collect::<Vec<_>>()
        .join(", ");
    let sql = if exists {
        format!(
            "ALTER PUBLICATION {} ADD TABLE {list}",
            quote_ident(publication)
        )
    } else {
        format!(
            "CREATE PUBLICATION {name} FOR TABLE {list} WITH (publish_via_partition_root = true); \
             COMMENT ON PUBLICATION {name} IS '{CREATED_BY_MARK}'",
            name = quote_ident(publication),
        )
    };
    client.batch_execute(&sql).await.map_err(|e| {
        let hint = if e.code().map(|c| c.code()) == Some("42501") {
            format!(
                "cannot create or change the publication: that needs the tables' owner or a \
                 superuser. As one, run: wal2iceberg setup --tables {} (it publishes them and \
                 grants the role SELECT on them), or {sql} yourself",
                adding
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
        } else {
            "cannot create or change the publication".to_owned()
        };
        postgres(e, &hint).with_context("publication", publication)
    })?;
    tracing::info!(publication, "publication ready");
    Ok(())
}
