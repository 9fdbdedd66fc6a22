//! The `wal2iceberg` command line.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use iceberg::TableIdent;
use wal2iceberg::apply::RunOptions;
use wal2iceberg::cdc::capture::{self, CaptureOptions};
use wal2iceberg::config::{LakeSettings, LogFormat, Raw, Settings};
use wal2iceberg::error::OutputClosed;
use wal2iceberg::lake::catalog::Lake;
use wal2iceberg::lake::lock::WriterLock;
use wal2iceberg::lake::maintenance::expire::{
    DEFAULT_RETENTION, Retention, expire_snapshots, remove_orphan_files,
};
use wal2iceberg::model::Lsn;
use wal2iceberg::ops::show::{Format, ShowOptions};
use wal2iceberg::ops::tail::{TailOptions, TailSlot, tail};
use wal2iceberg::pg::source::SLOT_HELD_BY_RUN;
use wal2iceberg::shutdown::Shutdown;
use wal2iceberg::{Error, ErrorKind};

#[derive(Parser)]
#[command(
    name = "wal2iceberg",
    version,
    about = "Replicate PostgreSQL tables into Apache Iceberg tables"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Settings, from flags over `WAL2ICEBERG_*` variables over the config
/// file (docs/configuration.md).
#[derive(clap::Args)]
struct SettingsArgs {
    /// A TOML file with any of the settings below.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    flags: Raw,
}

impl SettingsArgs {
    fn resolve(self) -> Result<Settings, Error> {
        Settings::resolve(self.config.as_deref(), std::env::vars(), self.flags)
    }

