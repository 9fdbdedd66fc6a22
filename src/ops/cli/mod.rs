//! The `wal2iceberg` command line: its commands and their flags
//! (`Command`), each command's help showing the flags it reads, and the
//! settings resolved once and handed to the commands (`commands.rs`).
//! `src/main.rs` only sets the allocator and calls [`main`].

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

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::cdc::capture::{self, CaptureOptions};
use crate::config::{LakeSettings, LogFormat, Raw, RunSettings, Settings};
use crate::error::{Error, ErrorKind, OutputClosed};
use crate::model::Lsn;
use crate::ops::show::Format;

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
        #[arg(long, value_name = "N", default_value_t = RunSettings::DEFAULT.retention.retain_last)]
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

/// The settings only `run` reads.
const RUN_TUNING: &[&str] = &[
    "flush_interval",
    "max_batch_rows",
    "max_batch_bytes",
    "compact_after_files",
    "load_connections",
    "backfill",
    "backfill_chunk_rows",
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

/// Parses the command line, runs the command and turns its outcome into
/// the exit code: 0, 1 for a failure, 2 for a settings error (and the
/// codes a command gives itself).
pub async fn main() -> ExitCode {
    let cli = command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
        .unwrap_or_else(|e| e.exit());
    match commands::run(cli).await {
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
    crate::terminal::init(format == LogFormat::Text);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(|| crate::terminal::LogWriter);
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
