//! The `wal2iceberg` command line.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use wal2iceberg::cdc::capture::{self, CaptureOptions, DEFAULT_PUBLICATION, DEFAULT_SLOT};
use wal2iceberg::config::parse_duration;
use wal2iceberg::ops::shutdown::Shutdown;
use wal2iceberg::ops::tail::{TailOptions, tail};
use wal2iceberg::pg::config::PgConfig;
use wal2iceberg::pg::source::TableName;
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

/// Where and what to capture.
#[derive(clap::Args)]
struct SourceArgs {
    /// Source connection: a postgres:// URL or key=value string; PG*
    /// environment variables and ~/.pgpass fill what it leaves out.
    #[arg(long, env = "WAL2ICEBERG_SOURCE", default_value = "")]
    source: String,
    /// Tables to capture, comma-separated: public.customers,public.orders.
    #[arg(long, value_delimiter = ',', required = true)]
    tables: Vec<String>,
    /// Replication slot name.
    #[arg(long, default_value = DEFAULT_SLOT)]
    slot: String,
    /// Publication name; created for the tables when missing.
    #[arg(long, default_value = DEFAULT_PUBLICATION)]
    publication: String,
    /// pgoutput protocol version (1 or 2).
    #[arg(long, default_value_t = 2)]
    proto_version: u32,
    /// Stream large transactions before they commit (protocol 2).
    #[arg(long)]
    streaming: bool,
}

