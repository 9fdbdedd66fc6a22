//! The marks DDL leaves in the stream ([`relation::REWRITE`],
//! [`relation::COLUMNS`]): pgoutput sends nothing for a table's DDL until
//! its next change, so the assembler sends [`Event::Rewritten`] where DDL
//! rewrote a captured table's rows and [`Event::Described`] where it left
//! its columns, whether or not a change of the table follows.

use std::collections::HashSet;
use std::sync::Arc;

use super::Assembler;
use crate::cdc::event::{Event, TxInfo};
use crate::cdc::relation::{self, Describe, NotedColumn};
use crate::error::Result;
use crate::model::Lsn;
use crate::model::TableName;

/// The captured tables a transaction marked rewritten so far: one mark per
/// table, however many of its partitions the DDL rewrote.
pub(super) struct Rewritten {
    xid: u32,
    tables: HashSet<TableName>,
}

impl<D: Describe> Assembler<D> {
    /// The captured table of OID `oid` that a message names `named`.
    fn captured_as(&self, named: &TableName, oid: u32) -> Option<TableName> {
        match self.captured.get(&oid) {
            Some(captured) => Some(captured.clone()),
            None => self.tables.contains(named).then(|| named.clone()),
        }
    }

    /// Marks the captured tables among those a rewrite names, once per
    /// transaction: silver reloads them ([`Event::Rewritten`]).
    pub(super) fn rewrote(&mut self, tables: Vec<(TableName, u32)>, tx: TxInfo, lsn: Lsn) {
        self.settle_moving();
        if self.rewritten.as_ref().is_none_or(|r| r.xid != tx.xid) {
            self.rewritten = Some(Rewritten {
                xid: tx.xid,
                tables: HashSet::new(),
            });
        }
        for (named, oid) in tables {
            let Some(table) = self.captured_as(&named, oid) else {
                continue;
            };
            let marked = self
                .rewritten
                .as_mut()
                .is_some_and(|r| r.tables.insert(table.clone()));
            if marked {
                self.ready.push_back(Event::Rewritten { tx, lsn, table });
            }
        }
    }

    /// A captured table's columns as a DDL statement left them
    /// ([`Event::Described`]): the relation both its tables follow at this
    /// place in the stream. Nothing for a message without types or OID
    /// (migration 005 without 006).
    pub(super) async fn described(
        &mut self,
        named: &TableName,
        oid: Option<u32>,
        columns: &[NotedColumn],
        tx: TxInfo,
        lsn: Lsn,
    ) -> Result<()> {
        let Some((oid, table)) = oid.and_then(|oid| Some((oid, self.captured_as(named, oid)?)))
        else {
            return Ok(());
        };
        // Not described by the stream yet: nothing needs its identity's
        // columns before a Relation message comes with its first change.
        let base = self.relations.get(oid, lsn).ok();
        let Some(rel) = relation::relation_at_ddl(base.as_deref(), oid, named, columns) else {
            return Ok(());
        };
        self.settle_moving();
        // Read with the message's own numbers and defaults, noted before.
        let mut relation = self.catalog.describe(rel).await?;
        relation.name = table;
        self.ready.push_back(Event::Described {
            tx,
            lsn,
            relation: Arc::new(relation),
        });
        Ok(())
    }
}
