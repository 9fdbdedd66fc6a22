//! A lake's object store that stalls: behind a proxy that stops
//! forwarding mid-upload (a data file's PUT) or mid-commit (the new table
//! metadata's PUT), a run waits out 10 s and 30 s and loses nothing; one
//! stalled for good ends the run once `storage_retry_deadline` passed,
//! with nothing confirmed past the lake; `status` answers within its part
//! timeouts all along; and a store that answers no fails at once.

use std::time::{Duration, Instant};

use crate::support::readers::RemoteLake;
use crate::support::s3::S3Server;
use crate::support::stall_proxy::StallProxy;
use crate::support::*;

/// The deadline the stalled-for-good run gets.
const DEADLINE_SECS: u64 = 45;

struct Lake {
    url: String,
    slot: String,
    lake: String,
    warehouse: String,
}

impl Lake {
    /// `command`'s arguments for this lake, the store reached at `endpoint`.
    fn args(&self, command: &str, endpoint: &str, properties: &[String]) -> Vec<String> {
        let mut args: Vec<String> = [
            command,
            "--source",
            &self.url,
            "--slot",
            &self.slot,
            "--lake",
            &self.lake,
            "--warehouse",
            &self.warehouse,
            "--namespace",
            "shop",
        ]
        .map(str::to_owned)
        .to_vec();
        for property in properties {
            args.push("--catalog-property".to_owned());
            args.push(property.replace("{endpoint}", endpoint));
        }
        args
    }
}

/// A source table `items` of `rows` rows, and a lake for it with its
/// warehouse at `warehouse`.
async fn items_on(warehouse: &str, rows: i32) -> (TestDb, tempfile::TempDir, Lake) {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE items(id int PRIMARY KEY, note text)")
        .await;
    insert(&db, 1, rows).await;
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        url: db.config_url(),
        slot: unique("items"),
        lake: dir.path().join("lake").display().to_string(),
        warehouse: warehouse.to_owned(),
    };
    (db, dir, lake)
}

/// The server's properties, its endpoint left to fill in.
fn properties(server: &S3Server) -> Vec<String> {
    server
        .properties()
        .into_iter()
        .map(|p| p.replace(&server.endpoint, "{endpoint}"))
        .collect()
}

/// `status` through the proxy: it answers within its part timeouts, says
/// the lake is unreachable, and exits 1.
async fn status_says_unreachable(lake: &Lake, proxy: &StallProxy, props: &[String]) {
    let started = Instant::now();
    let out = cli(&lake.args("status", &proxy.endpoint, props)).await;
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        took < Duration::from_secs(20),
        "status took {took:?}: {stdout}"
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("lake: unreachable ("), "{stdout}");
    assert!(
        stdout.contains("confirmed_flush_lsn"),
        "the source's side: {stdout}"
    );
}

async fn insert(db: &TestDb, from: i32, to: i32) -> wal2iceberg::model::Lsn {
    db.exec(&format!(
        "INSERT INTO items SELECT g, 'item ' || g FROM generate_series({from}, {to}) g"
    ))
    .await;
    db.wal_insert_lsn().await
}

