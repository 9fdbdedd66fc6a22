//! `wal2iceberg demo`: the seed walkthrough against a throwaway PostgreSQL.
//! A `customers` table with REPLICA IDENTITY FULL and three rows; the
//! initial load; two updates, a delete and an insert; then a restart of the
//! capture that shows nothing confirmed comes again. Each step prints the
//! change events as JSON lines; the server and its folder are removed at
//! the end.

use std::io::Write;
use std::time::Duration;

use tokio::time::Instant;

use super::scratch::ScratchPostgres;
use crate::cdc::capture::{self, Capture, CaptureOptions};
use crate::cdc::event::Event;
use crate::cdc::stream::{ChangeStream, Next};
use crate::error::{Error, ErrorKind, Result, postgres};
use crate::pg::config::PgConfig;
use crate::pg::source::{SourceClient, TableName};

const SETUP: &str = "
    CREATE TABLE customers(
      id int PRIMARY KEY, name text NOT NULL, plan text NOT NULL,
      updated_at timestamptz NOT NULL DEFAULT now());
    ALTER TABLE customers REPLICA IDENTITY FULL;
    INSERT INTO customers(id, name, plan) VALUES (1,'Ada','free'),(2,'Grace','pro'),(3,'Linus','free');";

const CHANGES: [&str; 4] = [
    "UPDATE customers SET plan='pro',  updated_at=now() WHERE id=1",
    "UPDATE customers SET plan='team', updated_at=now() WHERE id=1",
    "DELETE FROM customers WHERE id=3",
    "INSERT INTO customers(id, name, plan) VALUES (4,'Barbara','free')",
];

/// How long a step waits for its events before calling the stream quiet.
const STEP_IDLE: Duration = Duration::from_secs(2);

pub async fn demo(out: &mut dyn Write) -> Result<()> {
    writeln!(out, "# starting a throwaway PostgreSQL (wal_level=logical)")?;
    let server = ScratchPostgres::start(&[], &[])?;
    let admin = SourceClient::connect(&PgConfig::parse(&server.url("postgres"))?).await?;
    admin
        .batch_execute("CREATE DATABASE shop")
        .await
        .map_err(|e| postgres(e, "cannot create the demo database"))?;
    let config = PgConfig::parse(&server.url("shop"))?;
    let shop = SourceClient::connect(&config).await?;
    let run = |sql: &'static str| {
        let shop = &shop;
        async move {
            shop.batch_execute(sql)
                .await
                .map_err(|e| postgres(e, "demo statement failed"))
        }
    };

    writeln!(
        out,
        "# step 2: create customers (REPLICA IDENTITY FULL) with three rows"
    )?;
    run(SETUP).await?;
    let options = CaptureOptions::new(vec![TableName::parse("public.customers")?]);

    writeln!(
        out,
        "# step 5: initial load from the slot's exported snapshot (op r)"
    )?;
    let Capture::Fresh { mut load, pending } = capture::open(&config, &options).await? else {
        return Err(Error::new(ErrorKind::Slot, "the demo slot already existed"));
    };
    while let Some(event) = load.next_event().await? {
        print_event(out, &event)?;
    }
    let mut stream = pending.start().await?;
    stream.confirm(load.consistent_point()).await?;

    writeln!(
        out,
        "# step 6: two updates of Ada, Linus deleted, Barbara inserted"
    )?;
    for sql in CHANGES {
        run(sql).await?;
    }
    let printed = print_until_quiet(out, &mut stream).await?;
    stream.stop().await?;

    writeln!(
        out,
        "# step 7: restart the capture; confirmed transactions do not come again"
    )?;
    let Capture::Resume(mut stream) = capture::open(&config, &options).await? else {
        return Err(Error::new(ErrorKind::Slot, "the demo slot vanished"));
    };
    let replayed = print_until_quiet(out, &mut stream).await?;
    stream.stop().await?;
    writeln!(
        out,
        "# {printed} events in step 6, {replayed} repeated after the restart"
    )?;
    writeln!(out, "# stopping and removing the throwaway PostgreSQL")?;
    drop(server);
    Ok(())
}

/// Prints events, confirming each transaction once printed, until the
/// stream has been quiet for [`STEP_IDLE`]. Returns the number printed.
async fn print_until_quiet(out: &mut dyn Write, stream: &mut ChangeStream) -> Result<u64> {
    let mut printed = 0;
    loop {
        match stream.next_before(Some(Instant::now() + STEP_IDLE)).await? {
            Next::Event(event) => {
                print_event(out, &event)?;
                printed += 1;
                if let Event::Commit { end_lsn, .. } = event {
                    out.flush()?;
                    stream.confirm(end_lsn).await?;
                }
            }
            Next::Idle => return Ok(printed),
            Next::Closed => {
                return Err(Error::new(
                    ErrorKind::Connection,
                    "the server ended the stream",
                ));
            }
        }
    }
}

fn print_event(out: &mut dyn Write, event: &Event) -> Result<()> {
    writeln!(out, "{}", event.to_json())?;
    Ok(())
}