    /// The lake's settings alone, for the commands that read or maintain
    /// it; logging started as they say. `--tables` is refused there: those
    /// commands name their tables as arguments, and one ignored would act
    /// on every table.
    fn lake(self) -> Result<LakeSettings, Error> {
        if self.flags.tables.is_some() {
            return Err(Error::new(
                ErrorKind::Config,
                "--tables: this command takes its tables as arguments (or --table)",
            ));
        }
        let settings = LakeSettings::resolve(self.config.as_deref(), std::env::vars(), self.flags)?;
        init_logging(settings.log_format);
        Ok(settings)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Replicate the tables into the lake: bronze `<table>_changes` and
    /// silver `<table>`, initial load first when the slot is new.
    Run {
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Run every preflight check and print each failure with its fix;
    /// exit 0 only when a run would start.
    Check {
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// The slot (activity, confirmed position, retained WAL, lag) and each
    /// lake table's last source transaction and its lag.
    Status {
        #[command(flatten)]
        settings: SettingsArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Drop the replication slot and the publication wal2iceberg created
    /// (one made by someone else is kept); the lake's tables only with
    /// --drop-tables.
    Teardown {
        #[command(flatten)]
        settings: SettingsArgs,
        /// Also drop every Iceberg table of the namespace, with its files.
        #[arg(long)]
        drop_tables: bool,
        /// Drop the slot even when it holds changes the lake lacks.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Prepare the source as an owner or superuser: the wal2iceberg role
    /// and publication (migrations/), SELECT on the tables, the tables in
    /// the publication. Safe to run again.
    Setup {
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Take one source table out of the lake: drop its bronze and silver
    /// tables with their files, so runs no longer apply it, and remove it
    /// from the publication if wal2iceberg made that. Refused while a run
    /// writes the lake.
    DropTable {
        #[command(flatten)]
        settings: SettingsArgs,
        /// The source table (`public.orders`).
        #[arg(long = "table", value_name = "TABLE")]
        table: String,
        /// Do not ask before dropping.
        #[arg(long)]
        yes: bool,
    },
    /// Reload one table's silver from a new snapshot while the stream goes
    /// on: bronze keeps its history and gets the reload's rows as reads. A
    /// streaming run does it within seconds, or the next run when it starts.
    Resync {
        #[command(flatten)]
        settings: SettingsArgs,
        /// The source table (`public.orders`).
        #[arg(long = "table", value_name = "TABLE")]
        table: String,
        /// Wait this long for a run to do it (30s, 5m); exit 1 if none did.
        #[arg(long, value_name = "DURATION")]
        wait: Option<String>,
    },
    /// Print a lake table through wal2iceberg's own reader.
    Show {
        /// The table: `customers`, `customers_changes`, or `shop.customers`.
        table: String,
        #[command(flatten)]
        settings: SettingsArgs,
        /// At most this many rows.
        #[arg(long)]
        limit: Option<usize>,
        /// The table as of a source LSN (e.g. 0/1A2B3C8): the newest
        /// snapshot holding nothing committed after it.
        #[arg(long, value_name = "LSN")]
        as_of: Option<Lsn>,
        /// table, json or csv.
        #[arg(long, default_value = "table")]
        format: Format,
    },
    /// Expire snapshots older than --older-than, keeping the newest
    /// --retain-last however old, and delete the files only they read,
    /// and files nothing refers to older than --older-than and one hour.
    ExpireSnapshots {
        /// Tables (`customers`, `customers_changes`, `shop.customers`)
        /// [default: every table of the namespace].
        #[arg(value_name = "TABLES")]
        lake_tables: Vec<String>,
        #[command(flatten)]
        settings: SettingsArgs,
        /// Expire snapshots older than this (30m, 2h, 7d).
        #[arg(long, value_name = "DURATION")]
        older_than: String,
        /// Keep the newest this many snapshots however old (as run keeps).
        #[arg(long, value_name = "N", default_value_t = DEFAULT_RETENTION.retain_last)]
        retain_last: usize,
    },
    /// Compare the source, read in one snapshot while writers go on, with
    /// bronze replayed to the same position, and silver with bronze at
    /// silver's position: rows, checksums, differing keys (docs/operations.md).
    /// Exit 1 when anything differs.
    Verify {
        #[command(flatten)]
        settings: SettingsArgs,
        /// How long to wait for the run to bring the lake to the source's
        /// position (30s, 5m).
        #[arg(long, value_name = "DURATION", default_value = "60s")]
        wait: String,
    },
    /// Compact tables now, as a run does by itself after commits: merge
    /// small files, drop deleted rows, merge delete files; refused while a
    /// run writes the namespace.
    Compact {
        /// Tables (`customers`, `customers_changes`, `shop.customers`)
        /// [default: every table of the namespace].
        #[arg(value_name = "TABLES")]
        lake_tables: Vec<String>,
        /// A table, as the positional ones; may be repeated.
        #[arg(long = "table", value_name = "TABLE")]
        table: Vec<String>,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Print the decoded change stream as JSON lines. Without --slot, from
    /// a temporary slot of its own (the tables' current rows first, then
    /// their changes); with --slot, from that existing slot without
    /// consuming it, unless --consume.
    Tail {
        #[command(flatten)]
        settings: SettingsArgs,
        /// Confirm each transaction once printed on the named slot (created
        /// if missing): a run on that slot never sees those changes.
        #[arg(long)]
        consume: bool,
    },
    /// Run the seed walkthrough against a throwaway local PostgreSQL
    /// (server binaries found as in docs/testing.md) and print each step.
    Demo,
}

/// `tables` resolved in the lake, or every table of the namespace (the
/// lake's only one when `namespace` is not given).
async fn lake_idents(
    lake: &Lake,
    namespace: Option<&str>,
    tables: &[String],
) -> Result<Vec<TableIdent>, Error> {
    if tables.is_empty() {
        return lake.tables(namespace).await;
    }
    let mut idents = Vec::new();
    for table in tables {
        idents.push(lake.resolve_table(table, namespace).await?);
    }
    Ok(idents)
}

/// The standard output, with EPIPE marked as [`OutputClosed`].
struct Stdout;

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stdout().lock().write(buf).map_err(closed)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().lock().flush().map_err(closed)
    }
}

fn closed(err: std::io::Error) -> std::io::Error {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        std::io::Error::new(std::io::ErrorKind::BrokenPipe, OutputClosed)
    } else {
        err
    }
}

/// `print!` to [`Stdout`], returning the error instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        std::io::Write::write_fmt(&mut Stdout, format_args!($($arg)*)).map_err(Error::from)?
    };
}

/// `println!` to [`Stdout`], returning the error instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        out!("{}\n", format_args!($($arg)*))
    };
}