impl SourceArgs {
    fn parse(&self) -> Result<(PgConfig, CaptureOptions), Error> {
        let config = PgConfig::parse(&self.source)?;
        let tables = self
            .tables
            .iter()
            .map(|t| TableName::parse(t.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut options = CaptureOptions::new(tables);
        options.slot = self.slot.clone();
        options.publication = self.publication.clone();
        options.proto_version = self.proto_version;
        options.streaming = self.streaming;
        Ok((config, options))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Print the decoded change stream as JSON lines (initial load first
    /// when the slot is new); each transaction is confirmed once printed.
    Tail {
        #[command(flatten)]
        source: SourceArgs,
        /// Exit 0 once no change came for this long (6s, 500ms, 2m).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        exit_when_idle: Option<Duration>,
    },
    /// Replicate the tables into the lake: bronze `<table>_changes` and
    /// silver `<table>`, initial load first when the slot is new.
    Run {
        #[command(flatten)]
        source: SourceArgs,
        /// Folder of the embedded lake: catalog.db and warehouse/.
        #[arg(long, default_value = "./lake")]
        lake: std::path::PathBuf,
        /// Iceberg namespace; the source database's name when unset.
        #[arg(long)]
        namespace: Option<String>,
        /// Commit a batch at least this often.
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
        flush_interval: Duration,
        /// Commit once a batch holds this many changes.
        #[arg(long, default_value_t = wal2iceberg::ops::run::DEFAULT_MAX_BATCH_ROWS)]
        max_batch_rows: usize,
        /// Commit once a batch holds about this many bytes of values.
        #[arg(long, default_value_t = wal2iceberg::ops::run::DEFAULT_MAX_BATCH_BYTES)]
        max_batch_bytes: usize,
        /// Drain, commit, confirm and exit 0 once no change came for this
        /// long (6s, 500ms, 2m).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        exit_when_idle: Option<Duration>,
    },
    /// Run the seed walkthrough against a throwaway local PostgreSQL
    /// (server binaries found as in docs/testing.md) and print each step.
    Demo,
    /// The slot (activity, confirmed position, retained WAL, lag) and each
    /// lake table's last source transaction and its lag.
    Status {
        /// Source connection, as for `run`.
        #[arg(long, env = "WAL2ICEBERG_SOURCE", default_value = "")]
        source: String,
        /// Replication slot name.
        #[arg(long, default_value = DEFAULT_SLOT)]
        slot: String,
        /// Folder of the embedded lake.
        #[arg(long, default_value = "./lake")]
        lake: std::path::PathBuf,
        /// Iceberg namespace; the source database's name when unset.
        #[arg(long)]
        namespace: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Drop the replication slot and the publication wal2iceberg created
    /// (one made by someone else is kept); the lake's tables only with
    /// --drop-tables.
    Teardown {
        /// Source connection, as for `run`.
        #[arg(long, env = "WAL2ICEBERG_SOURCE", default_value = "")]
        source: String,
        #[arg(long, default_value = DEFAULT_SLOT)]
        slot: String,
        #[arg(long, default_value = DEFAULT_PUBLICATION)]
        publication: String,
        /// Also drop every Iceberg table of the namespace, with its files.
        #[arg(long)]
        drop_tables: bool,
        /// Folder of the embedded lake (for --drop-tables).
        #[arg(long, default_value = "./lake")]
        lake: std::path::PathBuf,
        /// Iceberg namespace; the source database's name when unset.
        #[arg(long)]
        namespace: Option<String>,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Print a lake table through wal2iceberg's own reader.
    Show {
        /// The table: `customers`, `customers_changes`, or `shop.customers`.
        table: String,
        /// Folder of the embedded lake.
        #[arg(long, default_value = "./lake")]
        lake: std::path::PathBuf,
        /// Iceberg namespace, when the table name has none; by default the
        /// lake's only namespace.
        #[arg(long)]
        namespace: Option<String>,
        /// At most this many rows.
        #[arg(long)]
        limit: Option<usize>,
        /// The table as of a source LSN (e.g. 0/1A2B3C8): the newest
        /// snapshot holding nothing committed after it.
        #[arg(long, value_name = "LSN")]
        as_of: Option<wal2iceberg::pg::lsn::Lsn>,
        /// table, json or csv.
        #[arg(long, default_value = "table")]
        format: wal2iceberg::ops::show::Format,
    },
    /// Run every preflight check and print each failure with its fix.
    Check {
        #[command(flatten)]
        source: SourceArgs,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "wal2iceberg=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err}");
            match err.kind() {
                ErrorKind::Config => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Run {
            source,
            lake,
            namespace,
            flush_interval,
            max_batch_rows,
            max_batch_bytes,
            exit_when_idle,
        } => {
            let (config, capture) = source.parse()?;
            let options = wal2iceberg::ops::run::RunOptions {
                namespace,
                flush_interval,
                max_batch_rows: max_batch_rows.max(1),
                max_batch_bytes: max_batch_bytes.max(1),
                exit_when_idle,
                shutdown: Shutdown::on_signals()?,
                ..wal2iceberg::ops::run::RunOptions::new(capture, lake)
            };
            let report = wal2iceberg::ops::run::run(&config, &options).await?;
            println!(
                "applied {} changes in {} batches; confirmed {}",
                report.changes_applied, report.batches, report.confirmed
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Tail {
            source,
            exit_when_idle,
        } => {
            let (config, capture) = source.parse()?;
            let options = TailOptions {
                capture,
                exit_when_idle,
            };
            tail(&config, &options, &mut std::io::stdout().lock()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            source,
            slot,
            lake,
            namespace,
            json,
        } => {
            let config = PgConfig::parse(&source)?;
            let status =
                wal2iceberg::ops::status::status(&config, &slot, &lake, namespace.as_deref())
                    .await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&status).map_err(|e| Error::new(
                        ErrorKind::Io,
                        "cannot print the status"
                    )
                    .with_source(e))?
                );
            } else {
                print!("{}", status.to_text());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Teardown {
            source,
            slot,
            publication,
            drop_tables,
            lake,
            namespace,
            yes,
        } => {
            let config = PgConfig::parse(&source)?;
            let what = format!(
                "slot {slot:?} and publication {publication:?} on {}:{}/{}{}",
                config.host,
                config.port,
                config.dbname,
                if drop_tables {
                    format!(" and every table of the lake {}", lake.display())
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
            let namespace = wal2iceberg::lake::catalog::namespace(
                namespace.as_deref().unwrap_or(&config.dbname),
            );
            let options = wal2iceberg::ops::teardown::TeardownOptions {
                slot: slot.clone(),
                publication: publication.clone(),
                drop_tables: drop_tables.then_some((lake, namespace)),
            };
            let report = wal2iceberg::ops::teardown::teardown(&config, &options).await?;
            println!(
                "slot {slot}: {}",
                if report.slot_dropped {
                    "dropped"
                } else {
                    "did not exist"
                }
            );
            println!(
                "publication {publication}: {}",
                if report.publication_dropped {
                    "dropped"
                } else if report.publication_kept {
                    "kept (not created by wal2iceberg)"
                } else {
                    "did not exist"
                }
            );
            for table in report.tables_dropped {
                println!("table {table}: dropped");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Show {
            table,
            lake,
            namespace,
            limit,
            as_of,
            format,
        } => {
            let lake = wal2iceberg::lake::catalog::Lake::open_existing(&lake).await?;
            let ident = lake.resolve_table(&table, namespace.as_deref()).await?;
            let options = wal2iceberg::ops::show::ShowOptions {
                limit,
                as_of,
                format,
                ..Default::default()
            };
            print!(
                "{}",
                wal2iceberg::ops::show::show(&lake, &ident, &options).await?
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo => {
            wal2iceberg::ops::demo::demo(&mut std::io::stdout().lock()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { source } => {
            let (config, options) = source.parse()?;
            let failures = capture::check(&config, &options).await?;
            if failures.is_empty() {
                println!("all checks passed: {config}");
                return Ok(ExitCode::SUCCESS);
            }
            for failure in &failures {
                println!("{failure}");
            }
            Ok(ExitCode::from(1))
        }
    }
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
