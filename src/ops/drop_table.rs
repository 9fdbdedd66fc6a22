//! `wal2iceberg drop-table`: takes one source table out of the lake. Its
//! bronze and silver tables are dropped with their files, which removes
//! it from the lake's table set ([`crate::apply::table_set`]), and it leaves the
//! publication when wal2iceberg made that. Refused while a run writes the
//! lake (the writer lock): a run would apply the table again.

use iceberg::NamespaceIdent;

use crate::apply::naming::{remove_state_folder, state_folder};
use crate::apply::table_set;
use crate::error::{Error, ErrorKind, Result, postgres};
use crate::lake::catalog::{Lake, LakeLocation};
use crate::lake::lock::WriterLock;
use crate::model::TableName;
use crate::pg::config::PgConfig;
use crate::pg::replication::quote_ident;
use crate::pg::source::{CREATED_BY_MARK, SourceClient};

pub struct DropTableOptions {
    pub table: TableName,
    /// The Iceberg name settings chose for it, if any.
    pub name: Option<String>,
    pub lake: LakeLocation,
    pub namespace: NamespaceIdent,
    pub publication: String,
    /// The state directory, where its silver's key index is kept.
    pub state_dir: std::path::PathBuf,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct DropTableReport {
    /// The Iceberg tables dropped, files included.
    pub dropped: Vec<String>,
    pub publication: PublicationMembership,
    /// The slot the table was replicated from, when the lake records no
    /// other table from it: it retains WAL for nothing now, and a run of
    /// this lake on it is refused as another's (docs/tables.md, The table
    /// set).
    pub slot_left: Option<String>,
}

/// What became of the table's place in the publication.
#[derive(Debug, Default, PartialEq, Eq)]
pub enum PublicationMembership {
    /// It was not in it, or the publication does not exist.
    #[default]
    NotAMember,
    Removed,
    /// The publication is not wal2iceberg's: the table stays in it.
    NotOurs,
    /// The role may not change it: the statement an owner runs.
    NotPermitted(String),
}

impl DropTableReport {
    /// Whether something drop-table was to remove is left.
    pub fn incomplete(&self) -> bool {
        matches!(self.publication, PublicationMembership::NotPermitted(_))
    }

