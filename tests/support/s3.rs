//! An S3 server for the lake tests: moto's (`moto[server]` from PyPI,
//! installed with the readers in the harness's virtual environment), one
//! per test, on a free loopback port, stopped when dropped.

use std::process::{Child, Command, Stdio};

pub struct S3Server {
    child: Child,
    pub endpoint: String,
}

/// The credentials moto takes (any would do).
pub const KEY_ID: &str = "testing";
pub const SECRET: &str = "testing-secret";

/// moto's server, its S3 clock set back by `argv[1]` seconds: every object
/// it stores reads that much older (S3 has no call that backdates one).
const MOTO_BEHIND: &str = "import datetime, sys\n\
                           import moto.s3.models as models\n\
                           from moto.server import main\n\
                           now, behind = models.utcnow, datetime.timedelta(seconds=int(sys.argv[1]))\n\
                           models.utcnow = lambda: now() - behind\n\
                           main(sys.argv[2:])";

impl S3Server {
    pub fn start() -> S3Server {
        S3Server::start_behind(0)
    }

    /// A server whose objects read `secs` older than they are: the age of
    /// files a crash left long ago, for the orphan sweep.
    pub fn start_behind(secs: u64) -> S3Server {
        let port = super::free_port();
        let python = crate::support::python();
        let child = Command::new(python)
            .args(["-c", MOTO_BEHIND, &secs.to_string()])
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start moto with {}: {e}", python.display()));
        let server = S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        super::wait_for_port(port, "moto_server", String::new);
        server
    }

    /// Creates a bucket named after `prefix`, unique to the test; its name.
    pub async fn bucket(&self, prefix: &str) -> String {
        let name = crate::support::unique(prefix)
            .to_lowercase()
            .replace('_', "-");
        let script = "import sys, urllib.request\n\
                      urllib.request.urlopen(urllib.request.Request(sys.argv[1], method='PUT'))";
        self.python(script, &[&format!("{}/{name}", self.endpoint)])
            .await;
        name
    }

    /// How many objects of `bucket` have keys beginning with `prefix`.
    /// Stores `body` at `key` (an unsigned PUT, which moto takes).
    pub async fn put(&self, bucket: &str, key: &str, body: &str) {
        let script = "import sys, urllib.request\n\
                      urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), method='PUT'))";
        self.python(
            script,
            &[&format!("{}/{bucket}/{key}", self.endpoint), body],
        )
        .await;
    }

    pub async fn objects(&self, bucket: &str, prefix: &str) -> usize {
        let script = "import sys, urllib.parse, urllib.request\n\
                      q = urllib.parse.urlencode({'prefix': sys.argv[2]})\n\
                      body = urllib.request.urlopen(sys.argv[1] + '?' + q).read().decode()\n\
                      print(body.count('<Key>'))";
        let out = self
            .python(script, &[&format!("{}/{bucket}", self.endpoint), prefix])
            .await;
        out.trim().parse().unwrap()
    }

    /// Runs a Python `script` against the server; its stdout.
    async fn python(&self, script: &str, args: &[&str]) -> String {
        let out = tokio::process::Command::new(crate::support::python())
            .args(["-c", script])
            .args(args)
            .output()
            .await
            .expect("run python");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The catalog properties that reach this server, as flags take them.
    pub fn properties(&self) -> Vec<String> {
        vec![
            format!("s3.endpoint={}", self.endpoint),
            format!("s3.access-key-id={KEY_ID}"),
            format!("s3.secret-access-key={SECRET}"),
        ]
    }

    /// The same as the `AWS_*` variables a user would set instead.
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", KEY_ID.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.to_owned()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
