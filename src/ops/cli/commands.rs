//! Each command run: its settings resolved, the library's command
//! called, its report printed.

use std::process::ExitCode;

use super::{Cli, Command, SettingsArgs, Stdout, capture_options, init_logging, settings};
use crate::apply::RunOptions;
use crate::cdc::capture;
use crate::config::{LakeSettings, LogFormat, Settings};
use crate::error::{Error, ErrorKind};
use crate::lake::catalog::Lake;
use crate::lake::maintenance::expire::Retention;
use crate::model::Lsn;
use crate::ops::show::Format;
use crate::ops::show::ShowOptions;
use crate::ops::tail::{TailOptions, TailSlot, tail};
use crate::pg::source::SLOT_HELD_BY_RUN;
use crate::shutdown::Shutdown;

pub(super) async fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Run { settings: args } => run_pipeline(settings(args)?).await,
        Command::Check { settings: args } => check(settings(args)?).await,
        Command::Status {
            settings: args,
            json,
        } => status(settings(args)?, json).await,
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
        Command::Setup { settings: args } => setup(settings(args)?).await,
        Command::Show {
            table,
            settings: args,
            limit,
            as_of,
            format,
        } => show(args.lake()?, table, limit, as_of, format).await,
        Command::ExpireSnapshots {
            lake_tables,
            settings: args,
            older_than,
            retain_last,
        } => expire_snapshots(args.lake()?, lake_tables, older_than, retain_last).await,
        Command::Compact {
            lake_tables,
            table,
            settings: args,
        } => compact(args.lake()?, lake_tables, table).await,
        Command::Verify {
            settings: args,
            wait,
        } => verify(args, &wait).await,
        Command::Tail {
            settings: args,
            consume,
        } => tail_changes(settings(args)?, consume).await,
        Command::Demo => {
            init_logging(LogFormat::Text);
            crate::ops::demo::demo(&mut Stdout).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `wal2iceberg run`: until stopped, or idle with `--exit-when-idle`.
async fn run_pipeline(settings: Settings) -> Result<ExitCode, Error> {
    let options = RunOptions {
        shutdown: Shutdown::on_signals()?,
        ..RunOptions::from_settings(&settings, capture_options(&settings).await?)
    };
    let summary = crate::ops::run::run(&settings.source, &options, settings.metrics_addr).await?;
    outln!("{summary}");
    Ok(ExitCode::SUCCESS)
}

/// `wal2iceberg check`: exit 0 when a run would start, 3 when only a run
/// holding the slot stands in the way, else 1.
async fn check(settings: Settings) -> Result<ExitCode, Error> {
    // What `run` checks, on the tables it would take: those the
    // lake holds from the slot too, under their Iceberg names.
    let run_options = RunOptions::from_settings(&settings, capture_options(&settings).await?);
    let settled = crate::apply::settle(&settings.source, &run_options).await?;
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

/// `wal2iceberg status`: exit 1 when the source cannot be reached, the
/// lake is missing or another slot holds the lake's history.
async fn status(settings: Settings, json: bool) -> Result<ExitCode, Error> {
    let status = crate::ops::status::status(
        &settings.source,
        &settings.slot,
        &settings.publication,
        &settings.lake,
        settings.namespace.as_deref(),
    )
    .await?;
    if json {
        let text = serde_json::to_string_pretty(&status)
            .map_err(|e| Error::new(ErrorKind::Io, "cannot print the status").with_source(e))?;
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

/// `wal2iceberg setup`: the role and publication for `--tables`.
async fn setup(settings: Settings) -> Result<ExitCode, Error> {
    if settings.tables.is_empty() {
        return Err(Error::new(
            ErrorKind::Config,
            "tables: none given; setup needs the tables to publish (--tables)",
        ));
    }
    crate::ops::setup::setup(&settings.source, &settings.tables).await?;
    outln!(
        "role {} may read {} table(s), published in {}; give the role a password or another way to log in",
        crate::ops::setup::ROLE,
        settings.tables.len(),
        crate::ops::setup::PUBLICATION
    );
    Ok(ExitCode::SUCCESS)
}

/// `wal2iceberg show`: a lake table through our own reader.
async fn show(
    settings: LakeSettings,
    table: String,
    limit: Option<usize>,
    as_of: Option<Lsn>,
    format: Format,
) -> Result<ExitCode, Error> {
    let lake = Lake::open_existing(&settings.lake).await?;
    let ident = crate::ops::show::resolve(&lake, &table, settings.namespace.as_deref()).await?;
    let options = ShowOptions {
        limit,
        as_of,
        format,
        ..ShowOptions::default()
    };
    out!("{}", crate::ops::show::show(&lake, &ident, &options).await?);
    Ok(ExitCode::SUCCESS)
}

/// `wal2iceberg expire-snapshots`: the retention checked first.
async fn expire_snapshots(
    settings: LakeSettings,
    lake_tables: Vec<String>,
    older_than: String,
    retain_last: usize,
) -> Result<ExitCode, Error> {
    let older_than = crate::config::parse_duration("older_than", &older_than)
        .map_err(|e| Error::new(ErrorKind::Config, format!("--older-than: {e}")))?;
    if retain_last == 0 {
        return Err(Error::new(
            ErrorKind::Config,
            "--retain-last must be at least 1: the current snapshot is always kept",
        ));
    }
    let lake = Lake::open_existing(&settings.lake).await?;
    let idents = lake
        .tables_named(&lake_tables, settings.namespace.as_deref())
        .await?;
    let retention = Retention {
        older_than,
        retain_last,
    };
    let done = crate::ops::expire::expire(&lake, &settings.lake, idents, retention).await?;
    for (ident, expired) in done {
        outln!(
            "{ident}: {} snapshots expired, {} files deleted, {} orphan files deleted",
            expired.snapshots,
            expired.files_deleted,
            expired.orphans_deleted
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `wal2iceberg compact`: the tables named, positionally or by `--table`.
async fn compact(
    settings: LakeSettings,
    mut lake_tables: Vec<String>,
    table: Vec<String>,
) -> Result<ExitCode, Error> {
    lake_tables.extend(table);
    let lake = Lake::open_existing(&settings.lake).await?;
    let idents = lake
        .tables_named(&lake_tables, settings.namespace.as_deref())
        .await?;
    let done = crate::ops::compact::compact(&lake, &settings.lake, &idents).await?;
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

/// `wal2iceberg verify`: the `--wait` checked before the settings.
async fn verify(args: SettingsArgs, wait: &str) -> Result<ExitCode, Error> {
    let wait = crate::config::parse_duration("wait", wait)
        .map_err(|e| Error::new(ErrorKind::Config, format!("--wait: {e}")))?;
    let settings = settings(args)?;
    let options = RunOptions::from_settings(&settings, capture_options(&settings).await?);
    let report = crate::ops::verify::verify(&settings.source, &options, wait).await?;
    out!("{}", report.to_text());
    Ok(if report.equal() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `wal2iceberg tail`: from the named slot (peeked, or consumed), or a
/// temporary one.
async fn tail_changes(settings: Settings, consume: bool) -> Result<ExitCode, Error> {
    let options = TailOptions {
        capture: capture_options(&settings).await?,
        exit_when_idle: settings.run.exit_when_idle,
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
    let options = crate::ops::teardown::TeardownOptions {
        slot: slot.clone(),
        publication: publication.clone(),
        lake: settings.lake.clone(),
        namespace: settings.lake_namespace(),
        drop_tables: drop_tables.then(|| settings.state_dir.clone()),
        force,
    };
    let report = crate::ops::teardown::teardown(config, &options).await?;
    out!("{}", report.to_text(&options));
    Ok(if report.incomplete() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

async fn resync(settings: Settings, table: &str, wait: Option<&str>) -> Result<ExitCode, Error> {
    use crate::ops::resync::{self, Resync, ResyncOptions};
    let wait = wait
        .map(|w| crate::config::parse_duration("wait", w))
        .transpose()
        .map_err(|e| Error::new(ErrorKind::Config, format!("--wait: {e}")))?;
    let table = crate::model::TableName::parse(table)?;
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
            crate::apply::resync::POLL
        ),
        Resync::Done { id, .. } => outln!("{} resynced ({id})", options.table),
    }
    Ok(ExitCode::SUCCESS)
}

async fn drop_table(settings: Settings, table: &str, yes: bool) -> Result<ExitCode, Error> {
    use crate::ops::drop_table::DropTableOptions;
    let table = crate::model::TableName::parse(table)?;
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
    let report = crate::ops::drop_table::drop_table(&settings.source, &options).await?;
    out!("{}", report.to_text(&options));
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
