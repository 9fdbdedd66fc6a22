//! The ordinary (non-replication) connection: preflight checks,
//! publication management, catalog look-ups and the snapshot COPY.
//!
//! Every check here reads the catalog only. The one change made to the
//! source is creating a publication or adding a table to it, and only for
//! tables whose UPDATE and DELETE keep working once published (a primary
//! key, or a replica identity of FULL or USING INDEX).

use std::fmt;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, CopyOutStream, NoTls};

use super::config::{DEFAULT_APPLICATION_NAME, PgConfig};
use super::replication::quote_ident;
use crate::error::{Error, ErrorKind, Result, postgres};
use crate::model::Lsn;
use crate::model::TableName;

/// An ordinary connection; its background task ends when this is dropped.
pub struct SourceClient {
    client: Client,
    task: JoinHandle<()>,
}

impl Drop for SourceClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::ops::Deref for SourceClient {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl SourceClient {
    pub async fn connect(config: &PgConfig) -> Result<SourceClient> {
        let pg = config.to_tokio_postgres();
        let context = |e: tokio_postgres::Error| {
            let code = e.as_db_error().map(|d| d.code().code().to_owned());
            let err = postgres(e, "cannot connect to the source database")
                .with_context("host", &config.host)
                .with_context("port", config.port)
                .with_context("dbname", &config.dbname);
            let tls = err.to_string().contains("TLS");
            match code.as_deref() {
                None if tls => Error::new(
                    ErrorKind::Tls,
                    "TLS could not be set up as sslmode requires",
                )
                .with_context("sslmode", format!("{:?}", config.sslmode))
                .with_source(err),
                Some("28P01" | "28000") => Error::new(
                    ErrorKind::Authentication,
                    "the server rejected the login: check the user, the password and pg_hba.conf",
                )
                .with_context("user", &config.user)
                .with_source(err),
                _ => err,
            }
        };
        let (client, task) = match super::tls::client_config(config)? {
            Some(tls) => {
                let connector = tokio_postgres_rustls::MakeRustlsConnect::new((*tls).clone());
                let (client, connection) = pg.connect(connector).await.map_err(context)?;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
            _ => {
                let (client, connection) = pg.connect(NoTls).await.map_err(context)?;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
        };
        Ok(SourceClient { client, task })
    }
}

/// One failed preflight check: what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckFailure {
    /// A stable short name, e.g. `wal_level`.
    pub check: &'static str,
    pub problem: String,
    pub fix: String,
}

impl fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] {}\n    fix: {}",
            self.check, self.problem, self.fix
        )
    }
}

/// What the slot looks like in `pg_replication_slots`.
#[derive(Debug, Clone)]
pub struct SlotInfo {
    pub plugin: Option<String>,
    pub database: Option<String>,
    pub active_pid: Option<i32>,
    /// Whether the process holding it is a walsender: a consumer streams
    /// from it. Any other holder is a backend whose SQL function reads it
    /// for a moment (`pg_logical_slot_peek_changes`, as `verify` does).
    pub streamed: bool,
    pub confirmed_flush_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
}

pub async fn slot_info(client: &Client, slot: &str) -> Result<Option<SlotInfo>> {
    let row = client
        .query_opt(
            "SELECT plugin::text, database::text, active_pid, confirmed_flush_lsn::text, \
                    wal_status, COALESCE((SELECT backend_type = 'walsender' \
                                          FROM pg_stat_activity WHERE pid = active_pid), false) \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_replication_slots"))?;
    Ok(row.map(|r| SlotInfo {
        plugin: r.get(0),
        database: r.get(1),
        active_pid: r.get(2),
        confirmed_flush_lsn: r.get::<_, Option<String>>(3).and_then(|s| s.parse().ok()),
        wal_status: r.get(4),
        streamed: r.get(5),
    }))
}

