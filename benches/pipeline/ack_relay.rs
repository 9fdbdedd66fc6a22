//! A loopback relay in front of the benchmark's S3 server that ACKs the
//! server's segments at once.
//!
//! s3s-fs 0.14.1 leaves Nagle's algorithm on and writes a response's head
//! and body in two writes. On a kept-alive
//! connection the body then waits for the head's ACK, which the client's
//! kernel delays by 40 ms: every GET with a body cost 40 ms, whatever
//! the client (curl shows it too). That is the test server's, not S3's:
//! AWS, and servers that set `TCP_NODELAY` (Go's net package does by
//! default, so MinIO does), answer at once. The relay reads the server's
//! side with `TCP_QUICKACK` set again after every read, so its ACKs go
//! out at once, and forwards both ways with `TCP_NODELAY`: what is left
//! is the server's own time. [`crate::s3_server::S3Server::round_trips`]
//! shows the difference in the same run. (moto answers in one write: the
//! relay changes nothing there.)

use std::net::SocketAddr;

use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::BenchResult;

/// Starts a relay to `upstream` on a thread of its own (the benchmark's
/// runtime waits on child processes); its address.
pub fn start(upstream: SocketAddr) -> BenchResult<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener).expect("a listener");
            loop {
                let client = match listener.accept().await {
                    Ok((client, _)) => client,
                    Err(e) => {
                        eprintln!("ack relay: {e}");
                        continue;
                    }
                };
                // A connection reset as the server stops is no news.
                tokio::spawn(async move {
                    let _ = relay(client, upstream).await;
                });
            }
        });
    });
    Ok(addr)
}

async fn relay(client: TcpStream, upstream: SocketAddr) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    quick_ack(&server)?;
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let requests = async move {
        tokio::io::copy(&mut from_client, &mut to_server).await?;
        to_server.shutdown().await
    };
    let responses = async move {
        let mut buffer = vec![0; 256 * 1024];
        loop {
            let n = from_server.read(&mut buffer).await?;
            // Quick ACK mode ends on its own: set again for the next
            // segment.
            quick_ack(from_server.as_ref())?;
            if n == 0 {
                return to_client.shutdown().await;
            }
            to_client.write_all(&buffer[..n]).await?;
        }
    };
    tokio::try_join!(requests, responses).map(|_| ())
}

/// ACKs what arrives next at once (Linux's `TCP_QUICKACK`; elsewhere
/// nothing, and the server's stalls stay in the figures).
fn quick_ack(stream: &TcpStream) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    SockRef::from(stream).set_tcp_quickack(true)?;
    #[cfg(not(target_os = "linux"))]
    let _ = stream;
    Ok(())
}
