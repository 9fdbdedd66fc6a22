//! A TCP proxy in front of a test's S3 server that can stall: once a
//! request line the client sends matches (a data file's upload, the new
//! table metadata a commit writes) it forwards nothing more, on any
//! connection, old or new, for a while or for ever. What a store behind
//! a saturated link or a hung load balancer does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

#[derive(Default)]
struct State {
    /// Stall from the first request line of this method holding this
    /// needle, for that long (`None`: for ever).
    armed: Option<(String, String, Option<Duration>)>,
    /// Forward nothing until then (`None` in it: for ever).
    stalled: Option<Option<Instant>>,
    /// Request lines that started a stall.
    triggered: Vec<String>,
}

impl State {
    /// How long forwarding must wait now, if at all.
    fn wait(&mut self) -> Option<Duration> {
        match self.stalled {
            Some(None) => Some(Duration::from_millis(100)),
            Some(Some(until)) if until > Instant::now() => {
                Some((until - Instant::now()).min(Duration::from_millis(100)))
            }
            Some(Some(_)) => {
                self.stalled = None;
                None
            }
            None => None,
        }
    }
}

pub struct StallProxy {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl StallProxy {
    /// A proxy to `upstream` (`http://host:port`) on a free loopback port.
    pub async fn start(upstream: &str) -> StallProxy {
        let upstream = upstream
            .strip_prefix("http://")
            .expect("an http endpoint")
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let state = shared.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, state).await;
                    }
                });
            }
        });
        StallProxy {
            endpoint,
            state,
            task,
        }
    }

    /// Stall once a `method` request whose line holds `needle` (a part
    /// of the path) is sent: for `how_long`, or for ever.
    pub fn stall_at(&self, method: &str, needle: &str, how_long: Option<Duration>) {
        self.state.lock().unwrap().armed =
            Some((format!("{method} "), needle.to_owned(), how_long));
    }

    /// Whether a stall began, and at which request line.
    pub fn triggered(&self) -> Vec<String> {
        self.state.lock().unwrap().triggered.clone()
    }

    /// Forwards again at once.
    pub fn release(&self) {
        let mut state = self.state.lock().unwrap();
        state.stalled = None;
        state.armed = None;
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies both ways, each chunk after any stall; the client's request
/// lines are watched for the armed needle.
async fn relay(client: TcpStream, server: TcpStream, state: Arc<Mutex<State>>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pipe(client_read, server_write, state.clone(), true);
    let down = pipe(server_read, client_write, state, false);
    let _ = tokio::join!(up, down);
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<Mutex<State>>,
    watch: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut line = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if watch {
            for &b in &buf[..n] {
                if b == b'\n' {
                    arm_on(&state, &String::from_utf8_lossy(&line));
                    line.clear();
                } else if line.len() < 4096 {
                    line.push(b);
                }
            }
        }
        loop {
            let wait = state.lock().unwrap().wait();
            match wait {
                Some(wait) => tokio::time::sleep(wait).await,
                None => break,
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Starts the armed stall if `line` is a request line holding its needle.
fn arm_on(state: &Mutex<State>, line: &str) {
    let mut state = state.lock().unwrap();
    let hit = matches!(&state.armed, Some((method, needle, _))
        if line.starts_with(method.as_str()) && line.contains(" HTTP/1.") && line.contains(needle.as_str()));
    if hit {
        let (_, _, how_long) = state.armed.take().unwrap();
        state.stalled = Some(how_long.map(|d| Instant::now() + d));
        state.triggered.push(line.trim().to_owned());
    }
}
