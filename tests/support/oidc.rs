//! An OpenID provider for the REST catalog tests: `oidc-provider`, a
//! certified OpenID Connect server library from npm, installed once per
//! checkout into `target/test-tools/oidc` and run on node by
//! `oidc_provider.mjs` beside this file: OAuth2's client credentials grant
//! for one client, RS256-signed JWT access tokens for the catalog's
//! audience carrying the roles claim a catalog's policies read; its log
//! names each grant and refusal. One per test, on a free loopback port,
//! stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

const OIDC_PROVIDER: &str = "8.8.1";

/// The client wal2iceberg and the readers authenticate as.
pub const CLIENT_ID: &str = "wal2iceberg";
/// The audience (`aud`) of the tokens it issues.
const AUDIENCE: &str = "urn:wal2iceberg:catalog";

pub struct OidcProvider {
    child: Child,
    log: PathBuf,
    /// Its issuer URL, which every token names (`iss`).
    pub issuer: String,
}

impl OidcProvider {
    /// A provider that grants tokens to [`CLIENT_ID`] with `secret`; its
    /// log in `dir`.
    pub fn start(dir: &Path, secret: &str) -> OidcProvider {
        let port = super::free_port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/oidc_provider.mjs");
        let log_path = dir.join("oidc.log");
        let log = std::fs::File::create(&log_path).expect("create the provider's log");
        let child = Command::new("node")
            .arg(script)
            .args([&port.to_string(), CLIENT_ID, secret, AUDIENCE])
            .arg(modules())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("start node (the OpenID provider)");
        let provider = OidcProvider {
            child,
            log: log_path,
            issuer: format!("http://127.0.0.1:{port}"),
        };
        super::wait_for_port(port, "the OpenID provider", || provider.log());
        provider
    }

    /// What it printed: `grant <client>` for each token issued, `refused
    /// <client>: <error>` for each request refused.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where clients exchange their credential for a token.
    pub fn token_endpoint(&self) -> String {
        format!("{}/token", self.issuer)
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `node_modules` folder holding oidc-provider, installed once per
/// checkout.
fn modules() -> &'static Path {
    static MODULES: OnceLock<PathBuf> = OnceLock::new();
    MODULES.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools/oidc");
        let modules = root.join("node_modules");
        let marker = root.join(format!("oidc-provider-{OIDC_PROVIDER}.installed"));
        if marker.is_file() {
            return modules;
        }
        std::fs::create_dir_all(&root).expect("create target/test-tools/oidc");
        let lock = std::fs::File::create(root.join("install.lock")).expect("create the lock");
        lock.lock()
            .expect("lock target/test-tools/oidc/install.lock");
        if marker.is_file() {
            return modules;
        }
        let out = Command::new("npm")
            .args([
                "install",
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--prefix",
            ])
            .arg(&root)
            .arg(format!("oidc-provider@{OIDC_PROVIDER}"))
            .stdin(Stdio::null())
            .output()
            .expect("run npm (node's package manager: apt-get install npm)");
        assert!(
            out.status.success(),
            "npm install oidc-provider failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&marker, "").expect("mark oidc-provider installed");
        modules
    })
}