    /// What became of the table's Iceberg tables, its place in the
    /// publication and its slot, a line each.
    pub fn to_text(&self, options: &DropTableOptions) -> String {
        let table = &options.table;
        let mut text = String::new();
        if self.dropped.is_empty() {
            text += &format!("the lake holds no tables of {table}\n");
        }
        for ident in &self.dropped {
            text += &format!("table {ident}: dropped, files deleted\n");
        }
        let fate = match &self.publication {
            PublicationMembership::Removed => format!("{table} removed"),
            PublicationMembership::NotAMember => format!("did not hold {table}"),
            PublicationMembership::NotOurs => format!("kept {table} (not created by wal2iceberg)"),
            PublicationMembership::NotPermitted(sql) => format!(
                "still holds {table}: only its owner or a superuser may change it; as one, run: \
                 {sql}"
            ),
        };
        text += &format!("publication {}: {fate}\n", options.publication);
        if let Some(slot) = &self.slot_left {
            text += &format!(
                "slot {slot}: the lake holds no other table from it, and it retains WAL until \
                 dropped; if nothing else reads it, drop it (wal2iceberg teardown --slot \
                 {slot}); until then a run of this lake on it is refused as another lake's\n"
            );
        }
        text
    }
}

pub async fn drop_table(config: &PgConfig, options: &DropTableOptions) -> Result<DropTableReport> {
    // Refused before anything is dropped when the table would stay in
    // wal2iceberg's publication: the next run would load it again.
    let client = SourceClient::connect(config).await?;
    if let Some(sql) = owner_must_leave(&client, &options.publication, &options.table).await? {
        return Err(Error::new(
            ErrorKind::Preflight,
            format!(
                "this role may not take {} out of publication {:?}, and a table left in it is \
                 loaded again by the next run; as the publication's owner or a superuser run \
                 {sql} then drop-table again (or run drop-table as that role); nothing dropped",
                options.table, options.publication
            ),
        )
        .with_context("table", &options.table));
    }
    let _writer = WriterLock::acquire(&options.lake, &options.namespace).await?;
    let lake = Lake::open_existing(&options.lake).await?;
    let name = match &options.name {
        Some(name) => name.clone(),
        None => table_set::recorded_name(&lake, &options.namespace, &options.table, None).await?,
    };
    let mut report = DropTableReport::default();
    let mut slot = None;
    for ident in [format!("{name}_changes"), name.clone()] {
        let ident = iceberg::TableIdent::new(options.namespace.clone(), ident);
        if let Some(table) = lake.table_if_exists(&ident).await? {
            slot = slot.or_else(|| table_set::source_slot(&table));
            table_set::pass_on_recorded_position(&lake, &options.namespace, &table).await?;
            lake.drop_with_files(&ident).await?;
            report.dropped.push(ident.to_string());
        }
    }
    if let Some(slot) = slot
        && !table_set::namespace_replicates_slot(&lake, &options.namespace, &slot).await?
    {
        report.slot_left = Some(slot);
    }
    remove_state_folder(&state_folder(
        &options.state_dir,
        &options.namespace,
        Some(&name),
    ))?;
    report.publication = leave_publication(&client, &options.publication, &options.table).await?;
    Ok(report)
}

/// The `ALTER PUBLICATION` an owner must run first, when the table is in
/// wal2iceberg's publication and this role may not change that.
async fn owner_must_leave(
    client: &SourceClient,
    publication: &str,
    table: &TableName,
) -> Result<Option<String>> {
    let row = client
        .query_opt(
            "SELECT obj_description(p.oid, 'pg_publication') = $3 \
                    AND EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid \
                                AND r.prrelid = to_regclass($2)) \
                    AND NOT pg_has_role(current_user, p.pubowner, 'USAGE') \
                    AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) \
             FROM pg_publication p WHERE p.pubname = $1",
            &[&publication, &table.quoted(), &CREATED_BY_MARK],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_publication").with_context("table", table))?;
    Ok(row
        .is_some_and(|r| r.get::<_, Option<bool>>(0) == Some(true))
        .then(|| leave_statement(publication, table)))
}

fn leave_statement(publication: &str, table: &TableName) -> String {
    format!(
        "ALTER PUBLICATION {} DROP TABLE {};",
        quote_ident(publication),
        table.quoted()
    )
}

async fn leave_publication(
    client: &SourceClient,
    publication: &str,
    table: &TableName,
) -> Result<PublicationMembership> {
    let row = client
        .query_opt(
            "SELECT obj_description(p.oid, 'pg_publication'), \
                    EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid \
                            AND r.prrelid = to_regclass($2)) \
             FROM pg_publication p WHERE p.pubname = $1",
            &[&publication, &table.quoted()],
        )
        .await
        .map_err(|e| postgres(e, "cannot read pg_publication").with_context("table", table))?;
    let Some(row) = row else {
        return Ok(PublicationMembership::NotAMember);
    };
    let (mark, member): (Option<String>, bool) = (row.get(0), row.get(1));
    if !member {
        return Ok(PublicationMembership::NotAMember);
    }
    if mark.as_deref() != Some(CREATED_BY_MARK) {
        return Ok(PublicationMembership::NotOurs);
    }
    let sql = leave_statement(publication, table);
    match client.batch_execute(&sql).await {
        Ok(()) => Ok(PublicationMembership::Removed),
        Err(e) if e.code().map(|c| c.code()) == Some("42501") => {
            Ok(PublicationMembership::NotPermitted(sql))
        }
        Err(e) => Err(postgres(e, "cannot change the publication").with_context("table", table)),
    }
}
