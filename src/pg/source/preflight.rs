//! The checks before anything is created or changed at the source: the
//! role, the server's settings, and each table's replica identity and
//! partitions.

use tokio_postgres::Client;

use super::install::{is_superuser, partition_rows_ready};
use super::publication::published_relations;
use super::{CheckFailure, PARTITION_ROWS_MIGRATION, published_tables, slot_info, wal_level};
use crate::error::{Error, Result, postgres};
use crate::model::{SlotInfo, TableName};
use crate::pg::config::DEFAULT_APPLICATION_NAME;
use crate::pg::replication::quote_ident;

/// The preflight failure of a slot a wal2iceberg run holds: `check`
/// reports it apart (exit code 3), since nothing is wrong.
pub const SLOT_HELD_BY_RUN: &str = "slot_held_by_run";

/// Runs every preflight check and returns all failures at once.
/// `to_lake`: the tables go to the lake, which needs a primary key
/// ([`check_table`]).
pub async fn preflight(
    client: &Client,
    tables: &[TableName],
    slot: &str,
    publication: &str,
    to_lake: bool,
) -> Result<Vec<CheckFailure>> {
    let mut failures = Vec::new();
    failures.extend(wal_level(client).await?);
    failures.extend(role_failures(client).await?);
    failures.extend(match slot_info(client, slot).await? {
        None => free_slot_failures(client).await?,
        Some(info) => slot_failures(client, slot, &info).await?,
    });
    failures.extend(table_failures(client, tables, publication, to_lake).await?);
    failures.extend(publication_failures(client, publication).await?);
    Ok(failures)
}

fn q(e: tokio_postgres::Error) -> Error {
    postgres(e, "preflight check query failed")
}

/// The role's privilege to replicate.
async fn role_failures(client: &Client) -> Result<Vec<CheckFailure>> {
    let mut failures = Vec::new();
    let role = client
        .query_one(
            "SELECT current_user::text, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map_err(q)?;
    let (user, replication, superuser): (String, bool, bool) =
        (role.get(0), role.get(1), role.get(2));
    if !replication && !superuser {
        failures.push(CheckFailure {
            check: "replication_privilege",
            problem: format!("role {user:?} has neither REPLICATION nor SUPERUSER"),
            fix: format!("ALTER ROLE {} REPLICATION;", quote_ident(&user)),
        });
    }
    Ok(failures)
}

/// A slot yet to be made: a free slot and a free WAL sender for it.
async fn free_slot_failures(client: &Client) -> Result<Vec<CheckFailure>> {
    let mut failures = Vec::new();
    let row = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::int, \
                    (SELECT count(*)::int FROM pg_replication_slots), \
                    current_setting('max_wal_senders')::int, \
                    (SELECT count(*)::int FROM pg_stat_replication)",
            &[],
        )
        .await
        .map_err(q)?;
    let (max_slots, slots, max_senders, senders): (i32, i32, i32, i32) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    if slots >= max_slots {
        failures.push(CheckFailure {
            check: "free_replication_slot",
            problem: format!("all {max_slots} replication slots are taken (max_replication_slots)"),
            fix: "raise max_replication_slots and restart, or drop an unused slot: \
                  SELECT pg_drop_replication_slot(name)"
                .to_owned(),
        });
    }
    if senders >= max_senders {
        failures.push(CheckFailure {
            check: "free_wal_sender",
            problem: format!("all {max_senders} WAL senders are busy (max_wal_senders)"),
            fix: "raise max_wal_senders and restart, or stop another replication client".to_owned(),
        });
    }
    Ok(failures)
}

