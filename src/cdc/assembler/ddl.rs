//! The marks DDL leaves in the stream of a table it rewrote
//! ([`relation::REWRITE`], [`relation::COLUMNS`]): pgoutput sends no change
//! for the rows, so the assembler sends [`Event::Rewritten`] in their place.

use std::collections::HashMap;
use std::sync::Arc;

use super::Assembler;
use crate::cdc::event::{Event, TxInfo};
use crate::cdc::relation::{self, Describe, NotedColumn};
use crate::error::Result;
use crate::pg::lsn::Lsn;
use crate::pg::source::TableName;

/// The captured tables a transaction rewrote ([`relation::REWRITE`]) whose
/// columns its DDL has not given yet.
pub(super) struct Rewritten {
    xid: u32,
    /// By the name the message gives: the captured name, and the OID.
    tables: HashMap<TableName, (TableName, u32)>,
}

impl<D: Describe> Assembler<D> {
    /// Marks the captured tables among those a rewrite names: silver
    /// reloads them ([`Event::Rewritten`]), and bronze follows their
    /// columns when the DDL's [`relation::COLUMNS`] message gives them.
    pub(super) fn rewrote(&mut self, tables: Vec<(TableName, u32)>, tx: TxInfo, lsn: Lsn) {
        self.settle_moving();
        if self.rewritten.as_ref().is_none_or(|r| r.xid != tx.xid) {
            self.rewritten = Some(Rewritten {
                xid: tx.xid,
                tables: HashMap::new(),
            });
        }
        for (named, oid) in tables {
            let captured = match self.captured.get(&oid) {
                Some(captured) => captured.clone(),
                None if self.tables.contains(&named) => named.clone(),
                None => continue,
            };
            self.ready.push_back(Event::Rewritten {
                tx,
                lsn,
                table: captured.clone(),
                relation: None,
            });
            if let Some(rewritten) = &mut self.rewritten {
                rewritten.tables.insert(named, (captured, oid));
            }
        }
    }

    /// A rewritten table's columns as its DDL left them: the table as
    /// bronze follows it at this place in the stream, though no change of
    /// it may come after.
    pub(super) async fn retyped(
        &mut self,
        table: &TableName,
        columns: &[NotedColumn],
        tx: TxInfo,
        lsn: Lsn,
    ) -> Result<()> {
        let Some((captured, oid)) = self
            .rewritten
            .as_mut()
            .filter(|r| r.xid == tx.xid)
            .and_then(|r| r.tables.remove(table))
        else {
            return Ok(());
        };
        let base = match self.relations.get(oid, lsn).ok() {
            Some(base) => base,
            None => match self.catalog.describe_table(table).await? {
                Some(described) => Arc::new(described),
                None => return Ok(()),
            },
        };
        let Some(rel) = relation::relation_at_ddl(&base, table, columns) else {
            return Ok(());
        };
        // Read with the message's own numbers and defaults, noted before.
        let mut relation = self.catalog.describe(rel).await?;
        relation.name = captured.clone();
        self.ready.push_back(Event::Rewritten {
            tx,
            lsn,
            table: captured,
            relation: Some(Arc::new(relation)),
        });
        Ok(())
    }
}
