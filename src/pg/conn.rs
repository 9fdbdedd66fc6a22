//! A replication connection (`replication=database`), spoken directly over
//! the frontend/backend protocol.
//!
//! tokio-postgres cannot open one, and postgres-protocol's backend parser
//! does not know CopyBothResponse (`W`), so this module frames messages
//! itself: every frame's length is checked before anything is read or
//! allocated, `W` is handled here, and all other frames go to
//! postgres-protocol's parser.
//!
//! Startup, TLS and authentication follow "Message Flow"
//! (<https://www.postgresql.org/docs/current/protocol-flow.html>): an
//! SSLRequest first unless `sslmode=disable`, then the StartupMessage, then
//! cleartext, MD5 or SCRAM-SHA-256 authentication. A replication connection
//! takes the simple query protocol only.

use std::collections::HashMap;
use std::fmt;

use bytes::{Buf, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::backend::{ErrorFields, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::config::{PgConfig, SESSION_OPTIONS, SslMode};
use super::tls;
use crate::error::{Error, ErrorKind, Result};

/// The largest backend message we accept: a value of the maximum size the
/// server can store (1 GB) with room for the message around it.
const MAX_FRAME_LEN: usize = (1 << 30) + (1 << 20);

/// CopyBothResponse tag, which postgres-protocol does not parse.
pub(crate) const COPY_BOTH_RESPONSE: u8 = b'W';

pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// An error or notice the server reported, with its fields kept apart.
#[derive(Debug, Clone)]
pub(crate) struct ServerError {
    pub(crate) severity: String,
    pub(crate) code: String,
    pub(crate) message: String,
    pub(crate) detail: Option<String>,
    pub(crate) hint: Option<String>,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (SQLSTATE {})",
            self.severity, self.message, self.code
        )?;
        if let Some(detail) = &self.detail {
            write!(f, "; detail: {detail}")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "; hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerError {}

impl ServerError {
    /// The fields of an ErrorResponse or a NoticeResponse; a malformed
    /// field ends the list.
    pub(crate) fn from_fields(mut fields: ErrorFields<'_>) -> ServerError {
        let mut err = ServerError {
            severity: String::new(),
            code: String::new(),
            message: String::new(),
            detail: None,
            hint: None,
        };
        while let Ok(Some(field)) = fields.next() {
            let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
            match field.type_() {
                b'S' => err.severity = value,
                b'C' => err.code = value,
                b'M' => err.message = value,
                b'D' => err.detail = Some(value),
                b'H' => err.hint = Some(value),
                _ => {}
            }
        }
        err
    }
}

/// One backend message, framed.
pub(crate) enum Frame {
    CopyBothResponse,
    Message(Message),
}

/// Rows of a simple query, as text.
#[derive(Debug, Default)]
pub(crate) struct QueryResult {
    pub(crate) columns: Vec<String>,
    pub(crate) rows: Vec<Vec<Option<String>>>,
}

impl QueryResult {
    /// The value of `column` in the first row.
    pub(crate) fn get(&self, column: &str) -> Option<&str> {
        let i = self.columns.iter().position(|c| c == column)?;
        self.rows.first()?.get(i)?.as_deref()
    }
}

/// An authenticated connection in replication mode.
pub struct ReplicationConnection {
    io: Box<dyn Io>,
    read_buf: BytesMut,
    write_buf: BytesMut,
    parameters: HashMap<String, String>,
    process_id: i32,
}

impl ReplicationConnection {
    /// Connects, negotiates TLS, authenticates and waits until the server is
    /// ready for queries.
    pub async fn connect(config: &PgConfig) -> Result<ReplicationConnection> {
        let io = tokio::time::timeout(config.connect_timeout, open(config))
            .await
            .map_err(|_| {
                connection_error("timed out connecting to the server")
                    .with_context("host", &config.host)
                    .with_context("port", config.port)
            })??;
        let mut conn = ReplicationConnection {
            io,
            read_buf: BytesMut::with_capacity(64 * 1024),
            write_buf: BytesMut::new(),
            parameters: HashMap::new(),
            process_id: 0,
        };
        conn.startup(config).await?;
        Ok(conn)
    }

    /// The server's `server_version_num`-style major version, e.g. 150004.
    pub(crate) fn server_version_num(&self) -> u32 {
        let version = self
            .parameters
            .get("server_version")
            .map(String::as_str)
            .unwrap_or("");
        let mut parts = version
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let major = parts.next().unwrap_or(0);
        let minor = parts.next().unwrap_or(0);
        major * 10_000 + minor
    }

    /// The backend's process id, as `pg_stat_replication.pid` shows it.
    pub fn process_id(&self) -> i32 {
        self.process_id
    }

    async fn startup(&mut self, config: &PgConfig) -> Result<()> {
        let params = [
            ("user", config.user.as_str()),
            ("database", config.dbname.as_str()),
            ("replication", "database"),
            ("application_name", config.application_name.as_str()),
            ("options", SESSION_OPTIONS),
        ];
        frontend::startup_message(params.iter().copied(), &mut self.write_buf).map_err(|e| {
            Error::new(ErrorKind::Config, "invalid startup parameter").with_source(e)
        })?;
        self.flush().await?;
        self.authenticate(config).await?;
        loop {
            match self.read_message().await? {
                Message::ParameterStatus(p) => {
                    let name = p.name().map_err(protocol_error)?.to_owned();
                    let value = p.value().map_err(protocol_error)?.to_owned();
                    self.parameters.insert(name, value);
                }
                Message::BackendKeyData(k) => self.process_id = k.process_id(),
                Message::ReadyForQuery(_) => return Ok(()),
                Message::NoticeResponse(_) => {}
                _ => return Err(unexpected("startup")),
            }
        }
    }

    async fn authenticate(&mut self, config: &PgConfig) -> Result<()> {
        let password = || {
            config
                .password
                .as_ref()
                .map(|p| p.expose().as_bytes())
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Authentication,
                        "the server asks for a password but none is configured: set it in the \
                     connection string, PGPASSWORD or ~/.pgpass",
                    )
                    .with_context("user", &config.user)
                })
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            match self
                .read_message()
                .await
                .map_err(|e| auth_failure(e, config))?
            {
                Message::AuthenticationOk => return Ok(()),
                Message::AuthenticationCleartextPassword => {
                    frontend::password_message(password()?, &mut self.write_buf)?;
                }
                Message::AuthenticationMd5Password(body) => {
                    let hash = md5_hash(config.user.as_bytes(), password()?, body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.write_buf)?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut offered = false;
                    while let Some(m) = mechanisms.next().map_err(protocol_error)? {
                        offered |= m == SCRAM_SHA_256;
                    }
                    if !offered {
                        return Err(Error::new(
                            ErrorKind::Authentication,
                            "the server offers no SASL mechanism we support (SCRAM-SHA-256)",
                        ));
                    }
                    // We do not do channel binding; "n" tells the server so,
                    // which it accepts also over TLS.
                    let s = ScramSha256::new(password()?, ChannelBinding::unsupported());
                    frontend::sasl_initial_response(
                        SCRAM_SHA_256,
                        s.message(),
                        &mut self.write_buf,
                    )?;
                    scram = Some(s);
                }
                Message::AuthenticationSaslContinue(body) => {
                    let s = scram.as_mut().ok_or_else(|| unexpected("SASL exchange"))?;
                    s.update(body.data()).map_err(|e| {
                        Error::new(ErrorKind::Authentication, "SCRAM exchange failed")
                            .with_source(e)
                    })?;
                    frontend::sasl_response(s.message(), &mut self.write_buf)?;
                }
                Message::AuthenticationSaslFinal(body) => {
                    let s = scram.as_mut().ok_or_else(|| unexpected("SASL exchange"))?;
                    s.finish(body.data()).map_err(|e| {
                        Error::new(
                            ErrorKind::Authentication,
                            "the server's SCRAM signature is invalid",
                        )
                        .with_source(e)
                    })?;
                    continue;
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::Authentication,
                        "the server asks for an authentication method we do not support \
                         (supported: trust, password, md5, scram-sha-256)",
                    ));
                }
            }
            self.flush().await?;
        }
    }

    /// Runs one command with the simple query protocol and collects its rows.
    pub(crate) async fn simple_query(&mut self, sql: &str) -> Result<QueryResult> {
        self.send_query(sql).await?;
        let mut result = QueryResult::default();
        let mut error = None;
        loop {
            match self.read_message().await {
                Ok(Message::RowDescription(desc)) => {
                    let mut fields = desc.fields();
                    while let Some(f) = fields.next().map_err(protocol_error)? {
                        result.columns.push(f.name().to_owned());
                    }
                }
                Ok(Message::DataRow(row)) => {
                    let buf = row.buffer();
                    let mut values = Vec::with_capacity(result.columns.len());
                    let mut ranges = row.ranges();
                    while let Some(range) = ranges.next().map_err(protocol_error)? {
                        values.push(range.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()));
                    }
                    result.rows.push(values);
                }
                Ok(Message::ReadyForQuery(_)) => {
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(result),
                    };
                }
                Ok(
                    Message::CommandComplete(_)
                    | Message::EmptyQueryResponse
                    | Message::NoticeResponse(_)
                    | Message::ParameterStatus(_),
                ) => {}
                Err(e) if e.kind() == ErrorKind::Server => error = Some(e),
                Err(e) => return Err(e),
                Ok(_) => return Err(unexpected("a simple query")),
            }
        }
    }

    pub(crate) async fn send_query(&mut self, sql: &str) -> Result<()> {
        frontend::query(sql, &mut self.write_buf)
            .map_err(|e| Error::new(ErrorKind::Config, "invalid query text").with_source(e))?;
        self.flush().await
    }

    /// Queues raw CopyData bytes; sent with the next [`Self::flush`].
    pub(crate) fn queue_copy_data(&mut self, data: &[u8]) {
        let frame =
            frontend::CopyData::new(data).expect("a status update is far below the frame limit");
        frame.write(&mut self.write_buf);
    }

    pub(crate) fn queue_copy_done(&mut self) {
        frontend::copy_done(&mut self.write_buf);
    }

    /// Sends what is queued. Cancel-safe: bytes leave the buffer only once
    /// written, so a cancelled flush resumes where it stopped.
    pub(crate) async fn flush(&mut self) -> Result<()> {
        while !self.write_buf.is_empty() {
            let n = self
                .io
                .write_buf(&mut self.write_buf)
                .await
                .map_err(io_lost)?;
            if n == 0 {
                return Err(connection_error("the server closed the connection"));
            }
        }
        self.io.flush().await.map_err(io_lost)
    }

    /// Reads one message; an ErrorResponse becomes an `Err` of kind
    /// `Server` carrying the server's fields.
    pub(crate) async fn read_message(&mut self) -> Result<Message> {
        match self.read_frame().await? {
            Frame::Message(m) => Ok(m),
            Frame::CopyBothResponse => Err(unexpected("a message")),
        }
    }

    /// Reads one frame. Cancel-safe: a frame is only taken from the buffer
    /// once it is complete, so dropping this future loses nothing.
    pub(crate) async fn read_frame(&mut self) -> Result<Frame> {
        loop {
            if let Some(frame) = self.buffered_frame()? {
                return Ok(frame);
            }
            let n = self
                .io
                .read_buf(&mut self.read_buf)
                .await
                .map_err(io_lost)?;
            if n == 0 {
                return Err(connection_error("the server closed the connection"));
            }
        }
    }

    /// The next frame if a read before brought all of it, without reading.
    pub(crate) fn buffered_frame(&mut self) -> Result<Option<Frame>> {
        if self.read_buf.len() < 5 {
            return Ok(None);
        }
        let tag = self.read_buf[0];
        let len = i32::from_be_bytes([
            self.read_buf[1],
            self.read_buf[2],
            self.read_buf[3],
            self.read_buf[4],
        ]);
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| (4..=MAX_FRAME_LEN).contains(&l))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Protocol,
                    "the server sent a message with an invalid length",
                )
                .with_context("tag", char::from(tag).escape_default())
                .with_context("length", len)
            })?;
        if self.read_buf.len() < 1 + len {
            self.read_buf.reserve(1 + len - self.read_buf.len());
            return Ok(None);
        }
        if tag == COPY_BOTH_RESPONSE {
            self.read_buf.advance(1 + len);
            return Ok(Some(Frame::CopyBothResponse));
        }
        let message = Message::parse(&mut self.read_buf)
            .map_err(protocol_error)?
            .ok_or_else(|| unexpected("a complete frame"))?;
        if let Message::ErrorResponse(body) = &message {
            let server = ServerError::from_fields(body.fields());
            return Err(
                Error::new(ErrorKind::Server, "the server reported an error")
                    .with_sqlstate(server.code.clone())
                    .with_source(server),
            );
        }
        Ok(Some(Frame::Message(message)))
    }

    /// Closes the connection politely.
    pub async fn close(mut self) -> Result<()> {
        frontend::terminate(&mut self.write_buf);
        self.flush().await?;
        self.io.shutdown().await.map_err(io_lost)
    }
}

