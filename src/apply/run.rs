//! The pipeline's front door, [`run`]: it wires the apply pipeline to a
//! capture, and holds the reconnect loop, the lake's writer lock, the
//! slot's claim and the monitor. It settles which tables the run takes
//! (those named, and every table the lake holds from the slot), checks the
//! source before anything is created, takes the lake's writer lock, opens
//! the capture, loads what needs a load, and streams; a lost connection
//! or a resync starts it over.

use std::collections::HashMap;
use std::time::Duration;

use iceberg::NamespaceIdent;
use tokio::time::Instant;

use super::monitor::{self, MonitorOptions};
use super::naming::names;
use super::slot_adoption::{self, Adoption};
use super::table_set;
use super::{Pipeline, StreamEnd};
use super::{RunOptions, RunReport};
use crate::cdc::capture::{self, Capture, CaptureOptions, preflight_error};
use crate::cdc::snapshot::SnapshotLoad;
use crate::cdc::source::{Source, slot_in_use};
use crate::config::Backfill;
use crate::error::{Error, ErrorKind, Result, StorageFault};
use crate::failpoint;
use crate::lake::catalog::{Lake, namespace};
use crate::lake::lock::WriterLock;
use crate::metrics::metrics;
use crate::model::TableName;
use crate::pg::config::PgConfig;

/// The longest wait between reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How often a restart whose checks failed is tried again.
const PREFLIGHT_RETRIES: usize = 3;

