//! A lake behind an Iceberg REST catalog (rustberg, a server we did not
//! write, started by the harness) with its warehouse on S3 (moto): runs
//! load, stream and restart through it, compaction and expiry commit
//! through it, and pyiceberg's `RestCatalog` and DuckDB (the metadata
//! location the catalog serves) read what it wrote from S3; the oracle's
//! random workload under random kills and a crash before a commit lose and
//! repeat nothing there. A run and the readers get their token from an
//! OpenID provider (oidc-provider from npm) by OAuth2's client
//! credentials grant.

use crate::support::oidc::{CLIENT_ID, OidcProvider};
use crate::support::oracle::{Oracle, RemoteSettings};
use crate::support::readers::{
    RemoteLake, change_customers, create_customers, customers_run, id_plan_pairs, loaded_customers,
};
use crate::support::rest::RestServer;
use crate::support::s3::{S3Server, WRITER_ROLE};
use crate::support::*;

/// A REST catalog whose warehouse is `wh/` in a new bucket of `s3`; the
/// readers' settings for it, and the bucket.
async fn rest_on_s3(
    dir: &std::path::Path,
    s3: &S3Server,
) -> (RestServer, Vec<(&'static str, String)>, String) {
    let bucket = s3.bucket("rest").await;
    let warehouse = format!("s3://{bucket}/wh");
    let server = RestServer::start_on_s3(dir, &warehouse, s3);
    let mut readers = RemoteLake::on_s3(dir, warehouse, s3).into_env();
    readers.push(("READ_LAKE_CATALOG_URI", server.uri.clone()));
    (server, readers, bucket)
}

#[tokio::test]
async fn a_rest_catalog_on_s3_is_written_through_its_commits_and_read_by_other_engines() {
    let db = TestDb::new().await;
    create_customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let (server, readers, bucket) = rest_on_s3(dir.path(), &s3).await;
    let lake_dir = dir.path().join("lake");
    let lake_arg = lake_dir.display().to_string();
    let slot = unique("restcat");
    let mut catalog = rest_catalog(&lake_arg, &server.uri);
    let properties = s3.properties();
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
        "no SQLite catalog beside the REST one, no local warehouse"
    );
    assert!(s3.objects(&bucket, "wh/shop/customers/data/").await > 0);
    let read = RemoteLake::with_env(&lake_dir, readers);
    assert_eq!(
        id_plan_pairs(&read.pyiceberg("shop.customers", "rows").await),
        loaded_customers()
    );

    change_customers(&db).await;
    assert_success(&logged(&run).await);
    read.assert_customers_changed().await;

    // A rewrite and an expiry commit through the catalog too; the rows
    // stay, and the next run goes on from where the table is.
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
}

#[tokio::test]
async fn random_kills_and_a_crash_before_a_commit_on_a_rest_catalog_on_s3_lose_and_repeat_nothing()
{
    let mut oracle = Oracle::new(500).await;
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let (server, readers, _) = rest_on_s3(dir.path(), &s3).await;
    let remote = RemoteSettings {
        catalog_uri: Some(server.uri.clone()),
        warehouse: None,
        properties: s3.properties(),
        ..RemoteSettings::default()
    };
    oracle.on_remote_lake(remote, readers);
    oracle.kill_at_random(8, 19).await;
    // Data files written, the catalog not yet told: the next run streams
    // the batch again.
    let crashing = oracle.spawn_crashing_at("before-catalog-commit", 2);
    oracle.expect_crash(crashing, "before-catalog-commit").await;
    let (changes, rows) = oracle.finish().await;
    assert!(changes > 0 && rows > 0, "{changes} changes, {rows} rows");
}

#[tokio::test]
async fn a_rest_catalogs_multi_table_commits_show_a_transaction_in_both_tables_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = RestServer::start(dir.path(), &dir.path().join("warehouse"));
    crate::atomic_commits::two_tables_are_seen_together(
        &["--catalog-uri", &server.uri],
        vec![("READ_LAKE_CATALOG_URI", server.uri.clone())],
    )
    .await;
}

/// The arguments that give a command the REST catalog at `uri`, namespace
/// `shop`, its state folder `lake`.
fn rest_catalog<'a>(lake: &'a str, uri: &'a str) -> Vec<&'a str> {
    vec![
        "--lake",
        lake,
        "--catalog-type",
        "rest",
        "--catalog-uri",
        uri,
        "--namespace",
        "shop",
    ]
}

/// `run` with `catalog_properties` in the environment, as a deployment
/// hands a secret over, and its debug log on; its output.
async fn run_with_properties(run: &[String], catalog_properties: &str) -> std::process::Output {
    run_with(run, &[("WAL2ICEBERG_CATALOG_PROPERTY", catalog_properties)]).await
}

/// `run` with `env` and its debug log on, holding no S3 keys from the
/// test's own environment; its output.
async fn run_with(run: &[String], env: &[(&str, &str)]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(run)
        .env("RUST_LOG", "debug")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run wal2iceberg")
}