/// The server's `wal_level`, when it is not `logical`.
pub async fn wal_level(client: &Client) -> Result<Option<CheckFailure>> {
    let level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(|e| postgres(e, "cannot read wal_level"))?
        .get(0);
    Ok((level != "logical").then(|| CheckFailure {
        check: "wal_level",
        problem: format!("wal_level is {level:?}; logical replication needs \"logical\""),
        fix: "as a superuser: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL \
              (a reload does not change it)"
            .to_owned(),
    }))
}

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
    let q = |e| postgres(e, "preflight check query failed");

    failures.extend(wal_level(client).await?);

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

    let existing_slot = slot_info(client, slot).await?;
    match &existing_slot {
        None => {
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
                    problem: format!(
                        "all {max_slots} replication slots are taken (max_replication_slots)"
                    ),
                    fix: "raise max_replication_slots and restart, or drop an unused slot: \
                          SELECT pg_drop_replication_slot(name)"
                        .to_owned(),
                });
            }
            if senders >= max_senders {
                failures.push(CheckFailure {
                    check: "free_wal_sender",
                    problem: format!("all {max_senders} WAL senders are busy (max_wal_senders)"),
                    fix: "raise max_wal_senders and restart, or stop another replication client"
                        .to_owned(),
                });
            }
        }
        Some(info) => {
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
        }
    }

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

/// The advisory lock key under which wal2iceberg installs its helper
/// objects ("w2i_inst" in ASCII): every run and setup on a database takes
/// it, so runs started together install each object once.
const INSTALL_LOCK: i64 = 0x7732_695f_696e_7374;

