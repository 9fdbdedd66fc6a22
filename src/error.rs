//! The one error type of the library: a kind, a message, context (table,
//! LSN, file; never row values or passwords) and the source error kept
//! attached. Whether an error is worth retrying is decided here, in
//! [`Error::is_retryable`], and nowhere else.

use std::fmt;

mod storage_fault;

pub(crate) use storage_fault::StorageFault;

pub type Result<T, E = Error> = std::result::Result<T, E>;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, in terms of what the user can do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The configuration or a command-line option is invalid.
    Config,
    /// The server could not be reached, or the connection broke.
    Connection,
    /// The server refused our credentials.
    Authentication,
    /// TLS could not be set up as `sslmode` demands.
    Tls,
    /// A preflight check failed: the source is not set up for replication.
    Preflight,
    /// The replication slot is missing, invalidated or in use elsewhere.
    Slot,
    /// The server sent bytes that do not follow the protocol.
    Protocol,
    /// A value could not be decoded into its type.
    Decode,
    /// The server reported an error for a statement.
    Server,
    /// Local I/O (spool files, output).
    Io,
    /// The Iceberg catalog or table refused an operation.
    Lake,
    /// A concurrent change spoiled a consistent read or write (a TRUNCATE
    /// after a snapshot was taken, another writer's schema change under a
    /// batch); a new attempt may succeed.
    Concurrent,
}

pub struct Error {
    kind: ErrorKind,
    message: String,
    context: Vec<(&'static str, String)>,
    /// The SQLSTATE of the server error this one reports, when the wire
    /// layer made it from one.
    sqlstate: Option<String>,
    source: Option<BoxError>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            context: Vec::new(),
            sqlstate: None,
            source: None,
        }
    }

    /// Adds a `key=value` pair naming where the error happened.
    pub(crate) fn with_context(mut self, key: &'static str, value: impl fmt::Display) -> Error {
        self.context.push((key, value.to_string()));
        self
    }

    pub fn with_source(mut self, source: impl Into<BoxError>) -> Error {
        self.source = Some(source.into());
        self
    }

    /// Records the SQLSTATE of the server error this one reports.
    pub(crate) fn with_sqlstate(mut self, code: impl Into<String>) -> Error {
        self.sqlstate = Some(code.into());
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The SQLSTATE of a server error anywhere in the source chain.
    pub(crate) fn sqlstate(&self) -> Option<&str> {
        if let Some(code) = &self.sqlstate {
            return Some(code);
        }
        let mut cause: Option<&(dyn std::error::Error + 'static)> = self
            .source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static));
        while let Some(err) = cause {
            if let Some(db) = err.downcast_ref::<tokio_postgres::error::DbError>() {
                return Some(db.code().code());
            }
            if let Some(pg) = err.downcast_ref::<tokio_postgres::Error>()
                && let Some(db) = pg.as_db_error()
            {
                return Some(db.code().code());
            }
            if let Some(code) = err.downcast_ref::<Error>().and_then(Error::sqlstate) {
                return Some(code);
            }
            cause = err.source();
        }
        None
    }

    /// How the lake's storage failed, when a cause says so: an object
    /// store's error, or a local file system's that a person must act on.
    /// A PostgreSQL error's causes are the connection's, and a
    /// configuration's or a TLS setup's files are not the lake's.
    pub(crate) fn storage_fault(&self) -> Option<StorageFault> {
        let about_files = |kind| matches!(kind, ErrorKind::Lake | ErrorKind::Io);
        if !about_files(self.kind) {
            return None;
        }
        let mut cause = std::error::Error::source(self);
        while let Some(err) = cause {
            let ours = err.downcast_ref::<Error>().map(Error::kind);
            if err.is::<tokio_postgres::Error>() || ours.is_some_and(|k| !about_files(k)) {
                return None;
            }
            if let Some(fault) = StorageFault::of(err) {
                return Some(fault);
            }
            cause = err.source();
        }
        None
    }

    /// True for failures that a reconnect may cure: lost connections, the
    /// server shutting down or starting up, too many connections or no free
    /// replication slot right now, local I/O. Everything else needs a person.
    pub(crate) fn is_retryable(&self) -> bool {
        match self.kind {
            ErrorKind::Connection | ErrorKind::Io => true,
            // No free replication slot for a load's temporary one: an
            // unused slot dropped, or another load ended, frees one.
            ErrorKind::Slot => self.sqlstate() == Some("53400"),
            ErrorKind::Server => self.sqlstate().is_some_and(|code| {
                code.starts_with("08")
                    || matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "40001")
            }),
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        for (i, (key, value)) in self.context.iter().enumerate() {
            let sep = if i == 0 { " (" } else { ", " };
            write!(f, "{sep}{key}={value}")?;
        }
        if !self.context.is_empty() {
            f.write_str(")")?;
        }
        // The whole chain, each cause once: tokio-postgres, for one, keeps
        // the reason for a TLS failure in its source, while iceberg's and
        // parquet's errors print their source inside their own text.
        let mut printed: Vec<String> = Vec::new();
        let mut cause = std::error::Error::source(self);
        while let Some(err) = cause {
            cause = err.source();
            let text = err.to_string();
            let inner = cause.map(ToString::to_string);
            let own = own_part(&text, inner.as_deref());
            // A bare label ("External") says nothing its cause does not.
            let label = cause.is_some() && !own.contains(char::is_whitespace);
            if !own.is_empty() && !label && !printed.iter().any(|p| p.contains(own)) {
                write!(f, ": {own}")?;
                printed.push(own.to_owned());
            }
        }
        if let Some(fault) = self.storage_fault() {
            write!(f, "; {}", fault.explanation())?;
        }
        Ok(())
    }
}

