//! The test harness: one throwaway PostgreSQL per test binary (TLS on,
//! password users for each authentication method), a fresh database per
//! test, and helpers to read change events.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use wal2iceberg::apply::RunOptions;
use wal2iceberg::cdc::capture::{self, Capture, CaptureOptions};
use wal2iceberg::cdc::event::{Change, Datum, Event};
use wal2iceberg::cdc::stream::{ChangeStream, Next};
use wal2iceberg::cdc::value::Value;
use wal2iceberg::config::RunSettings;
use wal2iceberg::model::Lsn;
use wal2iceberg::model::TableName;
use wal2iceberg::ops::scratch::ScratchPostgres;
use wal2iceberg::pg::config::PgConfig;
use wal2iceberg::pg::source::SourceClient;

pub mod alloc;
pub mod gcs;
pub mod oidc;
pub mod oracle;
pub mod python;
pub mod readers;
pub mod reconcile;
pub mod rest;
pub mod s3;
pub mod stall_proxy;

pub use python::python;
pub use readers::{bronze_ops, duckdb, id_plan_pairs, id_plan_rows, pyiceberg, tamper};
pub use reconcile::assert_reconciled;

/// Users with a password, one per authentication method.
pub const PASSWORD: &str = "s3cret-Pw";
pub const MD5_USER: &str = "md5_user";
pub const SCRAM_USER: &str = "scram_user";
pub const CLEARTEXT_USER: &str = "cleartext_user";

/// Creates a login role with [`PASSWORD`] stored by `encryption` (`md5`
/// or `scram-sha-256`), unless it exists.
pub async fn ensure_role(admin: &SourceClient, name: &str, encryption: &str) {
    let sql = format!(
        "SET password_encryption = '{encryption}'; CREATE ROLE {name} LOGIN REPLICATION PASSWORD '{PASSWORD}';"
    );
    if let Err(e) = admin.batch_execute(&sql).await {
        assert_eq!(e.code().map(|c| c.code()), Some("42710"), "{e}");
    }
}

pub struct Server {
    pub pg: ScratchPostgres,
    /// The CA that signed the server's certificate (valid for `localhost`
    /// only, not for 127.0.0.1).
    pub ca_file: PathBuf,
}

/// The server of this test binary, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| start_server().expect("start the test PostgreSQL"))
}

fn start_server() -> wal2iceberg::Result<Server> {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "wal2iceberg test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = rcgen::KeyPair::generate().expect("server key");
    let server_params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    let server_cert = server_params
        .signed_by(&server_key, &issuer)
        .expect("server cert");

    let hba = [
        format!("host all {MD5_USER} 127.0.0.1/32 md5"),
        format!("host all {SCRAM_USER} 127.0.0.1/32 scram-sha-256"),
        format!("host all {CLEARTEXT_USER} 127.0.0.1/32 password"),
    ];
    let hba: Vec<&str> = hba.iter().map(String::as_str).collect();
    // The server reads its key and certificate from its own folder.
    let pg = ScratchPostgres::start(&[("logical_decoding_work_mem", "'64kB'")], &hba)?;
    let cert_file = pg.data_dir().join("server.crt");
    let key_file = pg.data_dir().join("server.key");
    std::fs::write(&cert_file, server_cert.pem())?;
    std::fs::write(&key_file, server_key.serialize_pem())?;
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    pg.hand_over(&cert_file)?;
    pg.hand_over(&key_file)?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(pg.data_dir().join("postgresql.conf"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"ssl = on\n"))?;
    pg.reload()?;
    // In the server's folder, so that it goes when the server goes.
    let ca_file = pg.work_dir().join("ca.pem");
    std::fs::write(&ca_file, ca_cert.pem())?;
    Ok(Server { pg, ca_file })
}

/// `docs`, three rows whose `body` is stored out of line (TOAST), for
/// updates that leave it unchanged.
pub const TOASTED_DOCS: &str = "
    CREATE TABLE docs(id int PRIMARY KEY, n int NOT NULL, body text);
    ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
    INSERT INTO docs SELECT i, 0, repeat(md5(i::text), 200) FROM generate_series(1, 3) i;";

/// The seed's Step 6, one statement per transaction as psql runs them:
/// two updates of Ada, the delete of Linus, the insert of Barbara.
pub const SEED_CHANGES: [&str; 4] = [
    "UPDATE customers SET plan='pro' WHERE id=1",
    "UPDATE customers SET plan='team' WHERE id=1",
    "DELETE FROM customers WHERE id=3",
    "INSERT INTO customers VALUES (4,'Barbara','free')",
];