/// Runs `steps` (idempotent installs on `client`) in one transaction that
/// holds [`INSTALL_LOCK`]: a second run waits for the first to commit, then
/// finds everything there. `CREATE SCHEMA IF NOT EXISTS` and its kin are
/// not safe against each other without it.
pub async fn installing<T>(client: &Client, steps: impl Future<Output = Result<T>>) -> Result<T> {
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

/// The preflight failure of a slot a wal2iceberg run holds: `check`
/// reports it apart (exit code 3), since nothing is wrong.
pub const SLOT_HELD_BY_RUN: &str = "slot_held_by_run";

/// The event trigger that sends the rows of attached partitions and puts
/// the triggers on new ones ([`crate::cdc::partition_rows`]), and the
/// migration that installs them.
pub const PARTITION_ROWS_TRIGGER: &str = "wal2iceberg_partition_rows";
pub const PARTITION_ROWS_MIGRATION: &str = "004_wal2iceberg_partition_rows.sql";
pub const PARTITION_ROWS_SQL: &str =
    include_str!("../../migrations/004_wal2iceberg_partition_rows.sql");

/// An event trigger wal2iceberg installs where it can (a superuser), and
/// the migration that holds it.
pub struct DdlTrigger {
    pub name: &'static str,
    pub migration: &'static str,
    pub sql: &'static str,
    /// What a run without it cannot see.
    pub without: &'static str,
}

/// The event trigger that sends each table's column numbers after an
/// ALTER TABLE ([`crate::cdc::relation::COLUMNS`]).
pub const COLUMN_NUMBERS: DdlTrigger = DdlTrigger {
    name: "wal2iceberg_columns",
    migration: "005_wal2iceberg_column_numbers.sql",
    sql: include_str!("../../migrations/005_wal2iceberg_column_numbers.sql"),
    without: "a rename the stream meets after later DDL of its table is followed as a drop and an add",
};

/// The event trigger that marks where DDL rewrote a table's rows
/// ([`crate::cdc::relation::REWRITE`]).
pub const REWRITES: DdlTrigger = DdlTrigger {
    name: "wal2iceberg_rewrites",
    migration: "006_wal2iceberg_rewrites.sql",
    sql: include_str!("../../migrations/006_wal2iceberg_rewrites.sql"),
    without: "a retype whose USING changes values, and no change to the table follows, \
              leaves silver with the old values until a resync",
};

/// Installs [`COLUMN_NUMBERS`] and [`REWRITES`], in order, when either is
/// missing (the later migration also brings the earlier one's function up
/// to date) and the role is a superuser; says what is not seen without
/// them otherwise (docs/tables.md, Schema changes).
pub async fn ensure_ddl_triggers(client: &Client) -> Result<()> {
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

async fn is_superuser(client: &Client) -> Result<bool> {
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
async fn partition_rows_ready(client: &Client, root: &TableName) -> Result<bool> {
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
pub async fn ensure_partition_rows(client: &Client, tables: &[TableName]) -> Result<()> {
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

/// The tables of `tables` the publication does not publish: all of them
/// when it does not exist.
pub async fn unpublished(
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
async fn published_relations(client: &Client, publication: &str) -> Result<Vec<TableName>> {
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
pub async fn published_tables(client: &Client, publication: &str) -> Result<Vec<TableName>> {
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
pub const CREATED_BY_MARK: &str = "created by wal2iceberg";

/// Creates the publication for `tables`, or adds the tables it lacks.
/// Call only after [`preflight`] passed for these tables.
pub async fn ensure_publication(
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

/// One column as the catalog describes it, in the order pgoutput sends
/// columns: by attribute number, without dropped or generated columns.
#[derive(Debug, Clone)]
pub struct CatalogColumn {
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
    pub is_primary_key: bool,
    pub is_identity_key: bool,
    /// The dimensions an array column was declared with (`int[][]`: 2;
    /// `attndims`, which PostgreSQL records but does not enforce).
    pub dimensions: i32,
    /// A default (`atthasdef`), or a value the rows before the column
    /// existed read (`atthasmissing`): added later, the column holds
    /// values in rows no change touched.
    pub has_default: bool,
    /// `attnum`, which a rename keeps and an added column never reuses.
    pub attnum: i16,
}

#[derive(Debug, Clone)]
pub struct CatalogTable {
    pub oid: u32,
    pub name: TableName,
    /// A partitioned table: its rows are its partitions'.
    pub partitioned: bool,
    pub replica_identity: u8,
    pub columns: Vec<CatalogColumn>,
}

pub async fn describe_table(client: &Client, table: &TableName) -> Result<CatalogTable> {
    let rows = client
        .query(
            "SELECT c.oid, c.relreplident::text, a.attname::text, a.atttypid, a.atttypmod, \
                    COALESCE(a.attnum = ANY (pk.indkey::int2[]), false), \
                    COALESCE(a.attnum = ANY (ri.indkey::int2[]), false), c.relkind = 'p', \
                    a.attndims::int4, a.atthasdef OR a.atthasmissing, a.attnum \
             FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                                 AND a.attgenerated = '' \
             LEFT JOIN pg_index pk ON pk.indrelid = c.oid AND pk.indisprimary \
             LEFT JOIN pg_index ri ON ri.indrelid = c.oid AND ri.indisreplident \
             WHERE n.nspname = $1 AND c.relname = $2 \
             ORDER BY a.attnum",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(|e| postgres(e, "cannot read the table's columns").with_context("table", table))?;
    let first = rows.first().ok_or_else(|| {
        Error::new(
            ErrorKind::Preflight,
            format!("table {table} does not exist or has no columns"),
        )
    })?;
    let replident: String = first.get(1);
    let identity = replident.as_bytes().first().copied().unwrap_or(b'd');
    Ok(CatalogTable {
        oid: first.get(0),
        name: table.clone(),
        partitioned: first.get(7),
        replica_identity: identity,
        columns: rows
            .iter()
            .map(|r| {
                let is_pk: bool = r.get(5);
                let in_identity_index: bool = r.get(6);
                CatalogColumn {
                    name: r.get(2),
                    type_oid: r.get(3),
                    type_modifier: r.get(4),
                    is_primary_key: is_pk,
                    is_identity_key: match identity {
                        b'f' => true,
                        b'i' => in_identity_index,
                        _ => is_pk,
                    },
                    dimensions: r.get(8),
                    has_default: r.get(9),
                    attnum: r.get(10),
                }
            })
            .collect(),
    })
}

/// The OID of a table, as it is named now.
pub async fn table_oid(client: &Client, table: &TableName) -> Result<u32> {
    client
        .query_one("SELECT $1::text::regclass::oid", &[&table.quoted()])
        .await
        .map(|row| row.get(0))
        .map_err(|e| postgres(e, "cannot find the table").with_context("table", table))
}

/// The name of the table of OID `oid` now; `None` when there is none.
pub async fn table_of_oid(client: &Client, oid: u32) -> Result<Option<TableName>> {
    let row = client
        .query_opt(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
            &[&oid],
        )
        .await
        .map_err(|e| postgres(e, "cannot find the table").with_context("relation_oid", oid))?;
    Ok(row.map(|r| TableName {
        schema: r.get(0),
        name: r.get(1),
    }))
}

/// Whether a table of that name exists.
pub async fn table_exists(client: &Client, table: &TableName) -> Result<bool> {
    client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table.quoted()])
        .await
        .map(|row| row.get(0))
        .map_err(|e| postgres(e, "cannot find the table").with_context("table", table))
}

/// The primary-key column names of a relation, by OID, in key order.
pub async fn primary_key(client: &Client, relation_oid: u32) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT a.attname::text FROM pg_index i \
             JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) ON true \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.ord",
            &[&relation_oid],
        )
        .await
        .map_err(|e| {
            postgres(e, "cannot read the primary key").with_context("relation_oid", relation_oid)
        })?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// What the catalog knows of a column beyond what a Relation message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnFacts {
    pub name: String,
    /// [`CatalogColumn::dimensions`].
    pub dimensions: i32,
    /// [`CatalogColumn::has_default`].
    pub has_default: bool,
    /// [`CatalogColumn::attnum`].
    pub attnum: i16,
    pub type_oid: u32,
}

/// The columns of a relation, by OID, with [`ColumnFacts`], in the order
/// pgoutput sends them.
pub async fn column_facts(client: &Client, relation_oid: u32) -> Result<Vec<ColumnFacts>> {
    let rows = client
        .query(
            "SELECT attname::text, attndims::int4, atthasdef OR atthasmissing, attnum, atttypid \
             FROM pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' \
             ORDER BY attnum",
            &[&relation_oid],
        )
        .await
        .map_err(|e| {
            postgres(e, "cannot read the table's columns")
                .with_context("relation_oid", relation_oid)
        })?;
    Ok(rows
        .iter()
        .map(|r| ColumnFacts {
            name: r.get(0),
            dimensions: r.get(1),
            has_default: r.get(2),
            attnum: r.get(3),
            type_oid: r.get(4),
        })
        .collect())
}

/// What `pg_type` says about a type, enough to decode its text output.
#[derive(Debug, Clone)]
pub struct CatalogType {
    /// `b` base, `d` domain, `e` enum, `c` composite, `r` range, ...
    pub typtype: u8,
    /// For a domain: the type it is based on.
    pub base_type: u32,
    /// For an array: the element type (0 otherwise).
    pub element_type: u32,
    /// `A` for arrays.
    pub category: u8,
    /// For an array: what separates its elements in its text form, the
    /// element type's `typdelim` (`;` for `box`, `,` for nearly all).
    pub element_delimiter: u8,
}

pub async fn describe_type(client: &Client, oid: u32) -> Result<Option<CatalogType>> {
    let row = client
        .query_opt(
            "SELECT t.typtype::text, t.typbasetype, t.typelem, t.typcategory::text, \
                    coalesce((SELECT e.typdelim::text FROM pg_type e WHERE e.oid = t.typelem), ',') \
             FROM pg_type t WHERE t.oid = $1",
            &[&oid],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_type").with_context("type_oid", oid))?;
    let byte = |s: String| s.as_bytes().first().copied().unwrap_or(b'?');
    Ok(row.map(|r| CatalogType {
        typtype: byte(r.get(0)),
        base_type: r.get(1),
        element_type: r.get(2),
        category: byte(r.get(3)),
        element_delimiter: byte(r.get(4)),
    }))
}

/// Opens the snapshot an exported slot snapshot names, in a read-only
/// repeatable-read transaction on this connection. Must run while the
/// replication connection that exported it sends nothing else.
pub async fn begin_snapshot(client: &Client, snapshot_name: &str) -> Result<()> {
    client
        .batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{}'",
            snapshot_name.replace('\'', "''")
        ))
        .await
        .map_err(|e| {
            postgres(e, "cannot import the slot's exported snapshot")
                .with_context("snapshot", snapshot_name)
        })
}

/// Locks `tables` (ACCESS SHARE, until the transaction ends) so that no
/// TRUNCATE, rewrite or other ALTER TABLE can commit while they are read,
/// and checks that none did since the transaction's snapshot: the
/// snapshot's `pg_class` row names the storage each table has now, and
/// its `pg_attribute` rows the names its columns have now (the catalog
/// caches the checks' functions read are current, the rows they compare
/// are the snapshot's). A COPY names the snapshot's columns, but the
/// server resolves those names against the current catalog: a column
/// renamed or dropped since fails it, or reads another column that took
/// the name. A partitioned table has no storage of its own: its leaf
/// partitions are checked (LOCK locks them too). A table renamed or
/// dropped since is not found by the snapshot's name. Each is a
/// [`ErrorKind::Concurrent`] error: a new snapshot sees the change.
pub async fn lock_unchanged_since_snapshot(client: &Client, tables: &[TableName]) -> Result<()> {
    let Some(first) = tables.first() else {
        return Ok(());
    };
    // A name the snapshot knows and the catalog no longer does would fail
    // the LOCK with no word of which table or why.
    for table in tables {
        let row = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT FROM pg_class c \
                   JOIN pg_namespace n ON n.oid = c.relnamespace \
                   WHERE n.nspname = $2 AND c.relname = $3)",
                &[&table.quoted(), &table.schema, &table.name],
            )
            .await
            .map_err(|e| postgres(e, "cannot look up the table").with_context("table", table))?;
        match (row.get::<_, bool>(0), row.get::<_, bool>(1)) {
            (true, _) => {}
            (false, true) => {
                return Err(Error::new(
                    ErrorKind::Concurrent,
                    "the table was renamed or dropped after the snapshot was taken; run again \
                     for a new snapshot",
                )
                .with_context("table", table));
            }
            (false, false) => {
                return Err(Error::new(
                    ErrorKind::Preflight,
                    "the source has no such table (renamed? name it as it is called now)",
                )
                .with_context("table", table));
            }
        }
    }
    let list = tables
        .iter()
        .map(TableName::quoted)
        .collect::<Vec<_>>()
        .join(", ");
    client
        .batch_execute(&format!("LOCK TABLE {list} IN ACCESS SHARE MODE"))
        .await
        .map_err(|e| {
            postgres(e, "cannot lock the tables to read them").with_context("table", first)
        })?;
    for table in tables {
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_class WHERE oid = $1::text::regclass), \
                   (SELECT coalesce(bool_and(relfilenode = pg_relation_filenode(oid)), true) \
                    FROM pg_class WHERE relkind <> 'p' AND oid IN ( \
                      SELECT $1::text::regclass \
                      UNION SELECT relid FROM pg_partition_tree($1::text::regclass) WHERE isleaf)), \
                   (SELECT coalesce(bool_and((pg_identify_object_as_address( \
                      'pg_class'::regclass, attrelid, attnum)).object_names[3] = attname), true) \
                    FROM pg_attribute \
                    WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped)",
                &[&table.quoted()],
            )
            .await
            .map_err(|e| {
                postgres(e, "cannot read the table's storage and columns")
                    .with_context("table", table)
            })?;
        let changed = if !row.get::<_, bool>(0) {
            "the table's name was given to another table after the snapshot was taken"
        } else if !row.get::<_, bool>(1) {
            "the table was truncated or rewritten after the snapshot was taken, which leaves \
             it empty to that snapshot (TRUNCATE and table-rewriting ALTER TABLE are not \
             MVCC-safe)"
        } else if !row.get::<_, bool>(2) {
            "a column of the table was renamed or dropped after the snapshot was taken, which \
             leaves its values out of reach at that snapshot"
        } else {
            continue;
        };
        return Err(Error::new(
            ErrorKind::Concurrent,
            format!("{changed}; run again for a new snapshot"),
        )
        .with_context("table", table));
    }
    Ok(())
}

