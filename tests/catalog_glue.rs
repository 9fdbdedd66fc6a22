//! A lake behind AWS Glue's Data Catalog (moto's server, which serves
//! Glue's API and S3 on one endpoint; a server we did not write, started
//! by the harness) with its warehouse on S3: load, stream and restart
//! commit through Glue's `UpdateTable`, compaction and expiry too, and
//! pyiceberg's `GlueCatalog` and DuckDB (the metadata location Glue's
//! `GetTable` gives) read what it wrote; the oracle's random workload
//! under random kills and a crash before a commit lose and repeat nothing
//! there.

use wal2iceberg::lake::catalog::{CatalogChoice, Lake, LakeLocation};

use crate::support::oracle::{Oracle, RemoteSettings};
use crate::support::readers::{
    RemoteLake, change_customers, create_customers, customers_run, id_plan_pairs, loaded_customers,
};
use crate::support::s3::S3Server;
use crate::support::*;

/// The readers' settings for a Glue catalog on `s3` whose warehouse is
/// `warehouse`.
fn glue_readers(
    dir: &std::path::Path,
    warehouse: String,
    s3: &S3Server,
) -> Vec<(&'static str, String)> {
    let mut readers = RemoteLake::on_s3(dir, warehouse, s3).into_env();
    readers.push(("READ_LAKE_CATALOG_TYPE", "glue".to_owned()));
    readers.push(("READ_LAKE_CATALOG_URI", s3.endpoint.clone()));
    readers
}

/// The store's properties, and Glue's credential under pyiceberg's names.
fn glue_properties(s3: &S3Server) -> Vec<String> {
    let mut properties = s3.properties();
    properties.extend([
        format!("glue.access-key-id={}", crate::support::s3::KEY_ID),
        format!("glue.secret-access-key={}", crate::support::s3::SECRET),
    ]);
    properties
}

/// The lake in `dir` whose catalog is Glue on `s3`.
fn glue_location(
    dir: &std::path::Path,
    s3: &S3Server,
    warehouse: &str,
    properties: &[String],
) -> LakeLocation {
    let choice = CatalogChoice {
        kind: Some("glue"),
        uri: Some(&s3.endpoint),
        warehouse: Some(warehouse),
        properties,
        ..CatalogChoice::default()
    };
    LakeLocation::configure(dir, &choice).unwrap()
}

#[tokio::test]
async fn a_glue_catalog_on_s3_is_written_through_its_commits_and_read_by_other_engines() {
    let db = TestDb::new().await;
    create_customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let bucket = s3.bucket("glue").await;
    let warehouse = format!("s3://{bucket}/wh");
    let lake_dir = dir.path().join("lake");
    let lake_arg = lake_dir.display().to_string();
    let slot = unique("gluecat");
    let mut catalog = vec![
        "--lake",
        &lake_arg,
        "--catalog-type",
        "glue",
        "--catalog-uri",
        &s3.endpoint,
        "--warehouse",
        &warehouse,
        "--namespace",
        "shop",
    ];
    let properties = glue_properties(&s3);
    for property in &properties {
        catalog.extend(["--catalog-property", property]);
    }
    let run = customers_run(
        &db,
        &slot,
        &[&["--exit-when-idle", "1s"], &catalog[..]].concat(),
    );
    assert_success(&logged(&run).await);
    assert!(
        !lake_dir.join("catalog.db").exists() && !lake_dir.join("warehouse").exists(),
        "no SQLite catalog beside Glue, no local warehouse"
    );
    assert!(s3.objects(&bucket, "wh/shop.db/customers/data/").await > 0);
    let read = RemoteLake::with_env(&lake_dir, glue_readers(&lake_dir, warehouse.clone(), &s3));
    assert_eq!(
        id_plan_pairs(&read.pyiceberg("shop.customers", "rows").await),
        loaded_customers()
    );

    change_customers(&db).await;
    assert_success(&logged(&run).await);
    read.assert_customers_changed().await;

    // A rewrite and an expiry commit through Glue too; the rows stay, and
    // the next run goes on from where the table is.
    let compact: Vec<&str> = ["compact"].iter().chain(&catalog).copied().collect();
    assert_success(&cli(&compact).await);
    let expire: Vec<&str> = [
        "expire-snapshots",
        "--older-than",
        "0s",
        "--retain-last",
        "1",
    ]
    .iter()
    .chain(&catalog)
    .copied()
    .collect();
    assert_success(&cli(&expire).await);
    let snapshots = read.pyiceberg("shop.customers", "snapshots").await;
    assert_eq!(snapshots.as_array().unwrap().len(), 1, "{snapshots}");
    db.exec("UPDATE customers SET plan = 'free' WHERE id = 2")
        .await;
    assert_success(&logged(&run).await);
    let want = [(1, "team".into()), (2, "free".into()), (4, "free".into())];
    assert_eq!(
        id_plan_pairs(&read.pyiceberg("shop.customers", "rows").await),
        want
    );
    assert_eq!(id_plan_pairs(&read.duckdb("shop.customers").await), want);
    assert_eq!(read.bronze_ops("shop.customers_changes").await, "rrrudcuu");

    let out = cli(&["show", "customers", "--format", "json"]
        .iter()
        .chain(&catalog)
        .copied()
        .collect::<Vec<_>>())
    .await;
    assert_success(&out);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("Barbara") && !shown.contains("Linus"),
        "{shown}"
    );
    let url = db.config_url();
    let status: Vec<&str> = ["status", "--source", &url, "--slot", &slot]
        .iter()
        .chain(&catalog)
        .copied()
        .collect();
    let out = cli(&status).await;
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("customers_changes"));

    // drop-table takes both tables out of Glue and their objects off S3.
    let drop: Vec<&str> = [
        "drop-table",
        "--source",
        &url,
        "--table",
        "public.customers",
        "--yes",
    ]
    .iter()
    .chain(&catalog)
    .copied()
    .collect();
    assert_success(&cli(&drop).await);
    for table in ["customers", "customers_changes"] {
        let folder = format!("wh/shop.db/{table}/");
        assert_eq!(s3.objects(&bucket, &folder).await, 0, "{folder}");
    }
    let lake = Lake::open_existing(&glue_location(&lake_dir, &s3, &warehouse, &properties))
        .await
        .unwrap();
    assert_eq!(lake.tables(Some("shop")).await.unwrap(), []);
}

