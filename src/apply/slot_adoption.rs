//! A lake taken over by another slot of the same database: the lake's
//! tables record the slot they were replicated from, and a run given
//! another one (`--slot`) takes it up when it cannot leave a gap. The
//! case it is for is the replay of the seed walkthrough: a copy of the
//! lake's slot (`pg_copy_logical_replication_slot`) stands where the lake
//! confirmed when it was taken, and resends what the lake already holds
//! (docs/operations.md, Following another slot).
//!
//! The other slot is taken up when the slot the lake records still exists
//! in the same database (so both are of this server: a name alone could be
//! another server's) and the new one stands at or behind where the lake's
//! history from the old one ends: the old slot's confirmed position,
//! which the lake holds everything before, and the furthest its tables
//! record. One standing past that was confirmed past changes the lake
//! never got, and is refused with the gap in bytes.

use iceberg::NamespaceIdent;

use super::table_set::{self, Recorded};
use crate::cdc::source::Source;
use crate::error::{Error, ErrorKind, Result};
use crate::lake::catalog::Lake;
use crate::model::{Lsn, SlotInfo, TableName};
use crate::pg::config::PgConfig;

/// The lake follows slot `to` from here, where its tables recorded `from`.
#[derive(Debug, Clone)]
pub(crate) struct Adoption {
    pub(crate) from: String,
    pub(crate) to: String,
}

/// What the lake records of `slot`, or of the one slot it records
/// `tables`' history from when `slot` may take that up ([`Adoption`]). A
/// lake that holds tables from `slot` already, or whose `tables` hold no
/// history from another live slot, is left as `recorded` says; a slot that
/// may not take the history up is refused here, before anything changes.
pub(crate) async fn consider(
    config: &PgConfig,
    recorded: Recorded,
    tables: &[TableName],
    slot: &str,
    from_slot: impl AsyncFnOnce(&str) -> Result<Recorded>,
) -> Result<(Recorded, Option<Adoption>)> {
    let Some(from) = candidate(&recorded, tables) else {
        return Ok((recorded, None));
    };
    let source = Source::connect(config).await?;
    let Some(new) = source.slot(slot).await? else {
        // No slot to take up: a new one would leave a gap, which the
        // table set refuses as it always did.
        return Ok((recorded, None));
    };
    let old = source.slot(&from).await?;
    let from_recorded = from_slot(&from).await?;
    let end = history_end(old.as_ref(), from_recorded.recorded_position);
    judge(config, slot, &new, &from, old.as_ref(), end)?;
    tracing::info!(
        slot,
        from = %from,
        confirmed_flush_lsn = %new.confirmed_flush_lsn.unwrap_or_default(),
        lake_position = %end.unwrap_or_default(),
        "the lake follows replication slot {slot:?} from here: it stands within the history the \
         lake holds from slot {from:?}, so what it sends again adds nothing"
    );
    let adopted = Recorded {
        recorded_position: end,
        ..from_recorded
    };
    let adoption = Adoption {
        from,
        to: slot.to_owned(),
    };
    Ok((adopted, Some(adoption)))
}

/// The one slot, other than the run's, that the lake records history of
/// `tables` from, when the lake records none from the run's own and that
/// slot was not released (`teardown`).
fn candidate(recorded: &Recorded, tables: &[TableName]) -> Option<String> {
    if !recorded.replicated.is_empty() {
        return None;
    }
    let mut slots = recorded
        .elsewhere
        .iter()
        .filter(|(table, _)| tables.iter().any(|t| t.to_string() == *table))
        .map(|(_, slot)| slot.as_str());
    let first = slots.next()?;
    let one = slots.all(|slot| slot == first) && !table_set::is_released(first);
    one.then(|| first.to_owned())
}

/// Where the lake's history from the old slot ends: the old slot's
/// confirmed position (the lake holds every change before it) where it
/// stands, and no further than the furthest position its tables record.
fn history_end(old: Option<&SlotInfo>, reach: Option<Lsn>) -> Option<Lsn> {
    match (old.and_then(|s| s.confirmed_flush_lsn), reach) {
        (Some(confirmed), Some(reach)) => Some(confirmed.min(reach)),
        (confirmed, reach) => confirmed.or(reach),
    }
}