/// Runs the pipeline. Once it has streamed, a lost connection or a server
/// restart is not the end: it reconnects with capped exponential backoff
/// and resumes from the slot (nothing committed is repeated, nothing
/// unconfirmed is lost). So is a lake's storage failing for the moment,
/// for `storage_retry_deadline` without a commit ([`StorageStreak`]). An
/// error before the first stream started (a wrong
/// host, a refused password, a failed check) ends the run at once; a
/// restart's failed checks are tried a few times more, settled again.
pub async fn run(config: &PgConfig, options: &RunOptions) -> Result<RunReport> {
    let mut total = RunReport::default();
    let mut backoff = Duration::from_millis(250);
    let mut streamed = false;
    let mut preflight_retries = 0;
    let mut storage: Option<StorageStreak> = None;
    // Taken by the first start and held to the end: a drop-table or a
    // compaction that came between two starts would act beside the run.
    let mut writer = None;
    loop {
        let mut started = false;
        if streamed {
            wait_for_slot_release(config, &options.capture.slot).await;
            failpoint::stall("restart").await;
        }
        // Boxed: a start's future is deep, and the deadline wraps it.
        let attempt = Box::pin(run_once(
            config,
            options,
            &mut started,
            &mut writer,
            &mut total,
        ));
        let ended = match &storage {
            Some(streak) => {
                streak
                    .bounded(attempt, options.run.storage_retry_deadline)
                    .await
            }
            None => attempt.await,
        };
        match ended {
            Ok(StreamEnd::Done) => return Ok(total),
            Ok(StreamEnd::Resync) if options.shutdown.is_requested() => return Ok(total),
            Ok(StreamEnd::Resync) => {
                streamed = true;
                backoff = Duration::from_millis(250);
                preflight_retries = 0;
            }
            // Before anything streamed, a store that does not answer is as
            // likely a wrong endpoint as a passing fault: it ends the run.
            Err(err)
                if err.storage_fault().is_some_and(StorageFault::is_transient)
                    && (started || streamed || total.batches > 0) =>
            {
                if options.shutdown.is_requested() {
                    return Ok(total);
                }
                streamed = true;
                let mut streak = match storage.take() {
                    Some(streak) if !streak.committed_since() => streak,
                    _ => StorageStreak::new(),
                };
                let Some(wait) = streak.next_wait(options.run.storage_retry_deadline) else {
                    return Err(streak.gave_up().with_source(err));
                };
                tracing::warn!(error = %err, attempt = streak.attempt, retry_in = ?wait, gives_up_in = ?options.run.storage_retry_deadline.saturating_sub(streak.since.elapsed()), "the lake's storage failed for the moment; starting again");
                tokio::time::sleep(wait).await;
                storage = Some(streak);
            }
            Err(err) if err.is_retryable() && (started || streamed) => {
                if options.shutdown.is_requested() {
                    return Ok(total);
                }
                if started {
                    backoff = Duration::from_millis(250);
                    preflight_retries = 0;
                }
                streamed = true;
                tracing::warn!(error = %err, retry_in = ?backoff, "cannot stream now (connection lost, server restarting, or no free slot); reconnecting");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            // The lake's storage refused (a full or read-only disk, denied
            // credentials): a person must act, however long it streamed.
            Err(err) if err.storage_fault().is_some() => return Err(err),
            // A restart's checks can meet DDL that raced them (a table
            // renamed after its names were settled): settled again, it
            // passes; a failure that stays ends the run.
            Err(err)
                if streamed
                    && err.kind() == ErrorKind::Preflight
                    && preflight_retries < PREFLIGHT_RETRIES =>
            {
                if options.shutdown.is_requested() {
                    return Ok(total);
                }
                preflight_retries += 1;
                tracing::warn!(error = %err, retry_in = ?backoff, "a restart's checks failed; settling the tables again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            // A SQL function reading the slot holds it for a moment (a
            // `verify` beside the run peeks it while no run streams, which
            // a restart's moments are): the start waits for it and goes
            // again. A consumer streaming from it ends the run.
            Err(err)
                if slot_in_use(&err) && !slot_streamed(config, &options.capture.slot).await =>
            {
                if options.shutdown.is_requested() {
                    return Ok(total);
                }
                streamed |= started;
                tracing::warn!(error = %err, "a SQL function reads the slot for a moment; starting again once it is free");
                wait_for_slot_release(config, &options.capture.slot).await;
            }
            // A TRUNCATE or rewrite of a table between a load's snapshot
            // and its lock, or another writer's schema change under a
            // batch's: nothing of either was committed, and the next start
            // does it again, from a new snapshot or from the stream.
            Err(err) if err.kind() == ErrorKind::Concurrent => {
                if options.shutdown.is_requested() {
                    return Ok(total);
                }
                streamed |= started;
                tracing::warn!(error = %err, retry_in = ?backoff, "a table changed under the load or the batch; starting again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(err) => return Err(err),
        }
    }
}

/// Transient storage faults in a row, with no Iceberg commit of the
/// process landing between them: a commit ends the streak.
struct StorageStreak {
    since: Instant,
    commits: u64,
    attempt: u32,
}

impl StorageStreak {
    fn new() -> StorageStreak {
        StorageStreak {
            since: Instant::now(),
            commits: metrics().iceberg_commits.get(),
            attempt: 0,
        }
    }

    fn committed_since(&self) -> bool {
        metrics().iceberg_commits.get() != self.commits
    }

    /// The error the run ends with once the streak outlasted its deadline.
    fn gave_up(&self) -> Error {
        Error::new(
            ErrorKind::Lake,
            format!(
                "the lake's storage kept failing for {} s with no commit landing \
                 (storage_retry_deadline); nothing past what the lake holds was confirmed, \
                 and the next start takes up from there",
                self.since.elapsed().as_secs()
            ),
        )
    }

    /// `attempt`, a start during the streak, ended when the deadline
    /// passes with no commit landing: a store that hangs rather than
    /// fails (each of its operations waits for opendal's timeouts and
    /// retries, a minute or more) is not waited for past it. Cancelling a
    /// start is what a crash does, which loses and repeats nothing.
    async fn bounded(
        &self,
        attempt: impl Future<Output = Result<StreamEnd>>,
        deadline: Duration,
    ) -> Result<StreamEnd> {
        let expired = async {
            tokio::time::sleep_until(self.since + deadline).await;
            if self.committed_since() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            ended = attempt => ended,
            () = expired => Err(self.gave_up()),
        }
    }

    /// How long to wait before the next try: exponential from 250 ms up
    /// to [`MAX_BACKOFF`], each wait drawn from its upper half (so that
    /// runs failing together do not come back together), never past the
    /// `deadline`; none once it passed.
    fn next_wait(&mut self, deadline: Duration) -> Option<Duration> {
        let left = deadline.checked_sub(self.since.elapsed())?;
        let ceiling =
            (Duration::from_millis(250) * 2u32.saturating_pow(self.attempt)).min(MAX_BACKOFF);
        self.attempt += 1;
        let jitter = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        let share = 0.5 + (jitter % 1000) as f64 / 2000.0;
        Some(ceiling.mul_f64(share).min(left))
    }
}

/// How long a restart waits for the server to let go of the slot.
const SLOT_RELEASE_WAIT: Duration = Duration::from_secs(60);

/// Waits, up to [`SLOT_RELEASE_WAIT`], until no process holds `slot`: the
/// walsender of this process's last replication connection outlives it
/// for a moment (until `wal_sender_timeout` when the connection was cut),
/// and the next start's preflight would find the slot in use. Errors are
/// left to that preflight.
async fn wait_for_slot_release(config: &PgConfig, slot: &str) {
    let Ok(source) = Source::connect(config).await else {
        return;
    };
    let give_up = Instant::now() + SLOT_RELEASE_WAIT;
    let mut told = false;
    while let Ok(Some(info)) = source.slot(slot).await {
        let Some(pid) = info.active_pid else {
            return;
        };
        if Instant::now() >= give_up {
            return;
        }
        if !told {
            tracing::info!(
                slot,
                pid,
                "waiting for the server to release the slot the last connection held"
            );
            told = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether a consumer streams from `slot` now (a walsender holds it);
/// false when that cannot be told, so that the start goes again and
/// meets what stands in its way anew.
async fn slot_streamed(config: &PgConfig, slot: &str) -> bool {
    let Ok(source) = Source::connect(config).await else {
        return false;
    };
    matches!(source.slot(slot).await, Ok(Some(info)) if info.streamed)
}

/// The tables a run takes, settled before anything is created: those
/// named and every table the lake holds from the slot (under its name at
/// the source now), with their Iceberg names; the lake's namespace and the
/// capture's options for them. Refused here: two tables of one Iceberg
/// name, a renamed table named by an old name another table has now, a
/// held table dropped and created again. `check` settles them the same way.
pub async fn settle(config: &PgConfig, options: &RunOptions) -> Result<Settled> {
    let namespace = namespace(options.namespace.as_deref().unwrap_or(&config.dbname));
    // Every table the lake holds from this slot, named or not: the slot's
    // position is shared, and confirming past a table's changes loses them.
    let mut tables = options.capture.tables.clone();
    let mut chosen = options.table_names.clone();
    let recorded_of = async |slot: &str| {
        table_set::replicated_tables(
            config,
            &options.lake,
            &namespace,
            slot,
            &options.capture.publication,
            &options.table_names,
        )
        .await
    };
    let recorded = recorded_of(&options.capture.slot).await?;
    // A lake whose history came from another slot of this database may
    // go on from this one, where it stands within that history.
    let (recorded, adoption) = slot_adoption::consider(
        config,
        recorded,
        &tables,
        &options.capture.slot,
        recorded_of,
    )
    .await?;
    let table_set::Recorded {
        replicated: held,
        elsewhere,
        recorded_position,
    } = recorded;
    // A table whose history came from another slot cannot go on from
    // this one: between the two slots' positions lies a gap.
    if let Some((table, other)) = elsewhere
        .iter()
        .find(|(table, _)| tables.iter().any(|t| t.to_string() == *table))
    {
        return Err(Error::new(
            ErrorKind::Preflight,
            format!(
                "the lake holds this table's history from replication slot {other:?}, not {:?}: \
                 it cannot go on from another slot, which would leave a gap. Run it on its own \
                 slot, or drop its Iceberg tables (wal2iceberg drop-table) to load it afresh",
                options.capture.slot
            ),
        )
        .with_context("table", table));
    }
    // A table renamed is the same table under its new name, whatever
    // `--tables` calls it; an old name another table has now is not that
    // one (names may have been swapped among held tables), and naming it
    // is refused unless `table_names` gives it Iceberg tables of its own.
    let mut named_by_old_name = Vec::new();
    for (h, (old, taken)) in held
        .iter()
        .flat_map(|h| h.old_names.iter().map(move |o| (h, o)))
    {
        if *taken && (chosen.contains_key(old) || held.iter().any(|h| h.table == *old)) {
            continue;
        }
        if *taken && tables.contains(old) {
            return Err(Error::new(
                ErrorKind::Preflight,
                "tables names a table the lake holds under another name now: it was renamed, \
                 and another table has its old name; name the renamed one as it is now",
            )
            .with_context("table", old));
        }
        if tables.contains(old) {
            tracing::warn!(
                table = %old, now = %h.table,
                "tables names a table by a name it had: taken as the table it is now; name it so \
                 (docs/tables.md, Schema changes)"
            );
            named_by_old_name.push(h.table.clone());
        }
        tables.retain(|t| t != old);
        chosen.remove(old);
    }
    let claimed = !held.is_empty();
    let history = held
        .iter()
        .filter(|h| h.history)
        .map(|h| h.table.clone())
        .collect();
    for held in held {
        if !tables.contains(&held.table) {
            if !named_by_old_name.contains(&held.table) {
                tracing::warn!(
                    table = %held.table,
                    "not named in tables, but the lake replicates it from this slot: applied \
                     too, since the slot's position is shared (docs/tables.md, The table set)"
                );
            }
            tables.push(held.table.clone());
        }
        // The Iceberg tables it is in are the ones its bronze recorded.
        chosen.insert(held.table, held.iceberg);
    }
    let names = names(&tables, &chosen)?;
    let mut capture = options.capture.clone();
    capture.to_lake = true;
    capture.claimed = claimed;
    capture.history = history;
    capture.recorded_position = recorded_position;
    capture.tables = tables;
    Ok(Settled {
        namespace,
        names,
        capture,
        adoption,
    })
}

/// What [`settle`] settled.
pub struct Settled {
    pub(crate) namespace: NamespaceIdent,
    /// The Iceberg name of each table.
    pub(crate) names: HashMap<TableName, String>,
    /// The capture's options for the tables.
    pub capture: CaptureOptions,
    /// The lake's history from another slot, which this one takes up.
    pub(crate) adoption: Option<Adoption>,
}

/// One connection's worth of the pipeline; `started` is set once the
/// stream runs, `writer` holds the lake's writer lock once taken, and
/// `total` gathers what was applied.
async fn run_once(
    config: &PgConfig,
    options: &RunOptions,
    started: &mut bool,
    writer: &mut Option<WriterLock>,
    total: &mut RunReport,
) -> Result<StreamEnd> {
    let Settled {
        namespace,
        names,
        capture: mut capture_options,
        adoption,
        ..
    } = settle(config, options).await?;
    // Every check before anything is created or changed at the source or
    // in the lake: a run refused here leaves no slot, publication, lake
    // folder or table behind; `check` gives the same answer. A second run
    // on the same slot and lake is told about the lake too.
    let failures = capture::check(config, &capture_options).await?;
    if !failures.is_empty() {
        return Err(preflight_error(&failures));
    }
    let mut held = writer.take();
    let lost = match held.as_mut() {
        Some(lock) => !lock.holds().await,
        None => false,
    };
    let lock = match held {
        Some(lock) if lost => {
            // Lost with its catalog connection: another process may hold
            // it now (a compaction), and the run waits for it; the lost
            // lock stays, so the next start knows to wait too.
            tracing::warn!(namespace = %namespace.join("."), "the lake's writer lock went with its catalog connection; taking it again");
            match WriterLock::acquire(&options.lake, &namespace).await {
                Ok(taken) => taken,
                Err(e) => {
                    *writer = Some(lock);
                    return Err(Error::new(
                        ErrorKind::Connection,
                        "cannot take the lake's writer lock again",
                    )
                    .with_source(e));
                }
            }
        }
        Some(lock) => lock,
        None => WriterLock::acquire(&options.lake, &namespace).await?,
    };
    let lake = Lake::open(&options.lake).await?;
    let mut pipeline = Pipeline::new(lake, namespace, names, options, total);
    pipeline.commit_under(writer.insert(lock));
    capture_options.held_tables = Some(pipeline.loaded_tables(&capture_options.tables).await?);
    capture_options.backfill_chunked = options.run.backfill == Backfill::Chunked;
    capture_options.reload_whole = std::mem::take(&mut pipeline.reload_whole);
    // The lake claims a slot before it is made: its bronze tables record
    // the slot from the start, so a later run tells its own slot (one a
    // crash left before the load landed too) from another lake's.
    let mut claim = None;
    if !capture_options.claimed && !capture::slot_exists(config, &capture_options.slot).await? {
        let tables = capture::describe(config, &capture_options.tables).await?;
        claim = Some(pipeline.claim(&tables).await?);
        capture_options.claimed = true;
        capture_options.new_slot = true;
    }
    let opened = capture::open(config, &capture_options).await;
    // Another run made the slot first: the claim is withdrawn, so that no
    // later run of this lake takes up a slot that is another's.
    if let (Err(e), Some(made)) = (&opened, &claim)
        && e.sqlstate() == Some(capture::DUPLICATE_OBJECT)
    {
        pipeline.withdraw(made).await?;
    }
    let opened = opened?;
    if let Some(adoption) = &adoption {
        pipeline.adopt(adoption).await?;
    }
    let (load, mut pending, new_slot, chunked) = match opened {
        Capture::Fresh {
            load,
            pending,
            chunked,
        } => (Some(load), pending, true, chunked),
        Capture::Resume {
            load,
            pending,
            chunked,
        } => (load, pending, false, chunked),
    };
    let relations = capture::describe(config, &chunked).await?;
    pipeline
        .begin_backfills(&relations, options.run.backfill_chunk_rows)
        .await?;
    // A slot just made has nothing to stream before its load; on one that
    // streamed, the tables to load are loaded beside the stream.
    let (beside, first) = match load {
        Some(load) if !new_slot => (Some(load), None),
        load => (None, load),
    };
    if let Some(load) = first
        && !pipeline.load(load, config, options).await?
    {
        return Ok(StreamEnd::Done);
    }
    let loading = beside.as_ref().map_or(&[][..], SnapshotLoad::tables);
    // Open every other table (rebuilding silver's key index) while the
    // replication connection may still idle.
    let mut relations = pending.describe_tables().await?;
    relations.retain(|r| !loading.contains(&r.name));
    pipeline.open(&relations).await?;
    let _monitor = monitor::start(
        config,
        MonitorOptions {
            slot: options.capture.slot.clone(),
            interval: options.monitor_interval,
            heartbeat: options.run.heartbeat_interval,
            retained_wal_warn_bytes: options.run.retained_wal_warn_bytes,
        },
    )
    .await?;
    // Where the slot stands, the lake records: the check found it does,
    // or its tables record no mark yet (docs/tables.md, The table set).
    pipeline.mark_unmarked(pending.start_lsn()).await?;
    let mut stream = if options.run.exit_when_idle.is_some() {
        pending.start_to_end_when_idle().await?
    } else {
        pending.start().await?
    };
    *started = true;
    pipeline.start_backfills(config, options.run.load_connections);
    stream.record(stream.confirmed()).await?;
    pipeline.confirmed(stream.confirmed());
    let streamed = match beside {
        Some(load) => {
            let (streamed, load_failed) = pipeline
                .stream_beside(&mut stream, load, config, options)
                .await;
            // A load that keeps failing is retried with a growing wait.
            *started &= !load_failed;
            streamed
        }
        None => pipeline.stream(&mut stream, options).await,
    };
    let end = match streamed {
        Ok(end) => end,
        Err(e) => {
            pipeline.abandon();
            return Err(e);
        }
    };
    // Keepalives may have moved the slot past the last batch while idle.
    pipeline.confirmed(stream.confirmed());
    stream.stop().await?;
    pipeline.persist_indexes();
    Ok(end)
}