/// What `text`, an error's display, says beside its cause's `inner`
/// display: the text before it, without the joint (`: `, `, source: `).
fn own_part<'t>(text: &'t str, inner: Option<&str>) -> &'t str {
    let mut own = match inner.filter(|i| !i.is_empty()).and_then(|i| text.find(i)) {
        Some(at) => &text[..at],
        None => text,
    };
    loop {
        let trimmed = own
            .trim_end_matches(|c: char| c == ':' || c == ',' || c.is_whitespace())
            .trim_end_matches("source");
        if trimmed.len() == own.len() {
            return trimmed;
        }
        own = trimmed;
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {self}", self.kind)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The reader of the standard output went away (EPIPE, as under
/// `| head`): the command's normal end, not a failure.
#[derive(Debug)]
pub struct OutputClosed;

impl fmt::Display for OutputClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the standard output was closed")
    }
}

impl std::error::Error for OutputClosed {}

impl Error {
    /// True when the error is [`OutputClosed`], directly or inside the
    /// I/O error that carried it.
    pub fn is_output_closed(&self) -> bool {
        self.source.as_deref().is_some_and(|source| {
            source.is::<OutputClosed>()
                || source
                    .downcast_ref::<std::io::Error>()
                    .and_then(std::io::Error::get_ref)
                    .is_some_and(|inner| inner.is::<OutputClosed>())
        })
    }
}

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Error {
        Error::new(ErrorKind::Io, "I/O failed").with_source(err)
    }
}

/// Wraps a tokio-postgres error as a server error (or a connection error
/// when the connection is gone or could not be made: a closed connection,
/// or any socket failure, a refused connect included), with the
/// statement's purpose as message.
pub(crate) fn postgres(err: tokio_postgres::Error, doing: &str) -> Error {
    let socket_failed = std::error::Error::source(&err).is_some_and(|e| e.is::<std::io::Error>());
    let kind = if err.is_closed() || socket_failed {
        ErrorKind::Connection
    } else {
        ErrorKind::Server
    };
    Error::new(kind, doing.to_owned()).with_source(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connect_is_retryable_and_a_server_error_is_not() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let refused = tokio_postgres::connect(
            &format!("host=127.0.0.1 port={port} user=nobody connect_timeout=5"),
            tokio_postgres::NoTls,
        )
        .await
        .err()
        .expect("nothing listens on a port just freed");
        let err = postgres(refused, "cannot connect");
        assert!(err.is_retryable(), "{err} is {:?}", err.kind());

        let syntax = Error::new(ErrorKind::Server, "a statement failed");
        assert!(!syntax.is_retryable());
    }

    /// parquet's way: `External: {source}`, its source kept too.
    #[derive(Debug)]
    struct External(Box<dyn std::error::Error + Send + Sync>);

    impl fmt::Display for External {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "External: {}", self.0)
        }
    }

    impl std::error::Error for External {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(self.0.as_ref())
        }
    }

    #[test]
    fn each_cause_prints_once_and_a_full_disk_says_so_with_the_fix() {
        let disk = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let nested = External(Box::new(External(Box::new(disk))));
        let iceberg = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "cannot write")
            .with_context("path", "/lake/data/x.parquet")
            .with_source(nested);
        let err = Error::new(ErrorKind::Lake, "cannot write the batch")
            .with_context("table", "public.t")
            .with_source(iceberg);
        let text = err.to_string();
        assert_eq!(err.storage_fault(), Some(StorageFault::DiskFull));
        assert_eq!(text.matches("External").count(), 0, "{text}");
        assert_eq!(text.matches("no storage space").count(), 1, "{text}");
        assert!(text.contains("/lake/data/x.parquet"), "{text}");
        assert!(
            text.ends_with(StorageFault::DiskFull.explanation()),
            "{text}"
        );
    }

    #[test]
    fn only_the_lakes_files_are_storage_faults() {
        let denied = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let key = Error::new(ErrorKind::Tls, "cannot read the client key").with_source(denied());
        assert_eq!(key.storage_fault(), None);
        let lake = Error::new(ErrorKind::Io, "cannot write").with_source(denied());
        assert_eq!(lake.storage_fault(), Some(StorageFault::NoPermission));
        let wrapped = Error::new(ErrorKind::Lake, "cannot commit").with_source(key);
        assert_eq!(wrapped.storage_fault(), None);
    }
}
