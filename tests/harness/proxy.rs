//! A TCP fault proxy for tests: a worker connects to PostgreSQL through it,
//! and the test makes the network between them misbehave.
//!
//! - [`FaultProxy::pass`]: bytes flow both ways (the normal case);
//! - [`FaultProxy::blackhole`]: every socket stays open but nothing is
//!   forwarded either way, and new connections are accepted and then hear
//!   nothing: a half-open network, where neither side gets an error;
//! - [`FaultProxy::reset`]: every current connection is closed at once.
//!
//! Coming back from a black hole resets the connections that lived through
//! it (bytes were lost, so their streams are garbage), as a real network
//! partition ends with broken connections.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// A running proxy on a loopback port; stops when dropped.
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    upstream: SocketAddr,
    blackholed: AtomicBool,
    /// The pump tasks of every live connection.
    pumps: Mutex<Vec<AbortHandle>>,
}

impl FaultProxy {
    /// Starts a proxy in front of the PostgreSQL server of `url`; returns it
    /// and the same URL pointing at the proxy.
    pub async fn start(url: &str) -> (Self, String) {
        let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
        let upstream = tokio::net::lookup_host((options.get_host(), options.get_port()))
            .await
            .expect("resolve the server")
            .next()
            .expect("an address for the server");
        let proxy = Self::start_tcp(upstream).await;
        let proxied = options.port(proxy.port).to_url_lossy().to_string();
        (proxy, proxied)
    }

    /// Starts a proxy in front of any TCP server (a broker) at `upstream`.
    pub async fn start_tcp(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            upstream,
            blackholed: AtomicBool::new(false),
            pumps: Mutex::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Self {
            port,
            shared,
            accept,
        }
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stop forwarding, keeping every socket open.
    pub fn blackhole(&self) {
        self.shared.blackholed.store(true, Ordering::SeqCst);
    }

    /// Forward again; connections that lived through a black hole are
    /// closed (their byte streams lost data).
    pub fn pass(&self) {
        if self.shared.blackholed.swap(false, Ordering::SeqCst) {
            self.reset();
        }
    }

    /// Closes every current connection.
    pub fn reset(&self) {
        for pump in self.shared.pumps.lock().unwrap().drain(..) {
            pump.abort();
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.reset();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let Ok(server) = TcpStream::connect(shared.upstream).await else {
            continue; // the client sees its connection closed
        };
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let up = tokio::spawn(pump(client_read, server_write, Arc::clone(&shared)));
        let down = tokio::spawn(pump(server_read, client_write, Arc::clone(&shared)));
        let mut pumps = shared.pumps.lock().unwrap();
        pumps.retain(|p| !p.is_finished());
        pumps.push(up.abort_handle());
        pumps.push(down.abort_handle());
    }
}

/// Copies one direction, or swallows it while black-holed.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shared: Arc<Shared>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !shared.blackholed.load(Ordering::SeqCst) && to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