/// A REST catalog that vends credentials, and a run given keys the store
/// does not know: the S3 server takes only requests signed by keys it
/// issued, so the lake is written with the keys the catalog vends for
/// each table (rustberg puts them in `loadTable`'s `storage-credentials`,
/// which iceberg-rust leaves unread: src/lake/catalog/rest_tables.rs). A run that
/// asks for none is refused by the store with its own keys, and the next
/// one that asks takes up where the lake stands; pyiceberg and DuckDB
/// read it.
#[tokio::test]
async fn a_rest_catalog_that_vends_credentials_is_written_with_them() {
    let db = TestDb::new().await;
    create_customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let bucket = unique("vend").to_lowercase().replace('_', "-");
    let s3 = S3Server::start_authenticating(&bucket).await;
    let warehouse = format!("s3://{bucket}/wh");
    let server = RestServer::start_vending(dir.path(), &warehouse, &s3, WRITER_ROLE);
    let lake_arg = dir.path().join("lake").display().to_string();
    let slot = unique("vend");
    let endpoint = format!("s3.endpoint={}", s3.endpoint);
    let place = [
        &["--exit-when-idle", "1s"][..],
        &rest_catalog(&lake_arg, &server.uri),
        &["--catalog-property", endpoint.as_str()],
        &["--catalog-property", "s3.region=us-east-1"],
        // Keys of its own the store does not know: the vended ones win.
        &["--catalog-property", "s3.access-key-id=not-a-key"],
        &["--catalog-property", "s3.secret-access-key=not-a-secret"],
    ]
    .concat();
    let run = customers_run(&db, &slot, &place);
    let loaded = run_with(&run, &[]).await;
    assert_success(&loaded);

    change_customers(&db).await;
    let unvended = [
        &run[..],
        &[
            "--catalog-property".to_owned(),
            "header.X-Iceberg-Access-Delegation=none".to_owned(),
        ],
    ]
    .concat();
    let refused = run_with(&unvended, &[]).await;
    assert!(
        !refused.status.success() && printed(&refused).contains("InvalidAccessKeyId"),
        "{}",
        printed(&refused)
    );
    assert_success(&run_with(&run, &[]).await);

    let mut readers = RemoteLake::on_s3(dir.path(), warehouse, &s3).into_env();
    readers.push(("READ_LAKE_CATALOG_URI", server.uri.clone()));
    let read = RemoteLake::with_env(dir.path(), readers);
    read.assert_customers_changed().await;
}

/// What `out` printed, both streams.
fn printed(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// OAuth2's client credentials grant at a real identity provider: the
/// credential is exchanged for a token there (a wrong one refused, with
/// nothing made at the source), the secret is never printed, and
/// pyiceberg and DuckDB read with the same credential. rustberg 0.3.0
/// cannot validate the provider's tokens (docs/testing.md), so the
/// catalog checks none here.
#[tokio::test]
async fn a_rest_catalog_is_reached_with_a_token_from_an_identity_provider() {
    let db = TestDb::new().await;
    create_customers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let secret = "s3cr3t-of-the-client";
    let provider = OidcProvider::start(dir.path(), secret);
    let server = RestServer::start(dir.path(), &dir.path().join("warehouse"));
    let lake_dir = dir.path().join("lake");
    let lake_arg = lake_dir.display().to_string();
    let slot = unique("oauth");
    let run = customers_run(
        &db,
        &slot,
        &[
            &["--exit-when-idle", "1s"],
            &rest_catalog(&lake_arg, &server.uri)[..],
        ]
        .concat(),
    );
    let token_endpoint = provider.token_endpoint();
    let properties = |secret: &str| {
        format!("credential={CLIENT_ID}:{secret},oauth2-server-uri={token_endpoint},scope=catalog")
    };

    // A wrong secret: the provider refuses it, the run stops before it
    // makes anything at the source, and the secret is not printed.
    let wrong = "not-the-s3cr3t";
    let refused = run_with_properties(&run, &properties(wrong)).await;
    assert!(!refused.status.success(), "{}", printed(&refused));
    assert!(
        !printed(&refused).contains(wrong),
        "the secret was printed: {}",
        printed(&refused)
    );
    assert!(
        provider
            .log()
            .contains(&format!("refused {CLIENT_ID}: invalid_client")),
        "{}",
        provider.log()
    );
    assert_eq!(db.confirmed_flush(&slot).await, None, "no slot was made");

    // The right one: a token, then load, stream and restart.
    let ran = run_with_properties(&run, &properties(secret)).await;
    assert!(ran.status.success(), "{}", printed(&ran));
    assert!(
        !printed(&ran).contains(secret),
        "the secret was printed: {}",
        printed(&ran)
    );
    assert!(
        provider.log().contains(&format!("grant {CLIENT_ID}")),
        "{}",
        provider.log()
    );
    change_customers(&db).await;
    assert_success(&run_with_properties(&run, &properties(secret)).await);

    let props = serde_json::json!({
        "credential": format!("{CLIENT_ID}:{secret}"),
        "oauth2-server-uri": token_endpoint,
        "scope": "catalog",
    });
    let grants = || {
        provider
            .log()
            .matches(&format!("grant {CLIENT_ID}"))
            .count()
    };
    let before = grants();
    let read = RemoteLake::with_env(
        &lake_dir,
        vec![
            ("READ_LAKE_CATALOG_URI", server.uri.clone()),
            ("READ_LAKE_PROPS", props.to_string()),
        ],
    );
    read.assert_customers_changed().await;
    assert!(grants() > before, "the readers asked for tokens too");
}
