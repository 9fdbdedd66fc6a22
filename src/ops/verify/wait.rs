//! What verify waits for before it compares: the lake at the source
//! position it verifies, and no reload pending.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::apply::RunOptions;
use crate::apply::naming::idents;
use crate::cdc::relation::{self, message_table};
use crate::error::{Error, ErrorKind, Result, postgres};
use crate::lake::catalog::Lake;
use crate::model::Lsn;
use crate::model::TableName;
use crate::pg::pgoutput::{Decoder, Message};
use crate::pg::replication::{SLOT_IN_USE, quote_ident};
use crate::pg::source::{self, SourceClient};

/// Waits until no table's bronze holds a resync request not done yet: a
/// schema change (a rewrite, a new column with a default) or `wal2iceberg
/// resync` asked for silver to be reloaded, and until it is, silver is
/// behind the stream it confirmed. True when one was pending.
pub(super) async fn wait_for_resyncs(
    lake: &Lake,
    namespace: &iceberg::NamespaceIdent,
    names: &HashMap<TableName, String>,
    tables: &[TableName],
    wait: Duration,
) -> Result<bool> {
    let deadline = Instant::now() + wait;
    let mut waited = false;
    for table in tables {
        let (bronze, _) = idents(namespace, names, table);
        loop {
            let Some(bronze) = lake.table_if_exists(&bronze).await? else {
                break;
            };
            if crate::apply::resync::pending(&bronze).is_none() {
                break;
            }
            waited = true;
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Lake,
                    format!(
                        "silver is being reloaded (a resync is pending) and was not done within \
                         {wait:?}: verify again once the run has done it, or with a longer --wait"
                    ),
                )
                .with_context("table", table));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(waited)
}

/// Waits until the lake holds every change committed before `position`:
/// the pipeline's slot has confirmed it, or, with no run on the slot, the
/// slot holds no unapplied change of a captured table before it.
pub(super) async fn wait_for_lake(
    client: &SourceClient,
    options: &RunOptions,
    position: Lsn,
    wait: Duration,
) -> Result<()> {
    let slot = &options.capture.slot;
    let deadline = Instant::now() + wait;
    loop {
        let info = source::slot_info(client, slot).await?.ok_or_else(|| {
            Error::new(
                ErrorKind::Slot,
                "the replication slot does not exist, so nothing feeds the lake: start `wal2iceberg run`",
            )
            .with_context("slot", slot)
        })?;
        let confirmed = info.confirmed_flush_lsn.unwrap_or_default();
        if confirmed >= position {
            return Ok(());
        }
        if info.active_pid.is_none() {
            match unapplied_changes(client, options, position).await? {
                Some(0) => return Ok(()),
                Some(n) => {
                    return Err(Error::new(
                        ErrorKind::Slot,
                        format!(
                            "the lake lacks {n} changes committed before the source position \
                             verified, and no run is applying them: start `wal2iceberg run` and \
                             verify again"
                        ),
                    )
                    .with_context("slot", slot)
                    .with_context("confirmed", confirmed)
                    .with_context("position", position));
                }
                None => {}
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::new(
                ErrorKind::Slot,
                format!(
                    "the run did not confirm the source position verified within {wait:?}: \
                     it is behind; verify again later or with a longer --wait"
                ),
            )
            .with_context("slot", slot)
            .with_context("confirmed", confirmed)
            .with_context("position", position));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Changes of the captured tables the idle slot holds in transactions
/// committed before `position`, DDL the event triggers marked included;
/// `None` when a run took the slot meanwhile.
async fn unapplied_changes(
    client: &SourceClient,
    options: &RunOptions,
    position: Lsn,
) -> Result<Option<u64>> {
    let rows = client
        .query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes($1, $2::text::pg_lsn, NULL, \
             'proto_version', '1', 'publication_names', $3, 'messages', 'true')",
            &[
                &options.capture.slot,
                &position.to_string(),
                &quote_ident(&options.capture.publication),
            ],
        )
        .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) if e.code().is_some_and(|c| c.code() == SLOT_IN_USE) => return Ok(None),
        Err(e) => {
            return Err(postgres(e, "cannot peek at the replication slot")
                .with_context("slot", &options.capture.slot));
        }
    };
    // The publication may publish more tables than those verified: a
    // change counts when its relation, as the stream last described it,
    // is one of them.
    let mut captured: HashMap<u32, bool> = HashMap::new();
    let mut decoder = Decoder::new();
    let mut before = false;
    let mut count = 0;
    for row in rows {
        let data: Vec<u8> = row.get(0);
        let oids = match decoder.decode(data.into()).map_err(Error::from)? {
            Message::Begin(begin) => {
                before = begin.final_lsn < position;
                continue;
            }
            Message::Relation(_, rel) => {
                let table = message_table(&rel);
                captured.insert(rel.oid, options.capture.tables.contains(&table));
                continue;
            }
            Message::Insert(_, m) => vec![m.relation_oid],
            Message::Update(_, m) => vec![m.relation_oid],
            Message::Delete(_, m) => vec![m.relation_oid],
            Message::Truncate(_, m) => m.relation_oids,
            // DDL the event triggers marked: a schema change or a rewrite
            // the lake has not taken up either.
            Message::Message(_, m) if m.transactional => {
                let named = match m.prefix.as_str() {
                    relation::COLUMNS => relation::parse_columns(&m.content)
                        .map(|(table, _, _)| vec![table])
                        .unwrap_or_default(),
                    relation::REWRITE => relation::parse_rewrite(&m.content)
                        .map(|tables| tables.into_iter().map(|(t, _)| t).collect())
                        .unwrap_or_default(),
                    _ => Vec::new(),
                };
                if before && named.iter().any(|t| options.capture.tables.contains(t)) {
                    count += 1;
                }
                continue;
            }
            _ => continue,
        };
        if before && oids.iter().any(|oid| captured.get(oid) == Some(&true)) {
            count += 1;
        }
    }
    Ok(Some(count))
}
