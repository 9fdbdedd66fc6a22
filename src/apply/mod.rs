//! The apply pipeline: change events and load rows in, Iceberg commits
//! out, and the slot confirmed behind them.
//!
//! A change goes from the stream (`cdc::stream`) into the open batch
//! (`pipeline`), whose commit `policy` says when; each source table's
//! `sink` stages it into its bronze and silver tables (`lake::table::bronze`,
//! `lake::table::silver`). At a flush every sink commits, `housekeeping`
//! compacts and expires, and only then the batch's end is confirmed. The
//! initial load (`load`) takes the same path in runs of rows. `naming`
//! says which Iceberg tables a source table lands in, `table_set` which
//! tables a lake replicates from its slot, `resync` the requests for a
//! table's reload that a run takes up (`rewrite` makes one for DDL that
//! rewrote a table's rows), `slot_marks` records positions of the slot no
//! table's snapshot does, `index_persistence` keeps what outlives a
//! connection (silver's key indexes), `load_beside_stream` loads tables
//! while the others stream, `monitor` watches the slot's lag and retained
//! WAL while a run streams, and `run` is the front door that drives them.
//!
//! Exactly once: every snapshot records the highest source commit LSN it
//! fully contains. At start each table's recorded LSN is read back, and a
//! transaction at or below it is skipped for that table, so a crash between
//! the Iceberg commits and the confirmation replays nothing twice.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cdc::capture::CaptureOptions;
use crate::config::{RunSettings, Settings};
use crate::lake::catalog::LakeLocation;
use crate::model::Lsn;
use crate::model::TableName;
use crate::shutdown::Shutdown;

pub(crate) mod backfill;
mod flush;
mod housekeeping;
mod index_persistence;
mod load;
mod load_beside_stream;
pub(crate) mod monitor;
pub(crate) mod naming;
mod pipeline;
mod policy;
pub mod resync;
mod rewrite;
mod run;
mod sink;
pub(crate) mod slot_adoption;
mod slot_marks;
pub mod table_set;
mod tally;

pub use load::load_columns;
pub use naming::iceberg_name;
pub use pipeline::{Pipeline, StreamEnd};
pub use run::{Settled, run, settle};

/// Snapshots are expired at least this often, in silver commits.
pub(crate) const EXPIRE_EVERY_COMMITS: usize = 100;

pub struct RunOptions {
    pub capture: CaptureOptions,
    /// The embedded lake: its catalog file and warehouse.
    pub lake: LakeLocation,
    /// Where the silver key indexes are kept between starts, a folder per
    /// namespace and table.
    pub state_dir: std::path::PathBuf,
    /// Iceberg namespace; the source database's name when unset.
    pub namespace: Option<String>,
    /// Iceberg names chosen for source tables instead of [`iceberg_name`].
    pub table_names: BTreeMap<TableName, String>,
    /// How the run goes about its work: the settings' own.
    pub run: RunSettings,
    /// How often the slot's state is read for metrics and warnings.
    pub monitor_interval: Duration,
    /// Stop at the next safe point once requested: commit the batch if it
    /// holds only complete transactions, abandon it (to be streamed again
    /// after a restart) if a transaction is still arriving.
    pub shutdown: Shutdown,
}

impl RunOptions {
    /// The defaults: namespace from the database, flush every second or
    /// at the batch limits, run until stopped.
    pub fn new(capture: CaptureOptions, lake: impl Into<LakeLocation>) -> RunOptions {
        let lake = lake.into();
        RunOptions {
            capture,
            state_dir: lake.default_state_dir(),
            lake,
            namespace: None,
            table_names: BTreeMap::new(),
            run: RunSettings::DEFAULT,
            monitor_interval: monitor::DEFAULT_INTERVAL,
            shutdown: Shutdown::default(),
        }
    }

    /// What `settings` say, for `capture`; stopped only through
    /// [`Shutdown`]'s default unless the caller sets one.
    pub fn from_settings(settings: &Settings, capture: CaptureOptions) -> RunOptions {
        RunOptions {
            capture,
            lake: settings.lake.clone(),
            state_dir: settings.state_dir.clone(),
            namespace: settings.namespace.clone(),
            table_names: settings.table_names.clone(),
            run: settings.run.clone(),
            monitor_interval: monitor::DEFAULT_INTERVAL,
            shutdown: Shutdown::default(),
        }
    }
}

/// What a run did, for the caller to print.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub changes_applied: u64,
    pub batches: u64,
    /// The position the slot was left at.
    pub confirmed: Lsn,
}