/// The settings only `run` reads.
const RUN_TUNING: &[&str] = &[
    "flush_interval",
    "max_batch_rows",
    "max_batch_bytes",
    "compact_after_files",
    "load_connections",
    "snapshot_retention",
    "retain_snapshots",
    "metrics_addr",
    "heartbeat_interval",
    "retained_wal_warn_bytes",
    "storage_retry_deadline",
];
/// Read by `run` and `tail`.
const IDLE: &[&str] = &["exit_when_idle"];
const STREAM: &[&str] = &["proto_version", "streaming"];
const LAKE: &[&str] = &[
    "lake",
    "catalog",
    "warehouse",
    "catalog_property",
    "namespace",
];
/// Read by the commands that reach the source.
const SOURCE: &[&str] = &[
    "source",
    "tables",
    "slot",
    "publication",
    "state_dir",
    "atomic_commits",
];

/// Each command's settings flags that it does not read. They stay
/// accepted, so that scripts passing one set of flags to every command
/// keep working, and are left out of the command's `--help`.
const UNREAD: &[(&str, &[&[&str]])] = &[
    ("check", &[RUN_TUNING, IDLE]),
    (
        "status",
        &[RUN_TUNING, IDLE, STREAM, &["tables", "publication"]],
    ),
    ("teardown", &[RUN_TUNING, IDLE, STREAM, &["tables"]]),
    (
        "setup",
        &[RUN_TUNING, IDLE, STREAM, LAKE, &["slot", "publication"]],
    ),
    (
        "drop-table",
        &[RUN_TUNING, IDLE, STREAM, &["tables", "slot"]],
    ),
    (
        "resync",
        &[RUN_TUNING, IDLE, STREAM, &["tables", "slot", "publication"]],
    ),
    ("verify", &[RUN_TUNING, IDLE, STREAM]),
    ("tail", &[RUN_TUNING, LAKE]),
    ("show", &[RUN_TUNING, IDLE, STREAM, SOURCE]),
    ("expire-snapshots", &[RUN_TUNING, IDLE, STREAM, SOURCE]),
    ("compact", &[RUN_TUNING, IDLE, STREAM, SOURCE]),
];

/// The command line, each command's help showing the flags it reads.
fn command() -> clap::Command {
    UNREAD.iter().fold(Cli::command(), |cli, (name, groups)| {
        cli.mut_subcommand(*name, |command| {
            groups
                .iter()
                .flat_map(|group| group.iter())
                .fold(command, |command, id| {
                    command.mut_arg(*id, |arg| arg.hide(true))
                })
        })
    })
}