#[tokio::test]
async fn random_kills_and_a_crash_before_a_commit_on_a_glue_catalog_on_s3_lose_and_repeat_nothing()
{
    let mut oracle = Oracle::new(500).await;
    let s3 = S3Server::start();
    let bucket = s3.bucket("glueoracle").await;
    let warehouse = format!("s3://{bucket}/wh");
    let readers = glue_readers(oracle.lake.path(), warehouse.clone(), &s3);
    let remote = RemoteSettings {
        catalog_type: Some("glue"),
        catalog_uri: Some(s3.endpoint.clone()),
        warehouse: Some(warehouse),
        properties: glue_properties(&s3),
    };
    oracle.on_remote_lake(remote, readers);
    oracle.kill_at_random(8, 29).await;
    // Metadata written to S3, Glue not yet told: the next run streams the
    // batch again.
    let crashing = oracle.spawn_crashing_at("before-catalog-commit", 2);
    oracle.expect_crash(crashing, "before-catalog-commit").await;
    let (changes, rows) = oracle.finish().await;
    assert!(changes > 0 && rows > 0, "{changes} changes, {rows} rows");
}

/// Glue's check, beside another writer: a commit planned on the table as
/// it was before another writer's commit is refused (false, nothing
/// overwritten), through both ways a commit reaches Glue: wal2iceberg's
/// own (a row delta's, an expiry's) and the Iceberg transaction's (table
/// properties), which plans again on the new table.
#[tokio::test]
async fn a_commit_planned_before_another_writers_loses_to_it_on_glue() {
    use wal2iceberg::lake::catalog::commit::commit_metadata;
    use wal2iceberg::lake::catalog::namespace;

    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let bucket = s3.bucket("gluerace").await;
    let warehouse = format!("s3://{bucket}/wh");
    let location = glue_location(dir.path(), &s3, &warehouse, &glue_properties(&s3));
    let lake = Lake::open(&location).await.unwrap();
    let ident = iceberg::TableIdent::new(namespace("shop"), "t".into());
    let schema = iceberg::spec::Schema::builder()
        .with_fields(vec![std::sync::Arc::new(
            iceberg::spec::NestedField::required(
                1,
                "id",
                iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::Long),
            ),
        )])
        .build()
        .unwrap();
    let planned_on = lake.ensure_table(&ident, schema).await.unwrap();

    // Another writer commits first.
    lake.set_properties(&planned_on, &[("writer", "other".to_owned())])
        .await
        .unwrap();
    let built = planned_on
        .metadata()
        .clone()
        .into_builder(planned_on.metadata_location().map(str::to_owned))
        .set_properties([("writer".to_owned(), "stale".to_owned())].into())
        .unwrap()
        .build()
        .unwrap();
    assert!(
        !commit_metadata(&lake, &planned_on, built).await.unwrap(),
        "a commit planned on the old table went through"
    );
    let now = lake.catalog_table(&ident).await.unwrap();
    assert_eq!(now.metadata().properties()["writer"], "other");

    // The Iceberg transaction's way: planned on the old table, its
    // requirements fail there, and it is planned again on the new one.
    lake.set_properties(&planned_on, &[("reader", "pyiceberg".to_owned())])
        .await
        .unwrap();
    let now = lake.catalog_table(&ident).await.unwrap();
    assert_eq!(now.metadata().properties()["writer"], "other");
    assert_eq!(now.metadata().properties()["reader"], "pyiceberg");

    // A Glue database made elsewhere with a location places its tables.
    let placed = namespace("placed");
    let elsewhere = format!("s3://{bucket}/elsewhere");
    lake.catalog()
        .create_namespace(
            &placed,
            [("location_uri".to_owned(), elsewhere.clone())].into(),
        )
        .await
        .unwrap();
    let table = lake
        .ensure_table(
            &iceberg::TableIdent::new(placed, "t".into()),
            planned_on.metadata().current_schema().as_ref().clone(),
        )
        .await
        .unwrap();
    assert_eq!(table.metadata().location(), format!("{elsewhere}/t"));
}
