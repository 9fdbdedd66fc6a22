//! An Iceberg REST catalog server for the lake tests: rustberg, a crate
//! built on the Apache iceberg crates, installed from crates.io into
//! `target/test-tools` by the first test that needs it (a debug build
//! without TLS or cloud storage: the tests' warehouses are local folders);
//! one server per test, on a free loopback port, its catalog in a redb
//! file of the test's, stopped when dropped.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

const RUSTBERG: &str = "0.3.0";

pub struct RestServer {
    child: Child,
    pub uri: String,
}

impl RestServer {
    /// A server whose tables live under `warehouse`, its catalog in `dir`.
    pub fn start(dir: &Path, warehouse: &Path) -> RestServer {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        std::fs::create_dir_all(warehouse).expect("create the warehouse");
        let log = std::fs::File::create(dir.join("rustberg.log")).expect("create the server's log");
        let child = Command::new(rustberg())
            .args(["--dev", "--no-auth", "--insecure-http"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--catalog-url")
            .arg(format!("file://{}", dir.join("catalog.redb").display()))
            .arg("--warehouse")
            .arg(format!("file://{}", warehouse.display()))
            .env("RUST_LOG", "warn")
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
        let marker = root.join(format!("rustberg-{RUSTBERG}.installed"));
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
                "cli",
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
