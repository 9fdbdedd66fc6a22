//! The S3 server of the benchmark's s3 phase.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{BenchResult, ack_relay};

/// An S3 server on a free loopback port, its request log in a file:
/// s3s-fs (Rust, a folder behind S3's API) when it is installed, on PATH
/// or in `target/test-tools/bin`, else moto's (Python, `python3 -m
/// moto.server`), which costs far more CPU on the cores it shares. Used
/// through an [`ack_relay`].
pub struct S3Server {
    child: std::process::Child,
    /// The relay's address: the one to use.
    pub addr: String,
    /// The server's own.
    direct: String,
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
        let relay = ack_relay::start(addr.parse()?)?;
        Ok(S3Server {
            child,
            addr: relay.to_string(),
            direct: addr,
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

    /// The mean time of a GET of a 4 KB object on a kept-alive
    /// connection, in ms, through the relay and to the server directly
    /// (curl's, over 8 GETs after the connection's first; the stall comes
    /// every other GET or so, so a median hides it); an error without a
    /// curl that signs requests (7.75 or later).
    pub fn round_trips(&self) -> BenchResult<(f64, f64)> {
        let object = tempfile::NamedTempFile::new()?;
        std::fs::write(object.path(), vec![b'x'; 4096])?;
        let curl = |addr: &str, extra: &[&str], urls: usize| {
            let url = format!("http://{addr}/bench/probe");
            Command::new("curl")
                .args(["-sf", "-w", "%{time_total}\n"])
                .args([
                    "--aws-sigv4",
                    "aws:amz:us-east-1:s3",
                    "--user",
                    "bench:bench",
                ])
                .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
                .args(extra)
                .args((0..urls).flat_map(|_| ["-o", "/dev/null", &url]))
                .output()
        };
        let put = curl(&self.addr, &["-T", &object.path().display().to_string()], 1)?;
        if !put.status.success() {
            return Err(format!("curl could not PUT the probe: {put:?}").into());
        }
        let mean = |addr: &str| -> BenchResult<f64> {
            let got = curl(addr, &[], 9)?;
            if !got.status.success() {
                return Err(format!("curl could not GET the probe: {got:?}").into());
            }
            let times: Vec<f64> = String::from_utf8(got.stdout)?
                .lines()
                .skip(1)
                .map(str::parse)
                .collect::<Result<_, _>>()?;
            Ok(times.iter().sum::<f64>() / times.len() as f64 * 1000.0)
        };
        Ok((mean(&self.addr)?, mean(&self.direct)?))
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
