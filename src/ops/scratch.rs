//! A throwaway PostgreSQL server: `initdb` into a temporary folder, started
//! with `wal_level=logical` on a free loopback port, removed afterwards.
//! The demo and the integration tests run against one.
//!
//! Server binaries are found through `WAL2ICEBERG_PG_BIN` (a bin folder),
//! then `pg_config --bindir`, then `PATH`, then the newest
//! `/usr/lib/postgresql/*/bin`. `initdb` refuses to run as root, so as root
//! the server runs as the `postgres` OS user through `runuser`.
//!
//! Teardown happens on drop, and also when the owning process dies without
//! dropping (a panic in a static, `kill -9`): a watchdog process started
//! with the server stops it and removes the folder once the owner is gone.

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::error::{Error, ErrorKind, Result};

/// Environment variable naming a PostgreSQL bin folder.
pub const PG_BIN_ENV: &str = "WAL2ICEBERG_PG_BIN";

pub struct ScratchPostgres {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
    watchdog: Option<Child>,
}

/// How `pg_ctl stop` ends the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Sessions are ended, a shutdown checkpoint is written.
    Fast,
    /// Every process is killed at once, like a crash.
    Immediate,
}

impl StopMode {
    fn name(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

impl ScratchPostgres {
    /// Creates and starts a server. `settings` become extra lines of
    /// postgresql.conf; `hba` lines go before the final trust-all rules.
    pub fn start(settings: &[(&str, &str)], hba: &[&str]) -> Result<ScratchPostgres> {
        let bin = find_bin_dir()?;
        let root = tempfile::Builder::new()
            .prefix("wal2iceberg-pg-")
            .tempdir()
            .map_err(|e| scratch_error("cannot create a temporary folder").with_source(e))?
            .keep();
        let as_postgres = running_as_root();
        if as_postgres {
            let (uid, gid) = postgres_user_ids()?;
            std::os::unix::fs::chown(&root, Some(uid), Some(gid)).map_err(|e| {
                scratch_error("cannot hand the folder to the postgres user").with_source(e)
            })?;
        }
        let port = free_port()?;
        let mut server = ScratchPostgres {
            root,
            bin,
            port,
            as_postgres,
            watchdog: None,
        };
        server.run(
            "initdb",
            &[
                "-D",
                &server.data_dir().to_string_lossy(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        )?;
        let mut conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             wal_level = logical\nmax_replication_slots = 200\nmax_wal_senders = 60\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
             max_connections = 200\nwal_sender_timeout = 60s\n",
            server.root.display()
        );
        for (key, value) in settings {
            conf.push_str(&format!("{key} = {value}\n"));
        }
        append(&server.data_dir().join("postgresql.conf"), &conf)?;
        let mut rules = String::new();
        for line in hba {
            rules.push_str(line);
            rules.push('\n');
        }
        rules.push_str("local all all trust\nhost all all 127.0.0.1/32 trust\n");
        write(&server.data_dir().join("pg_hba.conf"), &rules)?;
        server.watchdog = Some(server.spawn_watchdog()?);
        server.start_server()?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The folder of `postgresql.conf` and the data.
    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// A folder the server's user can read, for files the server needs.
    pub fn work_dir(&self) -> &Path {
        &self.root
    }

    /// A connection URL as the `postgres` superuser.
    pub fn url(&self, dbname: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{dbname}?sslmode=disable",
            self.port
        )
    }

    /// Crash-stops the server (`immediate`): no clean shutdown needed for a
    /// folder that is removed next.
    fn stop_immediately(&self) -> Result<()> {
        self.pg_ctl(&["stop", "-m", StopMode::Immediate.name(), "-w"])
    }

    /// Stops the server the given way and starts it again on the same port
    /// (after `Immediate`, the start runs crash recovery).
    pub fn restart(&self, mode: StopMode) -> Result<()> {
        self.pg_ctl(&["stop", "-m", mode.name(), "-w"])?;
        self.start_server()
    }

    /// Re-reads postgresql.conf and pg_hba.conf.
    pub fn reload(&self) -> Result<()> {
        self.pg_ctl(&["reload"])
    }

    /// Gives a file to the server's OS user (for certificates and keys).
    pub fn hand_over(&self, path: &Path) -> Result<()> {
        if self.as_postgres {
            let (uid, gid) = postgres_user_ids()?;
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| {
                scratch_error("cannot hand a file to the postgres user").with_source(e)
            })?;
        }
        Ok(())
    }

    fn start_server(&self) -> Result<()> {
        let log = self.root.join("server.log");
        self.pg_ctl(&["start", "-w", "-t", "60", "-l", &log.to_string_lossy()])
            .map_err(|e| {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: String = tail
                    .lines()
                    .rev()
                    .take(20)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                e.with_context("server_log", tail)
            })
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<()> {
        let data = self.data_dir();
        let mut all = vec!["-D", data.to_str().unwrap_or_default()];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all)
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<()> {
        let output = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| scratch_error(format!("cannot run {program}")).with_source(e))?;
        if !output.status.success() {
            return Err(scratch_error(format!("{program} failed"))
                .with_context("status", output.status)
                .with_context("stderr", String::from_utf8_lossy(&output.stderr).trim()));
        }
        Ok(())
    }

    /// A shell loop that waits for this process to end, then stops the
    /// server and removes the folder. It runs in its own session so that
    /// signals sent to our process group do not reach it.
    fn spawn_watchdog(&self) -> Result<Child> {
        let pg_ctl = self.bin.join("pg_ctl");
        let runner = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        let script = format!(
            "while kill -0 {owner} 2>/dev/null; do sleep 0.5; done; \
             {runner}'{pg_ctl}' -D '{data}' stop -m immediate >/dev/null 2>&1; rm -rf '{root}'",
            owner = std::process::id(),
            pg_ctl = pg_ctl.display(),
            data = self.data_dir().display(),
            root = self.root.display(),
        );
        Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| scratch_error("cannot start the teardown watchdog").with_source(e))
    }
}

impl Drop for ScratchPostgres {
    fn drop(&mut self) {
        let _ = self.stop_immediately();
        let _ = std::fs::remove_dir_all(&self.root);
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

/// The PostgreSQL bin folder, in the documented order.
pub fn find_bin_dir() -> Result<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os(PG_BIN_ENV).map(PathBuf::from) {
        if has_server(&dir) {
            return Ok(dir);
        }
        return Err(scratch_error(format!(
            "{PG_BIN_ENV}={} has no initdb and pg_ctl",
            dir.display()
        )));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server(&dir) {
            return Ok(dir);
        }
    }
    if let Some(path) = std::env::var_os("PATH")
        && let Some(dir) = std::env::split_paths(&path).find(|d| has_server(d))
    {
        return Ok(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            has_server(&bin).then_some((major, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or_else(|| {
        scratch_error(format!(
            "no PostgreSQL server binaries found: install them (Debian: apt-get install postgresql) \
             or set {PG_BIN_ENV} to a folder with initdb and pg_ctl"
        ))
    })
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

fn postgres_user_ids() -> Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&"postgres") && fields.len() > 3)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        })
        .ok_or_else(|| {
            scratch_error(
                "running as root, but there is no postgres OS user to run the server as \
                 (initdb refuses root): create one (useradd postgres)",
            )
        })
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| scratch_error("cannot find a free port").with_source(e))?;
    Ok(listener.local_addr()?.port())
}

fn append(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::from(e).with_context("file", path.display()))
}

fn scratch_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Io, message)
}