/// mimalloc 2, not the system allocator: glibc's per-thread arenas kept
/// freed batches and Parquet buffers, so a load of 10^7 rows with a
/// 92 MB heap peaked at 231 MB resident; with mimalloc 2 at 160 MB.
/// mimalloc 3 (the crate's default) holds freed memory for 10 s before
/// it returns it, and peaked at 213 to 228 MB (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
        .unwrap_or_else(|e| e.exit());
    match run(cli).await {
        Ok(code) => code,
        // `wal2iceberg show t | head -1`: the reader has what it wanted.
        Err(err) if err.is_output_closed() => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            match err.kind() {
                ErrorKind::Config => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "wal2iceberg=info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves the settings and starts logging as they say.
fn settings(args: SettingsArgs) -> Result<Settings, Error> {
    let settings = args.resolve()?;
    init_logging(settings.log_format);
    Ok(settings)
}

/// The capture options, with the tables of the existing publication when
/// none are named.
async fn capture_options(settings: &Settings) -> Result<CaptureOptions, Error> {
    let mut options = settings.capture_options();
    capture::resolve_tables(&settings.source, &mut options).await?;
    Ok(options)
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Run { settings: args } => {
            let settings = settings(args)?;
            let options = RunOptions {
                shutdown: Shutdown::on_signals()?,
                ..RunOptions::from_settings(&settings, capture_options(&settings).await?)
            };
            let summary =
                wal2iceberg::ops::run::run(&settings.source, &options, settings.metrics_addr)
                    .await?;
            outln!("{summary}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { settings: args } => {
            let settings = settings(args)?;
            // What `run` checks, on the tables it would take: those the
            // lake holds from the slot too, under their Iceberg names.
            let run_options =
                RunOptions::from_settings(&settings, capture_options(&settings).await?);
            let settled = wal2iceberg::apply::settle(&settings.source, &run_options).await?;
            let failures = capture::check(&settings.source, &settled.capture).await?;
            if failures.is_empty() {
                outln!("all checks passed: {}", settings.source);
                return Ok(ExitCode::SUCCESS);
            }
            for failure in &failures {
                outln!("{failure}");
            }
            // A run holding the slot is no fault: exit 3, apart from 1.
            if failures.iter().all(|f| f.check == SLOT_HELD_BY_RUN) {
                outln!("all other checks passed: {}", settings.source);
                return Ok(ExitCode::from(3));
            }
            Ok(ExitCode::from(1))
        }
        Command::Status {
            settings: args,
            json,
        } => {
            let settings = settings(args)?;
            let status = wal2iceberg::ops::status::status(
                &settings.source,
                &settings.slot,
                &settings.publication,
                &settings.lake,
                settings.namespace.as_deref(),
            )
            .await?;
            if json {
                let text = serde_json::to_string_pretty(&status).map_err(|e| {
                    Error::new(ErrorKind::Io, "cannot print the status").with_source(e)
                })?;
                outln!("{text}");
            } else {
                out!("{}", status.to_text());
            }
            Ok(
                if status.unreachable() || status.lake_missing() || status.other_slots().is_some() {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                },
            )
        }
        Command::Teardown {
            settings: args,
            drop_tables,
            force,
            yes,
        } => teardown(settings(args)?, drop_tables, force, yes).await,
        Command::DropTable {
            settings: args,
            table,
            yes,
        } => drop_table(settings(args)?, &table, yes).await,
        Command::Resync {
            settings: args,
            table,
            wait,
        } => resync(settings(args)?, &table, wait.as_deref()).await,
        Command::Setup { settings: args } => {
            let settings = settings(args)?;
            if settings.tables.is_empty() {
                return Err(Error::new(
                    ErrorKind::Config,
                    "tables: none given; setup needs the tables to publish (--tables)",
                ));
            }
            wal2iceberg::ops::setup::setup(&settings.source, &settings.tables).await?;
            outln!(
                "role {} may read {} table(s), published in {}; give the role a password or another way to log in",
                wal2iceberg::ops::setup::ROLE,
                settings.tables.len(),
                wal2iceberg::ops::setup::PUBLICATION
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Show {
            table,
            settings: args,
            limit,
            as_of,
            format,
        } => {
            let settings = args.lake()?;
            let lake = Lake::open_existing(&settings.lake).await?;
            let ident =
                wal2iceberg::ops::show::resolve(&lake, &table, settings.namespace.as_deref())
                    .await?;
            let options = ShowOptions {
                limit,
                as_of,
                format,
                ..ShowOptions::default()
            };
            out!(
                "{}",
                wal2iceberg::ops::show::show(&lake, &ident, &options).await?
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::ExpireSnapshots {
            lake_tables,
            settings: args,
            older_than,
            retain_last,
        } => {
            let settings = args.lake()?;
            let older_than = wal2iceberg::config::parse_duration("older_than", &older_than)
                .map_err(|e| Error::new(ErrorKind::Config, format!("--older-than: {e}")))?;
            if retain_last == 0 {
                return Err(Error::new(
                    ErrorKind::Config,
                    "--retain-last must be at least 1: the current snapshot is always kept",
                ));
            }
            let lake = Lake::open_existing(&settings.lake).await?;
            let idents = lake_idents(&lake, settings.namespace.as_deref(), &lake_tables).await?;
            // Beside a run its commits would win every race, for nothing:
            // a run expires its tables itself.
            let _locks = WriterLock::acquire_all(&settings.lake, &idents).await?;
            let retention = Retention {
                older_than,
                retain_last,
            };
            for ident in idents {
                let mut expired = expire_snapshots(&lake, &ident, retention).await?;
                if expired.snapshots == 0 {
                    expired.orphans_deleted =
                        remove_orphan_files(&lake, &ident, older_than).await?;
                }
                outln!(
                    "{ident}: {} snapshots expired, {} files deleted, {} orphan files deleted",
                    expired.snapshots,
                    expired.files_deleted,
                    expired.orphans_deleted
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Compact {
            mut lake_tables,
            table,
            settings: args,
        } => {
            let settings = args.lake()?;
            lake_tables.extend(table);
            let lake = Lake::open_existing(&settings.lake).await?;
            let idents = lake_idents(&lake, settings.namespace.as_deref(), &lake_tables).await?;
            let done = wal2iceberg::ops::compact::compact(&lake, &settings.lake, &idents).await?;
            for (ident, c) in done {
                outln!(
                    "{ident}: {} data files merged into {}, {} delete files into {}, {} rows rewritten",
                    c.data_files_removed,
                    c.data_files_added,
                    c.delete_files_removed,
                    c.delete_files_added,
                    c.rows_rewritten
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify {
            settings: args,
            wait,
        } => {
            let wait = wal2iceberg::config::parse_duration("wait", &wait)
                .map_err(|e| Error::new(ErrorKind::Config, format!("--wait: {e}")))?;
            let settings = settings(args)?;
            let options = RunOptions::from_settings(&settings, capture_options(&settings).await?);
            let report = wal2iceberg::ops::verify::verify(&settings.source, &options, wait).await?;
            out!("{}", report.to_text());
            Ok(if report.equal() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Tail {
            settings: args,
            consume,
        } => {
            let settings = settings(args)?;
            let options = TailOptions {
                capture: capture_options(&settings).await?,
                exit_when_idle: settings.exit_when_idle,
                slot: match (settings.slot_named, consume) {
                    (_, true) => TailSlot::Consume,
                    (true, false) => TailSlot::Peek,
                    (false, false) => TailSlot::Temporary,
                },
                lake: Some((settings.lake.clone(), settings.lake_namespace())),
                shutdown: Shutdown::on_signals()?,
            };
            tail(&settings.source, &options, &mut Stdout).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo => {
            init_logging(LogFormat::Text);
            wal2iceberg::ops::demo::demo(&mut Stdout).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn teardown(
    settings: Settings,
    drop_tables: bool,
    force: bool,
    yes: bool,
) -> Result<ExitCode, Error> {
    let config = &settings.source;
    let (slot, publication) = (&settings.slot, &settings.publication);
    let what = format!(
        "slot {slot:?} and publication {publication:?} on {}:{}/{}{}",
        config.host,
        config.port,
        config.dbname,
        if drop_tables {
            format!(" and every table of the lake {}", settings.lake.catalog)
        } else {
            String::new()
        }
    );
    if !yes && !confirm(&what)? {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "teardown of {what} not confirmed: nothing dropped (pass --yes to skip the question)"
            ),
        ));
    }
    let options = wal2iceberg::ops::teardown::TeardownOptions {
        slot: slot.clone(),
        publication: publication.clone(),
        lake: settings.lake.clone(),
        namespace: settings.lake_namespace(),
        drop_tables: drop_tables.then(|| settings.state_dir.clone()),
        force,
    };
    let report = wal2iceberg::ops::teardown::teardown(config, &options).await?;
    outln!(
        "slot {slot}: {}",
        if report.slot_dropped {
            "dropped"
        } else {
            "did not exist"
        }
    );
    for table in &report.released {
        outln!(
            "table {table}: kept; it no longer claims slot {slot}, so a slot made later under \
             that name is not taken for its own (its history cannot go on from a new slot)"
        );
    }
    use wal2iceberg::ops::teardown::Publication;
    outln!(
        "publication {publication}: {}",
        match &report.publication {
            Publication::Dropped => "dropped".to_owned(),
            Publication::DidNotExist => "did not exist".to_owned(),
            Publication::NotOurs => "kept (not created by wal2iceberg)".to_owned(),
            Publication::SharedWith(slots) => format!(
                "kept: other slots of this database may read it ({}); a teardown of the last one drops it",
                slots.join(", ")
            ),
            Publication::NotPermitted(sql) => format!(
                "NOT dropped: only its owner or a superuser may; as one, run teardown again or: {sql}"
            ),
        }
    );
    for table in &report.tables_dropped {
        outln!("table {table}: dropped");
    }
    Ok(if report.incomplete() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

async fn resync(settings: Settings, table: &str, wait: Option<&str>) -> Result<ExitCode, Error> {
    use wal2iceberg::ops::resync::{self, Resync, ResyncOptions};
    let wait = wait
        .map(|w| wal2iceberg::config::parse_duration("wait", w))
        .transpose()
        .map_err(|e| Error::new(ErrorKind::Config, format!("--wait: {e}")))?;
    let table = wal2iceberg::model::TableName::parse(table)?;
    let options = ResyncOptions {
        name: settings.table_names.get(&table).cloned(),
        namespace: settings.lake_namespace(),
        lake: settings.lake.clone(),
        wait,
        table,
    };
    match resync::request(&options).await? {
        Resync::Requested { id, bronze } => outln!(
            "resync of {} requested ({id}, on {bronze}): a streaming run does it within {:?}, \
             or the next run when it starts",
            options.table,
            wal2iceberg::apply::resync::POLL
        ),
        Resync::Done { id, .. } => outln!("{} resynced ({id})", options.table),
    }
    Ok(ExitCode::SUCCESS)
}

async fn drop_table(settings: Settings, table: &str, yes: bool) -> Result<ExitCode, Error> {
    use wal2iceberg::ops::drop_table::{DropTableOptions, PublicationMembership};
    let table = wal2iceberg::model::TableName::parse(table)?;
    let what = format!(
        "the lake's tables of {table} in {}, with their files",
        settings.lake.catalog
    );
    if !yes && !confirm(&what)? {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "drop of {what} not confirmed: nothing dropped (pass --yes to skip the question)"
            ),
        ));
    }
    let options = DropTableOptions {
        name: settings.table_names.get(&table).cloned(),
        namespace: settings.lake_namespace(),
        lake: settings.lake.clone(),
        publication: settings.publication.clone(),
        state_dir: settings.state_dir.clone(),
        table,
    };
    let report = wal2iceberg::ops::drop_table::drop_table(&settings.source, &options).await?;
    if report.dropped.is_empty() {
        outln!("the lake holds no tables of {}", options.table);
    }
    for ident in &report.dropped {
        outln!("table {ident}: dropped, files deleted");
    }
    let publication = &options.publication;
    outln!(
        "publication {publication}: {}",
        match &report.publication {
            PublicationMembership::Removed => format!("{} removed", options.table),
            PublicationMembership::NotAMember => format!("did not hold {}", options.table),
            PublicationMembership::NotOurs =>
                format!("kept {} (not created by wal2iceberg)", options.table),
            PublicationMembership::NotPermitted(sql) => format!(
                "still holds {}: only its owner or a superuser may change it; as one, run: {sql}",
                options.table
            ),
        }
    );
    if let Some(slot) = &report.slot_left {
        outln!(
            "slot {slot}: the lake holds no other table from it, and it retains WAL until \
             dropped; if nothing else reads it, drop it (wal2iceberg teardown --slot {slot}); \
             until then a run of this lake on it is refused as another lake's"
        );
    }
    Ok(if report.incomplete() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Asks on the terminal; without one there is nobody to ask.
fn confirm(what: &str) -> Result<bool, Error> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("drop {what}? type yes to confirm: ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim() == "yes")
}