async fn open(config: &PgConfig) -> Result<Box<dyn Io>> {
    let where_ = || format!("{}:{}", config.host, config.port);
    if config.is_unix_socket() {
        let path = format!("{}/.s.PGSQL.{}", config.host, config.port);
        let stream = UnixStream::connect(&path).await.map_err(|e| {
            connection_error("cannot connect to the server's Unix socket")
                .with_context("socket", &path)
                .with_source(e)
        })?;
        return Ok(Box::new(stream));
    }
    let mut stream = TcpStream::connect((config.host.as_str(), config.port))
        .await
        .map_err(|e| {
            connection_error("cannot connect to the server")
                .with_context("address", where_())
                .with_source(e)
        })?;
    stream.set_nodelay(true).map_err(io_lost)?;
    let Some(tls_config) = tls::client_config(config)? else {
        return Ok(Box::new(stream));
    };
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    stream.write_all(&request).await.map_err(io_lost)?;
    let answer = stream.read_u8().await.map_err(io_lost)?;
    match answer {
        b'S' => {
            let connector = tokio_rustls::TlsConnector::from(tls_config);
            let name = tls::server_name(&config.host)?;
            let tls = connector.connect(name, stream).await.map_err(|e| {
                Error::new(ErrorKind::Tls, "TLS handshake failed")
                    .with_context("address", where_())
                    .with_context("sslmode", format!("{:?}", config.sslmode))
                    .with_source(e)
            })?;
            Ok(Box::new(tls))
        }
        b'N' if config.sslmode == SslMode::Prefer => Ok(Box::new(stream)),
        b'N' => Err(Error::new(
            ErrorKind::Tls,
            "the server does not accept TLS connections, but sslmode requires TLS: enable ssl on \
             the server or use sslmode=prefer",
        )
        .with_context("address", where_())),
        other => Err(
            Error::new(ErrorKind::Protocol, "unexpected answer to SSLRequest")
                .with_context("byte", other),
        ),
    }
}

fn auth_failure(err: Error, config: &PgConfig) -> Error {
    let code = err.sqlstate().map(str::to_owned);
    match code.as_deref() {
        Some("28P01" | "28000") => Error::new(
            ErrorKind::Authentication,
            "the server rejected the login: check the user, the password and pg_hba.conf",
        )
        .with_context("user", &config.user)
        .with_context("dbname", &config.dbname)
        .with_source(err),
        _ => err,
    }
}

pub(crate) fn connection_error(message: &str) -> Error {
    Error::new(ErrorKind::Connection, message.to_owned())
}

fn io_lost(err: std::io::Error) -> Error {
    Error::new(ErrorKind::Connection, "the connection to the server failed").with_source(err)
}

fn protocol_error(err: std::io::Error) -> Error {
    Error::new(ErrorKind::Protocol, "the server sent a malformed message").with_source(err)
}

fn unexpected(during: &str) -> Error {
    Error::new(
        ErrorKind::Protocol,
        format!("unexpected message from the server during {during}"),
    )
}

/// Bytes of a CopyData body.
pub(crate) fn copy_data(message: Message) -> Option<Bytes> {
    match message {
        Message::CopyData(body) => Some(body.into_bytes()),
        _ => None,
    }
}
