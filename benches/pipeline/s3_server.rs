//! The S3 server of the benchmark's s3 phase.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::BenchResult;

/// An S3 server on a free loopback port, its request log in a file:
/// s3s-fs (Rust, a folder behind S3's API) when it is installed, on PATH
/// or in `target/test-tools/bin`, else moto's (Python, `python3 -m
/// moto.server`), which costs far more CPU on the cores it shares.
pub struct S3Server {
    child: std::process::Child,
    pub addr: String,
    log: tempfile::NamedTempFile,
    /// s3s-fs's data folder, where a bucket is a folder; `None` for moto.
    root: Option<tempfile::TempDir>,
}

impl S3Server {
    pub fn start() -> BenchResult<S3Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port()
            .to_string();
        let log = tempfile::NamedTempFile::new()?;
        let s3s = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
            .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools/bin")])
            .map(|dir| dir.join("s3s-fs"))
            .find(|bin| bin.is_file());
        let (mut command, root) = match s3s {
            Some(bin) => {
                let root = tempfile::Builder::new()
                    .prefix("wal2iceberg-bench-s3s-")
                    .tempdir()?;
                let mut c = Command::new(bin);
                c.args(["--host", "127.0.0.1", "--port", &port])
                    .args(["--access-key", "bench", "--secret-key", "bench"])
                    .arg(root.path())
                    .env("RUST_LOG", "s3s::service=debug");
                (c, Some(root))
            }
            None => {
                let mut c = Command::new("python3");
                c.args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port]);
                (c, None)
            }
        };
        let child = command
            .stdout(log.reopen()?)
            .stderr(log.reopen()?)
            .spawn()
            .map_err(|e| format!("start an S3 server ({command:?}): {e}"))?;
        let addr = format!("127.0.0.1:{port}");
        let give_up = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&addr).is_err() {
            if Instant::now() > give_up {
                return Err("the S3 server did not listen (s3s-fs, or moto[server])".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(S3Server {
            child,
            addr,
            log,
            root,
        })
    }

    pub fn name(&self) -> &'static str {
        match self.root {
            Some(_) => "s3s-fs",
            None => "moto",
        }
    }

    pub async fn create_bucket(&self, bucket: &str) -> BenchResult<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if let Some(root) = &self.root {
            std::fs::create_dir(root.path().join(bucket))?;
            return Ok(());
        }
        let mut stream = tokio::net::TcpStream::connect(&self.addr).await?;
        let request = format!(
            "PUT /{bucket} HTTP/1.0\r\nHost: {}\r\nContent-Length: 0\r\n\r\n",
            self.addr
        );
        stream.write_all(request.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        if !answer.starts_with("HTTP/1.0 200") && !answer.starts_with("HTTP/1.1 200") {
            return Err(format!("create bucket {bucket}: {answer}").into());
        }
        Ok(())
    }

    /// The CPU time the server used so far (`/proc/<pid>/stat`).
    pub fn cpu_seconds(&self) -> BenchResult<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // utime and stime, fields 14 and 15, after the parenthesised name.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .ok_or("an unreadable /proc stat")?
            .1
            .split_whitespace()
            .collect();
        let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
        Ok(ticks / 100.0)
    }

    /// (requests, `metadata.json` objects written) the log holds so far:
    /// a request is a line of moto's access log, or of s3s's debug log.
    pub fn requests(&self) -> BenchResult<(u64, u64)> {
        let log = std::fs::read_to_string(self.log.path())?;
        let (request, put, metadata) = match self.root {
            Some(_) => ("req: Request { method:", "method: PUT", ".metadata.json,"),
            None => (" HTTP/1.1", "PUT /", ".metadata.json "),
        };
        let (mut all, mut commits) = (0, 0);
        for line in log.lines().filter(|l| l.contains(request)) {
            all += 1;
            if line.contains(put) && line.contains(metadata) {
                commits += 1;
            }
        }
        Ok((all, commits))
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
