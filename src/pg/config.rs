//! Connection settings, following libpq's conventions
//! (<https://www.postgresql.org/docs/current/libpq-connect.html>):
//! a `postgres://` URL or a `key=value` string; what it leaves out comes
//! from `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`,
//! `PGSSLMODE`, `PGSSLROOTCERT`, `PGAPPNAME`, `PGCONNECT_TIMEOUT`, then from
//! the password file (`PGPASSFILE` or `~/.pgpass`), then from defaults.
//!
//! A host starting with `/` is a Unix-socket directory. One host per
//! connection string; libpq's multi-host failover is not supported.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// How TLS is negotiated, as libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Never use TLS.
    Disable,
    /// Use TLS when the server offers it, without verifying the certificate.
    Prefer,
    /// Require TLS, without verifying the certificate.
    Require,
    /// Require TLS and a certificate chain trusted by `sslrootcert`.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<SslMode> {
        match s {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            other => Err(config_error(format!(
                "sslmode {other:?} is not supported: use disable, prefer, require, verify-ca or verify-full"
            ))),
        }
    }
}

/// A password that never shows in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Password(String);

impl Password {
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

/// Where and how to connect. Display shows everything but the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgConfig {
    /// Host name, IP address, or a Unix-socket directory (starting with `/`).
    pub host: String,
    pub port: u16,
    pub user: String,
    pub(crate) password: Option<Password>,
    pub dbname: String,
    pub(crate) sslmode: SslMode,
    /// CA certificates (PEM) for verify-ca and verify-full; the system's
    /// roots when unset.
    pub(crate) sslrootcert: Option<PathBuf>,
    pub application_name: String,
    pub(crate) connect_timeout: Duration,
}

const DEFAULT_PORT: u16 = 5432;
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const DEFAULT_APPLICATION_NAME: &str = "wal2iceberg";

impl fmt::Display for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host={} port={} user={} dbname={}",
            self.host, self.port, self.user, self.dbname
        )
    }
}

impl PgConfig {
    /// Parses a connection string, filling the gaps from the process
    /// environment and the password file.
    pub fn parse(conninfo: &str) -> Result<PgConfig> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        PgConfig::parse_with(conninfo, |k| std::env::var(k).ok(), home.as_deref())
    }

    /// As [`PgConfig::parse`], with the environment and home folder given.
    pub fn parse_with(
        conninfo: &str,
        env: impl Fn(&str) -> Option<String>,
        home: Option<&Path>,
    ) -> Result<PgConfig> {
        let pairs = if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://")
        {
            parse_url(conninfo)?
        } else {
            parse_key_values(conninfo)?
        };
        let mut given = Given::default();
        for (key, value) in pairs {
            given.set(&key, value)?;
        }
        let pick = |from_string: Option<String>, var: &str| from_string.or_else(|| env(var));

        let host = pick(given.host, "PGHOST").unwrap_or_else(|| "localhost".to_owned());
        let port = match pick(given.port, "PGPORT") {
            Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| {
                config_error(format!("port {p:?} is not a number from 1 to 65535"))
            })?,
            None => DEFAULT_PORT,
        };
        let user = pick(given.user, "PGUSER")
            .or_else(|| env("USER"))
            .ok_or_else(|| {
                config_error("no user given: set user in the connection string or PGUSER")
            })?;
        let dbname = pick(given.dbname, "PGDATABASE").unwrap_or_else(|| user.clone());
        let sslmode = SslMode::parse(
            &pick(given.sslmode, "PGSSLMODE").unwrap_or_else(|| "prefer".to_owned()),
        )?;
        let connect_timeout = match pick(given.connect_timeout, "PGCONNECT_TIMEOUT") {
            Some(t) => Duration::from_secs(t.parse::<u64>().map_err(|_| {
                config_error(format!(
                    "connect_timeout {t:?} is not a whole number of seconds"
                ))
            })?),
            None => DEFAULT_CONNECT_TIMEOUT,
        };
        let mut password = pick(given.password, "PGPASSWORD").map(Password);
        if password.is_none() {
            let passfile = pick(given.passfile, "PGPASSFILE")
                .map(PathBuf::from)
                .or_else(|| home.map(|h| h.join(".pgpass")));
            if let Some(file) = passfile {
                password = password_from_file(&file, &host, port, &dbname, &user).map(Password);
            }
        }
        Ok(PgConfig {
            host,
            port,
            user,
            password,
            dbname,
            sslmode,
            sslrootcert: pick(given.sslrootcert, "PGSSLROOTCERT").map(PathBuf::from),
            application_name: pick(given.application_name, "PGAPPNAME")
                .unwrap_or_else(|| DEFAULT_APPLICATION_NAME.to_owned()),
            connect_timeout,
        })
    }

    /// True when `host` names a Unix-socket directory.
    pub(crate) fn is_unix_socket(&self) -> bool {
        self.host.starts_with('/')
    }

    /// The settings as tokio-postgres takes them. TLS is set up by the
    /// caller from [`PgConfig::sslmode`].
    pub(crate) fn to_tokio_postgres(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .application_name(&self.application_name)
            .connect_timeout(self.connect_timeout)
            .options(SESSION_OPTIONS)
            .ssl_mode(match self.sslmode {
                SslMode::Disable => tokio_postgres::config::SslMode::Disable,
                SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
                SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                    tokio_postgres::config::SslMode::Require
                }
            });
        if let Some(p) = &self.password {
            config.password(p.expose());
        }
        config
    }
}