/// A name no other test of this run uses (slots are cluster-wide).
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// `wal2iceberg` with `args` (warnings and errors on stderr), to the end.
pub async fn cli<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    cli_logging(args, "warn").await
}

/// [`cli`] with its debug log on stderr.
pub async fn logged<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    cli_logging(args, "debug").await
}

async fn cli_logging<S: AsRef<std::ffi::OsStr>>(args: &[S], level: &str) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(args)
        .env("RUST_LOG", format!("wal2iceberg={level}"))
        .output()
        .await
        .expect("start wal2iceberg")
}

/// A loopback port free now, for a server a test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits up to a minute until a server listens on the loopback `port`;
/// `log` says why not.
pub fn wait_for_port(port: u16, what: &str, log: impl Fn() -> String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not listen in 60 s: {}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Asserts that a finished command succeeded, showing its stderr if not.
pub fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A database of its own for one test.
pub struct TestDb {
    url: String,
    pub config: PgConfig,
    pub client: SourceClient,
}

impl TestDb {
    pub async fn new() -> TestDb {
        TestDb::create_on(&server().pg).await
    }

    /// A new database on `pg`.
    pub async fn create_on(pg: &ScratchPostgres) -> TestDb {
        let admin = SourceClient::connect(&config_for(&pg.url("postgres")))
            .await
            .expect("connect as admin");
        let name = unique("t");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        TestDb::connect(pg.url(&name)).await
    }

    /// A new connection to an existing database.
    pub async fn connect(url: String) -> TestDb {
        let config = config_for(&url);
        let client = SourceClient::connect(&config)
            .await
            .expect("connect to test database");
        TestDb {
            url,
            config,
            client,
        }
    }

    /// The database's connection URL.
    pub fn config_url(&self) -> String {
        self.url.clone()
    }

    pub async fn exec(&self, sql: &str) {
        self.client.batch_execute(sql).await.unwrap_or_else(|e| {
            panic!(
                "SQL failed: {}\n{sql}",
                e.as_db_error().map_or(e.to_string(), |d| d.to_string())
            )
        });
    }

    /// Capture options with a slot and publication of this test's own.
    pub fn options(&self, tables: &[&str]) -> CaptureOptions {
        let mut options = CaptureOptions::new(
            tables
                .iter()
                .map(|t| TableName::parse(t).unwrap())
                .collect(),
        );
        options.slot = unique("slot");
        options.publication = "pub".to_owned();
        options
    }

    /// The slot's confirmed_flush_lsn.
    pub async fn confirmed_flush(&self, slot: &str) -> Option<Lsn> {
        let row = self
            .client
            .query_opt(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .expect("read slot");
        row.and_then(|r| r.get::<_, Option<String>>(0))
            .map(|s| s.parse().unwrap())
    }

    /// Transactions the server streamed to `slot` in progress, as
    /// `pg_stat_replication_slots` counts them (PostgreSQL 14 on).
    pub async fn streamed_transactions(&self, slot: &str) -> i64 {
        self.client
            .query_opt(
                "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .expect("read the slot's statistics")
            .map_or(0, |r| r.get(0))
    }

    /// How many replication slots this database has.
    pub async fn slot_count(&self) -> i64 {
        self.client
            .query_one(
                "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()",
                &[],
            )
            .await
            .expect("count slots")
            .get(0)
    }

    /// The slot count once it is `wanted`, or after ten seconds: the
    /// server drops a temporary slot once its walsender has gone, a moment
    /// after the client.
    pub async fn settled_slot_count(&self, wanted: i64) -> i64 {
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let count = self.slot_count().await;
            if count == wanted || std::time::Instant::now() > give_up {
                return count;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The process that holds `slot` now, if one does.
    pub async fn active_pid(&self, slot: &str) -> Option<i32> {
        self.client
            .query_opt(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .expect("read slot")
            .and_then(|r| r.get(0))
    }

    /// How many publications publish `table` (a name in any schema).
    pub async fn publishing(&self, table: &str) -> i64 {
        self.client
            .query_one(
                "SELECT count(*) FROM pg_publication_tables WHERE tablename = $1",
                &[&table],
            )
            .await
            .expect("read pg_publication_tables")
            .get(0)
    }

    /// Waits until a walsender streams from `slot` (after its initial
    /// load; the slot is active while it is being created too).
    pub async fn wait_until_streaming(&self, slot: &str) {
        let give_up = Instant::now() + Duration::from_secs(60);
        while !self.streams(slot).await {
            assert!(Instant::now() < give_up, "slot {slot} never streamed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether a walsender streams from `slot` now.
    pub async fn streams(&self, slot: &str) -> bool {
        self.client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r \
                 ON r.pid = s.active_pid WHERE s.slot_name = $1 AND r.state = 'streaming'",
                &[&slot],
            )
            .await
            .expect("read slot")
            .is_some()
    }

    pub async fn wait_until_active(&self, slot: &str) {
        let give_up = Instant::now() + Duration::from_secs(60);
        while self
            .client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active",
                &[&slot],
            )
            .await
            .expect("read slot")
            .is_none()
        {
            assert!(Instant::now() < give_up, "slot {slot} never became active");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wal_insert_lsn(&self) -> Lsn {
        let row = self
            .client
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .unwrap();
        row.get::<_, String>(0).parse().unwrap()
    }
}

/// Parses a connection string that must be valid.
/// A run of `tables` on `slot` into the lake at `lake`, namespace `shop`,
/// flushing every 200 ms and exiting once the stream was quiet for 2 s.
pub fn run_options(db: &TestDb, tables: &[&str], slot: &str, lake: &std::path::Path) -> RunOptions {
    let mut capture = db.options(tables);
    capture.slot = slot.to_owned();
    RunOptions {
        namespace: Some("shop".into()),
        run: RunSettings {
            flush_interval: Duration::from_millis(200),
            exit_when_idle: Some(Duration::from_secs(2)),
            ..RunSettings::DEFAULT
        },
        ..RunOptions::new(capture, lake.to_owned())
    }
}

/// `wal2iceberg resync --table <table>` on the lake in `lake`, namespace
/// `shop`; it must be accepted.
pub async fn request_resync(db: &TestDb, lake: &std::path::Path, table: &str) {
    let lake = lake.display().to_string();
    let asked = cli(&[
        "resync",
        "--table",
        table,
        "--namespace",
        "shop",
        "--lake",
        &lake,
        "--source",
        &db.config_url(),
    ])
    .await;
    assert_success(&asked);
}

/// `wal2iceberg verify` of `tables` (`public.a,public.b`) on the lake in
/// `lake`, namespace `shop`, whose run uses `slot`.
pub async fn verify_lake(
    db: &TestDb,
    slot: &str,
    lake: &std::path::Path,
    tables: &str,
) -> std::process::Output {
    at_lake("verify", db, slot, lake, tables).await
}

/// `wal2iceberg <command>` of `tables` on the lake in `lake`, namespace
/// `shop`, whose run uses `slot`.
pub async fn at_lake(
    command: &str,
    db: &TestDb,
    slot: &str,
    lake: &std::path::Path,
    tables: &str,
) -> std::process::Output {
    at_lake_with(command, db, slot, lake, tables, &[]).await
}

/// [`at_lake`] with `more` arguments after those.
pub async fn at_lake_with(
    command: &str,
    db: &TestDb,
    slot: &str,
    lake: &std::path::Path,
    tables: &str,
    more: &[&str],
) -> std::process::Output {
    let lake = lake.display().to_string();
    let url = db.config_url();
    let mut args = vec![
        command,
        "--source",
        &url,
        "--slot",
        slot,
        "--lake",
        &lake,
        "--namespace",
        "shop",
        "--tables",
        tables,
    ];
    args.extend_from_slice(more);
    cli(&args).await
}

pub fn config_for(url: &str) -> PgConfig {
    PgConfig::parse_with(url, |_| None, None).expect("valid test URL")
}

/// Opens a capture that must be fresh, reads the whole load, starts the
/// stream and confirms the consistent point.
pub async fn open_fresh(db: &TestDb, options: &CaptureOptions) -> (Vec<Event>, ChangeStream) {
    open_fresh_as(&db.config, options).await
}

/// [`open_fresh`] with the connection settings `config`.
pub async fn open_fresh_as(
    config: &PgConfig,
    options: &CaptureOptions,
) -> (Vec<Event>, ChangeStream) {
    let Capture::Fresh {
        mut load, pending, ..
    } = capture::open(config, options).await.expect("open capture")
    else {
        panic!("expected a new slot");
    };
    let mut events = Vec::new();
    while let Some(event) = load.next_event().await.expect("load") {
        events.push(event);
    }
    let point = load.consistent_point();
    let mut stream = pending.start().await.expect("start streaming");
    stream.confirm(point).await.expect("confirm load");
    (events, stream)
}

/// Reads events until `done` says so, failing after 60 seconds.
pub async fn read_until(
    stream: &mut ChangeStream,
    mut done: impl FnMut(&[Event]) -> bool,
) -> Vec<Event> {
    let give_up = Instant::now() + Duration::from_secs(60);
    let mut events = Vec::new();
    while !done(&events) {
        match stream.next_before(Some(give_up)).await.expect("stream") {
            Next::Event(e) => events.push(e),
            Next::Idle => panic!("no event within 60 s; got so far: {}", summary(&events)),
            Next::Closed => panic!("the server closed the stream"),
        }
    }
    events
}

/// Reads until `n` transactions with changes have committed.
pub async fn read_commits(stream: &mut ChangeStream, n: usize) -> Vec<Event> {
    read_until(stream, |events| commits(events) >= n).await
}

/// Commits of transactions that changed a published table. PostgreSQL 14
/// also sends an empty Begin and Commit for other transactions (DDL, say).
pub fn commits(events: &[Event]) -> usize {
    let mut count = 0;
    let mut changed = false;
    for event in events {
        match event {
            Event::Begin(_) => changed = false,
            Event::Change(_) | Event::Message { .. } => changed = true,
            // A DDL transaction's marks: no row of the table changed.
            Event::Rewritten { .. } | Event::Described { .. } => {}
            Event::Commit { .. } if changed => count += 1,
            Event::Commit { .. } => {}
        }
    }
    count
}

pub fn changes(events: &[Event]) -> Vec<&Change> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Change(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// Op codes of the changes, in order: "rrr", "uudc".
pub fn ops(events: &[Event]) -> String {
    changes(events).iter().map(|c| c.op.code()).collect()
}

pub fn summary(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| e.to_json().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The datum of `column` in a row of `change`'s relation.
pub fn datum<'a>(change: &Change, row: &'a [Datum], column: &str) -> &'a Datum {
    let i = change
        .relation
        .columns
        .iter()
        .position(|c| c.name == column)
        .unwrap_or_else(|| panic!("no column {column}"));
    &row[i]
}

pub fn after<'a>(change: &'a Change, column: &str) -> &'a Datum {
    datum(change, change.after.as_ref().expect("after image"), column)
}

pub fn before<'a>(change: &'a Change, column: &str) -> &'a Datum {
    datum(
        change,
        &change.before.as_ref().expect("before image").row,
        column,
    )
}

pub fn text(s: &str) -> Datum {
    Datum::Value(Value::Text(s.to_owned()))
}

pub fn int4(i: i32) -> Datum {
    Datum::Value(Value::Int4(i))
}

/// Applies changes to a map to_lake by the primary key, as a sink would:
/// unchanged TOAST columns keep the value they had.
#[derive(Default, Debug)]
pub struct Model {
    pub rows: BTreeMap<String, Vec<serde_json::Value>>,
}

impl Model {
    pub fn apply(&mut self, change: &Change) {
        use wal2iceberg::cdc::event::Op;
        let key_of = |row: &[Datum]| {
            change
                .relation
                .columns
                .iter()
                .zip(row)
                .filter(|(c, _)| c.is_primary_key)
                .map(|(_, d)| match d {
                    Datum::Value(v) => v.to_json().to_string(),
                    other => panic!("key column not sent: {other:?}"),
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        match change.op {
            Op::Truncate => self.rows.clear(),
            Op::Delete => {
                let key = key_of(&change.before.as_ref().unwrap().row);
                assert!(
                    self.rows.remove(&key).is_some(),
                    "delete of a missing row {key}"
                );
            }
            Op::Read | Op::Insert | Op::Update => {
                let new = change.after.as_ref().unwrap();
                let old_key = change.before.as_ref().map(|b| key_of(&b.row));
                let key = key_of(new);
                let previous = match old_key {
                    Some(old) => self.rows.remove(&old),
                    None if change.op == Op::Update => self.rows.remove(&key),
                    None => None,
                };
                let row = new
                    .iter()
                    .enumerate()
                    .map(|(i, d)| match d {
                        Datum::Value(v) => v.to_json(),
                        Datum::UnchangedToast => {
                            previous.as_ref().expect("unchanged toast of a known row")[i].clone()
                        }
                        Datum::NotSent => panic!("after image with a column not sent"),
                    })
                    .collect();
                self.rows.insert(key, row);
            }
        }
    }
}

/// GET `path` from the metrics server; the body.
pub async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split("\r\n\r\n").nth(1).unwrap().to_owned()
}

/// Reads a run's log `lines` until it says where it serves `/metrics`
/// (60 s at most); that address.
pub async fn metrics_address<R>(lines: &mut tokio::io::Lines<R>) -> String
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("address=").nth(1)
                && line.contains("serving /metrics")
            {
                return rest.split_whitespace().next().unwrap().to_owned();
            }
        }
        panic!("the run ended before serving metrics");
    })
    .await
    .expect("metrics address logged")
}