/// The table's rows in COPY's binary format: `COPY (SELECT columns FROM
/// ONLY table) TO STDOUT (FORMAT binary)`, the columns `casts` flags as
/// their type's text output. That is `format('%s', c)`, which calls the
/// output function, and not `c::text`: some casts to text differ from the
/// output (`inet` gains its netmask, `bpchar` loses its padding). `ONLY`
/// for an ordinary table, as `COPY table TO` reads no child table of an
/// inheritance either; a partitioned table is read whole, every partition
/// at every level, as its changes are published (publish_via_partition_root).
pub async fn copy_out(
    client: &Client,
    table: &CatalogTable,
    casts: &[bool],
) -> Result<CopyOutStream> {
    let columns = table
        .columns
        .iter()
        .zip(casts)
        .map(|(c, &cast)| {
            let name = quote_ident(&c.name);
            if cast {
                format!("CASE WHEN {name} IS NULL THEN NULL ELSE format('%s', {name}) END")
            } else {
                name
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let only = if table.partitioned { "" } else { "ONLY " };
    client
        .copy_out(&format!(
            "COPY (SELECT {columns} FROM {only}{}) TO STDOUT (FORMAT binary)",
            table.name.quoted()
        ))
        .await
        .map_err(|e| postgres(e, "cannot start COPY").with_context("table", &table.name))
}

/// Reads the next chunk of a COPY stream.
pub async fn next_copy_chunk(
    stream: &mut Pin<Box<CopyOutStream>>,
    table: &TableName,
) -> Result<Option<Bytes>> {
    match stream.next().await {
        None => Ok(None),
        Some(chunk) => chunk
            .map(Some)
            .map_err(|e| postgres(e, "COPY failed").with_context("table", table)),
    }
}