/// Until the slot confirmed `lsn`, the run still going.
async fn wait_confirmed(
    db: &TestDb,
    slot: &str,
    lsn: wal2iceberg::model::Lsn,
    run: &mut tokio::process::Child,
    log: &std::path::Path,
) {
    let give_up = Instant::now() + Duration::from_secs(240);
    while db.confirmed_flush(slot).await < Some(lsn) {
        let log = || std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            run.try_wait().unwrap().is_none(),
            "the run ended: {}",
            log()
        );
        assert!(Instant::now() < give_up, "never confirmed: {}", log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Until `proxy` stalled at a request.
async fn wait_stalled(proxy: &StallProxy, stalls: usize) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while proxy.triggered().len() < stalls {
        assert!(Instant::now() < give_up, "no request met the stall");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_store_stalled_for_seconds_is_waited_for_and_one_stalled_for_good_ends_the_run_at_its_deadline()
 {
    let server = S3Server::start();
    let bucket = server.bucket("stall").await;
    let proxy = StallProxy::start(&server.endpoint).await;
    let (db, dir, lake) = items_on(&format!("s3://{bucket}/shop"), 100).await;
    let props = properties(&server);
    let log_path = dir.path().join("run.log");
    let mut args = lake.args("run", &proxy.endpoint, &props);
    args.extend(
        [
            "--tables",
            "public.items",
            "--flush-interval",
            "200ms",
            "--storage-retry-deadline",
            &format!("{DEADLINE_SECS}s"),
        ]
        .map(str::to_owned),
    );
    let mut run = tokio::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(&args)
        .env("RUST_LOG", "wal2iceberg=info")
        .stderr(std::fs::File::create(&log_path).unwrap())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    db.wait_until_streaming(&lake.slot).await;

    // Mid-upload, 10 s; then mid-commit, 30 s, status asked meanwhile.
    for (stall, (method, needle, secs)) in [("PUT", ".parquet", 10), ("PUT", "metadata.json", 30)]
        .into_iter()
        .enumerate()
    {
        let from = 101 + 10 * stall as i32;
        proxy.stall_at(method, needle, Some(Duration::from_secs(secs)));
        let lsn = insert(&db, from, from + 9).await;
        wait_stalled(&proxy, stall + 1).await;
        let stalled = Instant::now();
        status_says_unreachable(&lake, &proxy, &props).await;
        wait_confirmed(&db, &lake.slot, lsn, &mut run, &log_path).await;
        assert!(stalled.elapsed() >= Duration::from_secs(secs - 1));
    }

    // For good: the run exits once the deadline passed, and confirmed
    // nothing the lake lacks.
    let before = db.confirmed_flush(&lake.slot).await;
    proxy.stall_at("PUT", ".parquet", None);
    let lsn = insert(&db, 121, 130).await;
    wait_stalled(&proxy, 3).await;
    let stalled = Instant::now();
    status_says_unreachable(&lake, &proxy, &props).await;
    let ended = tokio::time::timeout(Duration::from_secs(DEADLINE_SECS + 60), run.wait())
        .await
        .expect("the run ends after its deadline")
        .unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(ended.code(), Some(1), "{log}");
    assert!(
        stalled.elapsed() >= Duration::from_secs(DEADLINE_SECS - 5),
        "{:?}: {log}",
        stalled.elapsed()
    );
    assert!(log.contains("storage_retry_deadline"), "{log}");
    assert!(
        log.contains("the lake's storage failed for the moment"),
        "a warning per retry: {log}"
    );
    let after = db.confirmed_flush(&lake.slot).await;
    assert!(after < Some(lsn), "confirmed {after:?} past the lake");
    assert!(after >= before);

    // The store back: the next run takes up from where the lake stands.
    proxy.release();
    let mut args = lake.args("run", &proxy.endpoint, &props);
    args.extend(["--tables", "public.items", "--exit-when-idle", "2s"].map(str::to_owned));
    assert_success(&cli(&args).await);
    let mut verify = lake.args("verify", &server.endpoint, &props);
    verify.extend(["--tables", "public.items"].map(str::to_owned));
    assert_success(&cli(&verify).await);
    let rows = RemoteLake::on_s3(
        dir.path().join("lake").as_path(),
        lake.warehouse.clone(),
        &server,
    )
    .pyiceberg("shop.items", "rows")
    .await;
    assert_eq!(rows.as_array().unwrap().len(), 130);
    let changes = RemoteLake::on_s3(
        dir.path().join("lake").as_path(),
        lake.warehouse.clone(),
        &server,
    )
    .pyiceberg("shop.items_changes", "rows")
    .await;
    assert_eq!(changes.as_array().unwrap().len(), 130, "each change once");
}

#[tokio::test]
async fn a_store_that_refuses_the_keys_fails_at_once_and_says_so() {
    let server = S3Server::start_authenticating("refusing").await;
    let (_db, _dir, lake) = items_on("s3://refusing/shop", 10).await;
    let props: Vec<String> = properties(&server)
        .into_iter()
        .map(|p| {
            if p.starts_with("s3.secret-access-key=") {
                "s3.secret-access-key=notthesecretzq9".to_owned()
            } else {
                p
            }
        })
        .collect();
    let mut args = lake.args("run", &server.endpoint, &props);
    args.extend(["--tables", "public.items", "--exit-when-idle", "2s"].map(str::to_owned));
    let started = Instant::now();
    let out = cli(&args).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(60), "{stderr}");
    assert!(
        stderr.contains("the object store refused access (403)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("notthesecretzq9"),
        "no secret in the error: {stderr}"
    );
}

/// A tmpfs mounted for the test, unmounted at its end.
struct Mounted(std::path::PathBuf);

impl Mounted {
    fn tmpfs(at: &std::path::Path, size: &str) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        mount(&[
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "tmpfs",
            &at.display().to_string(),
        ]);
        Mounted(at.to_owned())
    }

    fn remount(&self, options: &str) {
        mount(&[
            "-o",
            &format!("remount,{options}"),
            &self.0.display().to_string(),
        ]);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn mount(args: &[&str]) {
    let status = std::process::Command::new("mount")
        .args(args)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "mount {args:?}: the tests run as root, as CI does"
    );
}

#[tokio::test]
async fn a_full_read_only_or_forbidden_local_lake_is_told_as_what_it_is_with_the_fix() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE items(id int PRIMARY KEY, note text)")
        .await;
    insert(&db, 1, 10).await;
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("warehouse");
    let disk = Mounted::tmpfs(&warehouse, "1M");
    let (slot, url) = (unique("disk"), db.config_url());
    let catalog = dir.path().join("catalog.db");
    let state = dir.path().join("state");
    let args: Vec<String> = [
        "run",
        "--source",
        &url,
        "--tables",
        "public.items",
        "--slot",
        &slot,
        "--catalog",
        &catalog.display().to_string(),
        "--warehouse",
        &warehouse.display().to_string(),
        "--state-dir",
        &state.display().to_string(),
        "--namespace",
        "shop",
        "--exit-when-idle",
        "2s",
    ]
    .map(str::to_owned)
    .to_vec();
    assert_success(&cli(&args).await);
    let refused = async |out: std::process::Output, lsn, says: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
        assert!(
            stderr.contains(&warehouse.display().to_string()),
            "the path: {stderr}"
        );
        assert!(
            !stderr.contains("reconnecting"),
            "not a connection problem: {stderr}"
        );
        assert!(
            db.confirmed_flush(&slot).await < Some(lsn),
            "nothing confirmed past the lake"
        );
    };

    // Full: a change larger than the disk's room (md5 text, little to
    // compress).
    db.exec(
        "INSERT INTO items SELECT g, (SELECT string_agg(md5(random()::text || g || i), '') \
         FROM generate_series(1, 32) i) FROM generate_series(11, 4010) g",
    )
    .await;
    let lsn = db.wal_insert_lsn().await;
    refused(cli(&args).await, lsn, "the disk holding the lake is full").await;

    // Read-only.
    disk.remount("ro");
    refused(cli(&args).await, lsn, "mounted read-only").await;

    // Not this user's: the run as `postgres`, the lake's folders root's.
    disk.remount("rw,size=64M");
    // The catalog's folder and all in it (the catalog, its lock, the key
    // indexes) become the user's; the warehouse stays root's.
    let chown = |path: &std::path::Path, deep: bool| {
        let mut chown = std::process::Command::new("chown");
        if deep {
            chown.arg("-R");
        }
        assert!(chown.arg("postgres").arg(path).status().unwrap().success());
    };
    chown(dir.path(), false);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path != warehouse {
            chown(&path, true);
        }
    }
    let out = tokio::process::Command::new("setpriv")
        .args([
            "--reuid=postgres",
            "--regid=postgres",
            "--clear-groups",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(&args)
        .output()
        .await
        .unwrap();
    refused(out, lsn, "this user may not write the lake's folder").await;

    // Put right, the next run takes everything up.
    assert_success(&cli(&args).await);
    let out = cli(&[
        "show",
        "items",
        "--catalog",
        &catalog.display().to_string(),
        "--warehouse",
        &warehouse.display().to_string(),
        "--namespace",
        "shop",
        "--format",
        "csv",
    ])
    .await;
    assert_success(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        4011,
        "a header and every row"
    );
}