/// The existing slot `slot` (`info`): held by another consumer, of
/// another plugin or database, or invalidated.
async fn slot_failures(client: &Client, slot: &str, info: &SlotInfo) -> Result<Vec<CheckFailure>> {
    let mut failures = Vec::new();
    // A SQL function reading the slot holds it for a moment only.
    if let Some(pid) = info.active_pid.filter(|_| info.streamed) {
        let (holder, from): (String, String) = client
            .query_opt(
                "SELECT application_name::text, \
                        COALESCE(host(client_addr) || ':' || client_port, 'a local socket') \
                 FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .map_err(q)?
            .map(|r| (r.get(0), r.get(1)))
            .unwrap_or_default();
        failures.push(if holder.starts_with(DEFAULT_APPLICATION_NAME) {
            CheckFailure {
                check: SLOT_HELD_BY_RUN,
                problem: format!(
                    "replication slot {slot:?} is in use by a wal2iceberg run \
                     (application_name {holder:?}, connected from {from}; the server's \
                     walsender process {pid}): nothing else can stream from it meanwhile"
                ),
                fix: "nothing, while that run is meant to go on; to start another, stop \
                      that run first (SIGTERM to the wal2iceberg process, or its service \
                      manager), which commits and confirms what it holds"
                    .to_owned(),
            }
        } else {
            CheckFailure {
                check: "slot_in_use",
                problem: format!(
                    "replication slot {slot:?} is in use by process {pid} \
                     (application_name {holder:?})"
                ),
                fix: format!(
                    "stop the other consumer of the slot (SELECT pg_terminate_backend({pid}) \
                     if it is stale), or use another slot name"
                ),
            }
        });
    }
    if info.plugin.as_deref() != Some("pgoutput") {
        failures.push(CheckFailure {
            check: "slot_plugin",
            problem: format!(
                "replication slot {slot:?} exists but is not a pgoutput logical slot ({})",
                match &info.plugin {
                    Some(plugin) => format!("its plugin is {plugin}"),
                    None => "a physical slot".to_owned(),
                }
            ),
            fix: "use another slot name".to_owned(),
        });
    }
    let dbname: String = client
        .query_one("SELECT current_database()::text", &[])
        .await
        .map_err(q)?
        .get(0);
    if info.database.as_deref().is_some_and(|d| d != dbname) {
        failures.push(CheckFailure {
            check: "slot_database",
            problem: format!(
                "replication slot {slot:?} belongs to database {:?}, not {dbname:?}",
                info.database.as_deref().unwrap_or_default()
            ),
            fix: "use another slot name".to_owned(),
        });
    }
    if info.wal_status.as_deref() == Some("lost") {
        failures.push(CheckFailure {
            check: "slot_invalidated",
            problem: format!(
                "replication slot {slot:?} was invalidated: the WAL it needed is gone \
                 (max_slot_wal_keep_size)"
            ),
            fix: format!(
                "drop it (SELECT pg_drop_replication_slot('{slot}')) and start again with a new initial load"
            ),
        });
    }
    Ok(failures)
}

/// Each table's checks, and those of the partitions.
async fn table_failures(
    client: &Client,
    tables: &[TableName],
    publication: &str,
    to_lake: bool,
) -> Result<Vec<CheckFailure>> {
    let mut failures = Vec::new();
    let published = published_tables(client, publication).await?;
    for table in tables {
        for failure in check_table(client, table, to_lake).await? {
            // A table published already that lost its primary key since:
            // refusing it now would stop the run for good and change
            // nothing at the source. PostgreSQL refuses its UPDATE and
            // DELETE without a replica identity, and its INSERTs still
            // come; under USING INDEX an update's unchanged TOAST values
            // reach bronze marked not sent.
            let lost_key = ["replica_identity", "primary_key"].contains(&failure.check);
            if lost_key && published.contains(table) {
                tracing::warn!(
                    %table, check = failure.check, fix = %failure.fix,
                    "a published table has no primary key any more: its changes still reach the \
                     lake as PostgreSQL sends them"
                );
            } else {
                failures.push(failure);
            }
        }
    }
    failures.extend(check_partitions(client, tables, publication).await?);
    Ok(failures)
}

/// The publication's operations: one that leaves one out loses its changes.
async fn publication_failures(client: &Client, publication: &str) -> Result<Vec<CheckFailure>> {
    let mut failures = Vec::new();
    let publishes = client
        .query_opt(
            "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(q)?;
    if let Some(row) = publishes {
        let ops: [(bool, &str); 4] = [
            (row.get(0), "insert"),
            (row.get(1), "update"),
            (row.get(2), "delete"),
            (row.get(3), "truncate"),
        ];
        let missing: Vec<&str> = ops
            .iter()
            .filter(|(on, _)| !on)
            .map(|(_, op)| *op)
            .collect();
        if !missing.is_empty() {
            failures.push(CheckFailure {
                check: "publication_operations",
                problem: format!(
                    "publication {publication:?} does not publish {}: those changes would be lost",
                    missing.join(", ")
                ),
                fix: format!(
                    "ALTER PUBLICATION {} SET (publish = 'insert, update, delete, truncate');",
                    quote_ident(publication)
                ),
            });
        }
    }
    Ok(failures)
}

/// Checks one table: it exists, we may read it, publishing it cannot
/// break the application's UPDATE and DELETE, and, when it goes to the
/// lake (`to_lake`), it has a primary key and no column of a reserved name.
pub async fn check_table(
    client: &Client,
    table: &TableName,
    to_lake: bool,
) -> Result<Vec<CheckFailure>> {
    let row = client
        .query_opt(
            "SELECT c.relkind::text, c.relreplident::text, \
                    has_table_privilege(c.oid, 'SELECT'), \
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary), \
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident), \
                    ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid \
                          AND a.attnum > 0 AND NOT a.attisdropped AND a.attname LIKE '\\_cdc\\_%' \
                          ORDER BY a.attnum), \
                    current_user::text, has_schema_privilege(n.oid, 'USAGE') \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(|e| postgres(e, "preflight check query failed").with_context("table", table))?;
    let Some(row) = row else {
        return Ok(vec![CheckFailure {
            check: "table_exists",
            problem: format!("table {table} does not exist"),
            fix: "check the name (schema.table, case-sensitive) or create the table".to_owned(),
        }]);
    };
    let (relkind, replident, can_select, has_pk, has_identity_index): (
        String,
        String,
        bool,
        bool,
        bool,
    ) = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    let reserved: Vec<String> = row.get(5);
    let (role, schema_usage): (String, bool) = (row.get(6), row.get(7));
    let mut failures = Vec::new();
    // Without a key, silver has nothing to keep rows by: the table goes to
    // bronze alone, which needs complete before images (FULL) to fill an
    // update's unchanged TOAST values.
    if to_lake && !has_pk && replident == "i" {
        failures.push(CheckFailure {
            check: "primary_key",
            problem: format!(
                "{table} has no primary key and REPLICA IDENTITY USING INDEX: the lake keeps a \
                 table without a key as its change history only, which needs complete before \
                 images"
            ),
            fix: format!(
                "add a primary key, or ALTER TABLE {} REPLICA IDENTITY FULL;",
                table.quoted()
            ),
        });
    }
    if to_lake && !reserved.is_empty() {
        failures.push(CheckFailure {
            check: "reserved_column_names",
            problem: format!(
                "{table} has columns {reserved:?}: the prefix _cdc_ is reserved for the lake's \
                 own columns"
            ),
            fix: format!(
                "rename them: ALTER TABLE {} RENAME COLUMN {} TO <name>;",
                table.quoted(),
                quote_ident(&reserved[0])
            ),
        });
    }
    if relkind != "r" && relkind != "p" {
        failures.push(CheckFailure {
            check: "table_kind",
            problem: format!(
                "{table} is not an ordinary or partitioned table (relkind {relkind:?})"
            ),
            fix: "replicate the underlying table instead".to_owned(),
        });
    }
    if !can_select || !schema_usage {
        let usage = if schema_usage {
            String::new()
        } else {
            format!(
                "GRANT USAGE ON SCHEMA {} TO {}; ",
                quote_ident(&table.schema),
                quote_ident(&role)
            )
        };
        failures.push(CheckFailure {
            check: "select_privilege",
            problem: format!(
                "role {role:?} may not SELECT from {table}, which the initial load needs"
            ),
            fix: format!(
                "as the table's owner: {usage}GRANT SELECT ON {} TO {};",
                table.quoted(),
                quote_ident(&role)
            ),
        });
    }
    let identity_ok = match replident.as_str() {
        "f" => true,
        "d" => has_pk,
        "i" => has_identity_index,
        _ => false,
    };
    if identity_ok && relkind == "p" {
        // Publishing a partitioned table publishes every partition: each
        // leaf's own identity decides whether its UPDATE and DELETE work.
        let leaves = partitions_without_identity(client, table).await?;
        if !leaves.is_empty() {
            failures.push(CheckFailure {
                check: "replica_identity",
                problem: format!(
                    "partitions {} of {table} have no primary key and no REPLICA IDENTITY FULL \
                     or USING INDEX; publishing {table} would make their UPDATE and DELETE fail, \
                     so it is not added",
                    leaves.join(", ")
                ),
                fix: format!(
                    "give each a primary key or a replica identity, e.g. ALTER TABLE {} REPLICA \
                     IDENTITY FULL;",
                    leaves[0]
                ),
            });
        }
    }
    if !identity_ok {
        failures.push(CheckFailure {
            check: "replica_identity",
            problem: format!(
                "{table} has no primary key and no REPLICA IDENTITY FULL or USING INDEX; publishing it \
                 would make its UPDATE and DELETE fail, so it is not added"
            ),
            fix: format!(
                "add a primary key, or ALTER TABLE {} REPLICA IDENTITY FULL;",
                table.quoted()
            ),
        });
    }
    Ok(failures)
}

/// The leaf partitions of a partitioned table whose UPDATE and DELETE would
/// fail once published, as `schema.name` text.
async fn partitions_without_identity(client: &Client, table: &TableName) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT t.relid::regclass::text FROM pg_partition_tree($1::text::regclass) t \
             JOIN pg_class c ON c.oid = t.relid \
             WHERE t.isleaf AND NOT CASE c.relreplident \
               WHEN 'f' THEN true \
               WHEN 'd' THEN EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) \
               WHEN 'i' THEN EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident) \
               ELSE false END \
             ORDER BY 1",
            &[&table.quoted()],
        )
        .await
        .map_err(|e| postgres(e, "cannot read the table's partitions").with_context("table", table))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Partitioned tables and their partitions against the publication, whose
