//! `wal2iceberg demo`: the seed walkthrough (Steps 2 to 7) against a
//! throwaway PostgreSQL, through the real pipeline into a temporary lake.
//! After each step both tables are printed through our own reader. The
//! server, the slot and the lake are removed at the end.

use std::io::Write;
use std::time::Duration;

use iceberg::TableIdent;

use super::scratch::ScratchPostgres;
use super::show::{ShowOptions, show as show_table};
use crate::apply::{RunOptions, run};
use crate::cdc::capture::CaptureOptions;
use crate::error::{Result, postgres};
use crate::lake::catalog::{Lake, namespace};
use crate::model::TableName;
use crate::pg::config::PgConfig;
use crate::pg::source::SourceClient;

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
    let lake_dir = tempfile::Builder::new()
        .prefix("wal2iceberg-demo-lake-")
        .tempdir()?;
    let options = |slot: &str| {
        let mut capture = CaptureOptions::new(vec![TableName {
            schema: "public".into(),
            name: "customers".into(),
        }]);
        capture.slot = slot.to_owned();
        let mut options = RunOptions::new(capture, lake_dir.path().to_owned());
        options.run.flush_interval = Duration::from_millis(200);
        options.run.exit_when_idle = Some(Duration::from_secs(1));
        options
    };

    writeln!(
        out,
        "# step 2: customers with REPLICA IDENTITY FULL and three rows"
    )?;
    shop.batch_execute(SETUP)
        .await
        .map_err(|e| postgres(e, "demo setup failed"))?;

    writeln!(
        out,
        "\n# step 5: wal2iceberg run (initial load from the slot's snapshot)"
    )?;
    run_and_show(out, &config, &options("wal2iceberg"), lake_dir.path()).await?;

    // A copy of the slot that will not hear the next confirmation, to
    // replay step 6 in step 7 as a crash before confirming would.
    shop.batch_execute(
        "SELECT pg_copy_logical_replication_slot('wal2iceberg', 'wal2iceberg_replay')",
    )
    .await
    .map_err(|e| postgres(e, "cannot copy the demo slot"))?;

    writeln!(
        out,
        "\n# step 6: two updates of Ada, Linus deleted, Barbara inserted; wal2iceberg run"
    )?;
    for sql in CHANGES {
        shop.batch_execute(sql)
            .await
            .map_err(|e| postgres(e, "demo statement failed"))?;
    }
    run_and_show(out, &config, &options("wal2iceberg"), lake_dir.path()).await?;

    writeln!(
        out,
        "\n# step 7: replay step 6 from a slot that never confirmed it"
    )?;
    // The copy stands where the lake confirmed before step 6: the lake
    // follows it from there (docs/operations.md, Following another slot).
    let report = run(&config, &options("wal2iceberg_replay")).await?;
    writeln!(
        out,
        "received {} changes again; the tables already held them, so nothing was added:",
        report.changes_applied
    )?;
    show(out, lake_dir.path()).await?;
    writeln!(
        out,
        "\n# stopping and removing the throwaway PostgreSQL and the lake"
    )?;
    drop(shop);
    drop(admin);
    drop(server);
    Ok(())
}

async fn run_and_show(
    out: &mut dyn Write,
    config: &PgConfig,
    options: &RunOptions,
    lake_dir: &std::path::Path,
) -> Result<()> {
    let report = run(config, options).await?;
    writeln!(
        out,
        "applied {} changes; confirmed {}",
        report.changes_applied, report.confirmed
    )?;
    show(out, lake_dir).await
}

async fn show(out: &mut dyn Write, lake_dir: &std::path::Path) -> Result<()> {
    let lake = Lake::open_embedded(lake_dir).await?;
    let shop = namespace("shop");
    let columns = |names: &[&str]| ShowOptions {
        columns: names.iter().map(|c| (*c).to_owned()).collect(),
        ..ShowOptions::default()
    };
    let silver = TableIdent::new(shop.clone(), "customers".into());
    writeln!(out, "shop.customers (silver)")?;
    let text = show_table(&lake, &silver, &columns(&["id", "name", "plan"])).await?;
    writeln!(out, "{text}")?;
    let bronze = TableIdent::new(shop, "customers_changes".into());
    writeln!(out, "shop.customers_changes (bronze)")?;
    let bronze_columns = ["_cdc_commit_lsn", "_cdc_seq", "_cdc_op", "id", "plan"];
    let text = show_table(&lake, &bronze, &columns(&bronze_columns)).await?;
    writeln!(out, "{text}")?;
    Ok(())
}
