//! An Iceberg REST catalog server for the lake tests: rustberg, a crate
//! built on the Apache iceberg crates, installed from crates.io into
//! `target/test-tools` by the first test that needs it (a debug build
//! without TLS, with S3 storage and credential vending through AWS STS);
//! one server per test, on a free loopback port, its catalog in a redb
//! file of the test's and its warehouse a local folder or a bucket of the
//! test's S3 server, stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use super::s3::S3Server;

const RUSTBERG: &str = "0.3.0";
const FEATURES: &str = "cli,storage-s3,aws-credentials";

pub struct RestServer {
    child: Child,
    pub uri: String,
}

impl RestServer {
    /// A server whose tables live under `warehouse`, its catalog in `dir`.
    pub fn start(dir: &Path, warehouse: &Path) -> RestServer {
        std::fs::create_dir_all(warehouse).expect("create the warehouse");
        RestServer::start_with(dir, &format!("file://{}", warehouse.display()), &[], &[])
    }

    /// A server whose tables live under `warehouse`, an `s3://` URI on
    /// `s3`, its catalog in `dir`. Its own reads and writes reach `s3` by
    /// the storage properties of a config file (path-style addressing has
    /// no flag); it vends no credentials, so clients bring their own.
    pub fn start_on_s3(dir: &Path, warehouse: &str, s3: &S3Server) -> RestServer {
        RestServer::start_on_s3_with(dir, warehouse, s3, "", &[])
    }

    /// [`Self::start_on_s3`], vending to clients that ask for it
    /// credentials of `role`, assumed through `s3`'s STS with the keys
    /// `s3` gives: the grant a deployment gives to catalog users that
    /// hold no keys of their own.
    pub fn start_vending(dir: &Path, warehouse: &str, s3: &S3Server, role: &str) -> RestServer {
        let vending = format!(
            "[credentials]\nprovider = \"aws\"\n[credentials.aws]\nregion = \"us-east-1\"\nrole_arn = {role:?}\n"
        );
        let sts = s3.environment();
        RestServer::start_on_s3_with(dir, warehouse, s3, &vending, &sts)
    }

    fn start_on_s3_with(
        dir: &Path,
        warehouse: &str,
        s3: &S3Server,
        more_config: &str,
        env: &[(&str, String)],
    ) -> RestServer {
        let properties: String = s3
            .properties()
            .iter()
            .chain(&[
                "s3.region=us-east-1".to_owned(),
                "s3.path-style-access=true".to_owned(),
            ])
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| format!("{k:?} = {v:?}\n"))
            .collect();
        let config = dir.join("rustberg.toml");
        // A config file turns rate limiting on, which a test's bursts trip.
        let text = format!(
            "[storage.properties]\n{properties}[rate_limit]\nenabled = false\n{more_config}"
        );
        std::fs::write(&config, text).expect("write rustberg.toml");
        let config = config.display().to_string();
        RestServer::start_with(dir, warehouse, &["--config", &config], env)
    }

    fn start_with(
        dir: &Path,
        warehouse: &str,
        args: &[&str],
        env: &[(&str, String)],
    ) -> RestServer {
        let port = super::free_port();
        let log = std::fs::File::create(dir.join("rustberg.log")).expect("create the server's log");
        let child = Command::new(rustberg())
            .args(["--dev", "--no-auth", "--insecure-http"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .arg("--catalog-url")
            .arg(format!("file://{}", dir.join("catalog").display()))
            .args(["--warehouse", warehouse])
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start rustberg");
        let server = RestServer {
            child,
            uri: format!("http://127.0.0.1:{port}"),
        };
        super::wait_for_port(port, "rustberg", || {
            std::fs::read_to_string(dir.join("rustberg.log")).unwrap_or_default()
        });
        server
    }
}

impl Drop for RestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The rustberg binary, installed once per checkout.
fn rustberg() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools");
        let bin = root.join("bin/rustberg");
        let marker = root.join(format!("rustberg-{RUSTBERG}-{FEATURES}.installed"));
        if marker.is_file() {
            return bin;
        }
        std::fs::create_dir_all(&root).expect("create target/test-tools");
        let lock = std::fs::File::create(root.join("rustberg.lock")).expect("create the lock");
        lock.lock().expect("lock target/test-tools/rustberg.lock");
        if marker.is_file() {
            return bin;
        }
        eprintln!("installing rustberg {RUSTBERG} into {}", root.display());
        // At the lowest priority: tests running meanwhile keep the CPU.
        let out = Command::new("nice")
            .args(["-n", "19", env!("CARGO")])
            .args(["install", "--locked", "--debug", "--quiet", "rustberg"])
            .args([
                "--version",
                RUSTBERG,
                "--no-default-features",
                "--features",
                FEATURES,
            ])
            .arg("--root")
            .arg(&root)
            .env("CARGO_TARGET_DIR", root.join("build"))
            // A test server needs no debugger: a quicker build.
            .env("CARGO_PROFILE_DEV_DEBUG", "0")
            .output()
            .expect("run cargo install");
        assert!(
            out.status.success(),
            "cargo install rustberg failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&marker, "").expect("mark rustberg installed");
        bin
    })
}