/// changes of a partition come as its root's when it publishes via the
/// root (which wal2iceberg's own publication does):
/// - a partitioned table needs `publish_via_partition_root`, or its changes
///   come as its partitions', which no captured table takes;
/// - a table and one of its partitions cannot both be captured: the
///   partition's changes come as the root's;
/// - a partition captured on its own gets nothing when the publication
///   already publishes one of its ancestors via the root.
async fn check_partitions(
    client: &Client,
    tables: &[TableName],
    publication: &str,
) -> Result<Vec<CheckFailure>> {
    let q = |e| postgres(e, "cannot read the tables' partitioning");
    let publication_row = client
        .query_opt(
            "SELECT pubviaroot, puballtables FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(q)?;
    let mut failures = Vec::new();
    let mut partitioned_tables = Vec::new();
    for table in tables {
        let Some(row) = client
            .query_opt(
                "SELECT c.relkind = 'p', c.relispartition, \
                        ARRAY(SELECT an.nspname::text FROM pg_partition_ancestors(c.oid) WITH ORDINALITY a(relid, ord) \
                              JOIN pg_class ac ON ac.oid = a.relid \
                              JOIN pg_namespace an ON an.oid = ac.relnamespace \
                              WHERE a.relid <> c.oid ORDER BY a.ord), \
                        ARRAY(SELECT ac.relname::text FROM pg_partition_ancestors(c.oid) WITH ORDINALITY a(relid, ord) \
                              JOIN pg_class ac ON ac.oid = a.relid \
                              WHERE a.relid <> c.oid ORDER BY a.ord) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&table.schema, &table.name],
            )
            .await
            .map_err(q)?
        else {
            continue;
        };
        let (partitioned, is_partition): (bool, bool) = (row.get(0), row.get(1));
        // Nearest first.
        let ancestors: Vec<TableName> = row
            .get::<_, Vec<String>>(2)
            .into_iter()
            .zip(row.get::<_, Vec<String>>(3))
            .map(|(schema, name)| TableName { schema, name })
            .collect();
        if partitioned {
            partitioned_tables.push(table);
        }
        if partitioned
            && let Some(publication_row) = &publication_row
            && !publication_row.get::<_, bool>(0)
        {
            failures.push(CheckFailure {
                check: "publish_via_partition_root",
                problem: format!(
                    "{table} is partitioned and publication {publication:?} publishes the changes \
                     of its partitions as theirs, not as {table}'s"
                ),
                fix: format!(
                    "ALTER PUBLICATION {} SET (publish_via_partition_root = true);",
                    quote_ident(publication)
                ),
            });
        }
        if !is_partition {
            continue;
        }
        let named = tables.iter().find(|t| ancestors.contains(t));
        if let Some(root) = named {
            failures.push(CheckFailure {
                check: "partition_and_root",
                problem: format!(
                    "{table} is a partition of {root}, which is captured too: its changes come as \
                     {root}'s"
                ),
                fix: format!("capture {root} alone, which holds {table}'s rows"),
            });
            continue;
        }
        let Some(publication_row) = &publication_row else {
            continue;
        };
        let (via_root, all_tables): (bool, bool) = (publication_row.get(0), publication_row.get(1));
        let published_ancestor = if all_tables {
            ancestors.last().cloned()
        } else {
            let published = published_relations(client, publication).await?;
            ancestors.into_iter().find(|a| published.contains(a))
        };
        if via_root && let Some(ancestor) = published_ancestor {
            failures.push(CheckFailure {
                check: "partition_published_via_root",
                problem: format!(
                    "{table} is a partition of {ancestor}, which publication {publication:?} \
                     publishes via the root: {table}'s changes come as {ancestor}'s"
                ),
                fix: format!("capture {ancestor} instead, which holds {table}'s rows"),
            });
        }
    }
    let mut unready = Vec::new();
    for table in partitioned_tables {
        if !partition_rows_ready(client, table).await? {
            unready.push(table.to_string());
        }
    }
    if !unready.is_empty() && !is_superuser(client).await? {
        let tables = unready.join(",");
        failures.push(CheckFailure {
            check: "partition_rows_triggers",
            problem: format!(
                "{tables}: partitioned, and the triggers that send the rows of partitions \
                 attached or truncated later (which never pass through the WAL as the \
                 partitioned table's changes) are not installed: they need a superuser"
            ),
            fix: format!(
                "run wal2iceberg setup --tables {tables} once as a superuser (it applies \
                 migrations/{PARTITION_ROWS_MIGRATION})"
            ),
        });
    }
    Ok(failures)
}