/// Settings every connection of ours runs with, so that text output has one
/// shape whatever the server's or role's defaults (see `cdc::temporal`).
pub(crate) const SESSION_OPTIONS: &str = "-c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=iso_8601 \
     -c extra_float_digits=3 -c bytea_output=hex -c client_encoding=UTF8";

#[derive(Default)]
struct Given {
    host: Option<String>,
    port: Option<String>,
    user: Option<String>,
    password: Option<String>,
    dbname: Option<String>,
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    application_name: Option<String>,
    connect_timeout: Option<String>,
    passfile: Option<String>,
}

impl Given {
    fn set(&mut self, key: &str, value: String) -> Result<()> {
        let slot = match key {
            "host" | "hostaddr" => &mut self.host,
            "port" => &mut self.port,
            "user" => &mut self.user,
            "password" => &mut self.password,
            "dbname" => &mut self.dbname,
            "sslmode" => &mut self.sslmode,
            "sslrootcert" => &mut self.sslrootcert,
            "application_name" => &mut self.application_name,
            "connect_timeout" => &mut self.connect_timeout,
            "passfile" => &mut self.passfile,
            other => {
                return Err(config_error(format!(
                    "unknown connection option {other:?}: supported are host, hostaddr, port, user, \
                     password, dbname, sslmode, sslrootcert, application_name, connect_timeout, passfile"
                )));
            }
        };
        if key == "host" && value.contains(',') {
            return Err(config_error(
                "several hosts in one connection string are not supported",
            ));
        }
        *slot = Some(value);
        Ok(())
    }
}

fn config_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Config, message)
}

/// `key=value key2='quoted \' value'`, as libpq's conninfo strings.
fn parse_key_values(s: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(config_error(format!(
                "connection string: missing \"=\" after {key:?} (expected key=value pairs or a postgres:// URL)"
            )));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => {
                        return Err(config_error(format!(
                            "connection string: unterminated quoted value for {key:?}"
                        )));
                    }
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// `postgres://user:password@host:port/dbname?key=value&...`
fn parse_url(url: &str) -> Result<Vec<(String, String)>> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut pairs = Vec::new();
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if let Some(userinfo) = userinfo {
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        if !user.is_empty() {
            pairs.push(("user".to_owned(), percent_decode(user)?));
        }
        if userinfo.contains(':') {
            pairs.push(("password".to_owned(), percent_decode(password)?));
        }
    }
    let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
        let (h, after) = bracketed
            .split_once(']')
            .ok_or_else(|| config_error("connection URL: unclosed [ in an IPv6 host"))?;
        (h, after.strip_prefix(':').unwrap_or(""))
    } else {
        hostport.split_once(':').unwrap_or((hostport, ""))
    };
    if !host.is_empty() {
        pairs.push(("host".to_owned(), percent_decode(host)?));
    }
    if !port.is_empty() {
        pairs.push(("port".to_owned(), port.to_owned()));
    }
    if !path.is_empty() {
        pairs.push(("dbname".to_owned(), percent_decode(path)?));
    }
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = param.split_once('=').ok_or_else(|| {
            config_error(format!("connection URL: parameter {param:?} has no \"=\""))
        })?;
        pairs.push((percent_decode(k)?, percent_decode(v)?));
    }
    Ok(pairs)
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| config_error("connection URL: invalid percent-encoding"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| config_error("connection URL: percent-encoding is not UTF-8"))
}

/// The first matching line of a libpq password file
/// (`hostname:port:database:username:password`, `*` matches anything,
/// `\:` and `\\` escape). Like libpq, a file others can read is ignored.
fn password_from_file(
    path: &Path,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                file = %path.display(),
                "password file has group or world access; ignoring it (chmod 0600 to use it)"
            );
            return None;
        }
    }
    // libpq matches socket connections against "localhost".
    let host = if host.starts_with('/') {
        "localhost"
    } else {
        host
    };
    let port = port.to_string();
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = split_pgpass_line(line);
            let [h, p, d, u, password] = fields.as_slice() else {
                return None;
            };
            let matches = |pattern: &str, value: &str| pattern == "*" || pattern == value;
            (matches(h, host) && matches(p, &port) && matches(d, dbname) && matches(u, user))
                .then(|| password.clone())
        })
}

fn split_pgpass_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut().expect("never empty").extend(chars.next()),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("never empty").push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests;