/// Whether slot `slot` (`new`) may take up the lake's history from slot
/// `from` (`old`, if it exists), which ends at `end`.
fn judge(
    config: &PgConfig,
    slot: &str,
    new: &SlotInfo,
    from: &str,
    old: Option<&SlotInfo>,
    end: Option<Lsn>,
) -> Result<()> {
    let refusal = |message: String| {
        Error::new(ErrorKind::Slot, message)
            .with_context("slot", slot)
            .with_context("recorded_slot", from)
    };
    let refuse = |message: String| Err(refusal(message));
    let database = Some(config.dbname.as_str());
    if new.database.as_deref() != database || new.plugin.as_deref() != Some("pgoutput") {
        return refuse(format!(
            "replication slot {slot:?} is not a pgoutput slot of database {:?}, and the lake's \
             tables hold their history from slot {from:?}: give the run that slot (--slot \
             {from}), or a copy of it (SELECT pg_copy_logical_replication_slot('{from}', \
             '<copy>'))",
            config.dbname
        ));
    }
    if old.is_none_or(|old| old.database.as_deref() != database) {
        return refuse(format!(
            "the lake's tables hold their history from replication slot {from:?}, which does not \
             exist in database {:?}: nothing shows that slot {slot:?} is of the same server, nor \
             where it stands against the lake's history, and going on from it may leave a gap. \
             Load the tables afresh from slot {slot:?} (drop them: wal2iceberg drop-table \
             --table ..., or choose another --namespace)",
            config.dbname
        ));
    }
    let (Some(confirmed), Some(end)) = (new.confirmed_flush_lsn, end) else {
        return refuse(format!(
            "cannot tell where replication slot {slot:?} stands against the lake's history from \
             slot {from:?}: give the run slot {from:?} (--slot {from})"
        ));
    };
    if confirmed > end {
        let gap = confirmed.0 - end.0;
        return Err(refusal(format!(
            "replication slot {slot:?} stands at {confirmed}, {gap} bytes past {end}, where \
             the lake's history from slot {from:?} ends: the changes between them would \
             never reach the lake. Go on from slot {from:?} (--slot {from}), or from a copy \
             of it taken before it moved on; or load the tables afresh from slot {slot:?} \
             (wal2iceberg drop-table --table ..., or another --namespace)"
        ))
        .with_context("gap_bytes", gap)
        .with_context("lsn", confirmed));
    }
    Ok(())
}

/// Records `adoption` in the lake: each bronze table in `namespace` that
/// records the old slot records the new one. Done once the capture's
/// checks passed, before any table is written.
pub(crate) async fn record(
    lake: &Lake,
    namespace: &NamespaceIdent,
    adoption: &Adoption,
) -> Result<()> {
    let Adoption { from, to } = adoption;
    for bronze in table_set::recording(lake, namespace, from).await? {
        lake.set_properties(&bronze, &[(table_set::SOURCE_SLOT, to.clone())])
            .await?;
    }
    tracing::warn!(
        slot = %to,
        old_slot = %from,
        "the lake now follows replication slot {to:?}; slot {from:?} still exists and keeps WAL \
         for no one: drop it once nothing else reads it (SELECT pg_drop_replication_slot('{from}'))"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(confirmed: u64) -> SlotInfo {
        SlotInfo {
            plugin: Some("pgoutput".into()),
            database: Some("shop".into()),
            active_pid: None,
            streamed: false,
            confirmed_flush_lsn: Some(Lsn(confirmed)),
            wal_status: Some("reserved".into()),
        }
    }

    #[test]
    fn the_history_ends_where_the_old_slot_stands_and_no_further_than_the_lake_records() {
        assert_eq!(
            history_end(Some(&slot(100)), Some(Lsn(150))),
            Some(Lsn(100))
        );
        assert_eq!(
            history_end(Some(&slot(200)), Some(Lsn(150))),
            Some(Lsn(150))
        );
        assert_eq!(history_end(Some(&slot(100)), None), Some(Lsn(100)));
        assert_eq!(history_end(None, Some(Lsn(150))), Some(Lsn(150)));
    }

    #[test]
    fn a_slot_past_the_history_is_refused_with_the_gap_in_bytes() {
        let config = PgConfig::parse("postgres://u@localhost/shop").unwrap();
        let old = slot(100);
        assert!(
            judge(
                &config,
                "copy",
                &slot(100),
                "w2i",
                Some(&old),
                Some(Lsn(100))
            )
            .is_ok()
        );
        assert!(
            judge(
                &config,
                "copy",
                &slot(40),
                "w2i",
                Some(&old),
                Some(Lsn(100))
            )
            .is_ok()
        );
        let err = judge(
            &config,
            "fresh",
            &slot(164),
            "w2i",
            Some(&old),
            Some(Lsn(100)),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("64 bytes past 0/64"), "{err}");
        let err = judge(&config, "copy", &slot(40), "w2i", None, Some(Lsn(100)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
        let other_db = SlotInfo {
            database: Some("other".into()),
            ..slot(40)
        };
        assert!(
            judge(
                &config,
                "copy",
                &other_db,
                "w2i",
                Some(&old),
                Some(Lsn(100))
            )
            .is_err()
        );
    }
}
