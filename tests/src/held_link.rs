//! A TCP link to a real service that can be held: a proxy on a port of its
//! own that forwards both ways and, while held, stops forwarding in either
//! direction (what arrives waits, it is not dropped, and flows again on
//! release). Seen from the client, a held link is a service that stopped
//! answering: a broker whose confirm is late, a database that is
//! unreachable, without touching the real server other tests share.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::loopback::serve_loopback;

/// A proxy in front of one service address.
pub struct HeldLink {
    addr: SocketAddr,
    hold: watch::Sender<bool>,
}

impl HeldLink {
    /// Listens on a free loopback port and forwards every connection to
    /// `upstream`.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> Self {
        let (hold, held) = watch::channel(false);
        // The accept loop runs for the rest of the test process.
        let (addr, _accepting) = serve_loopback("proxy", move |client, _| {
            let held = held.clone();
            async move {
                if let Ok(server) = TcpStream::connect(upstream).await {
                    forward(client, server, held).await;
                }
            }
        })
        .await;
        Self { addr, hold }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds (`true`) or releases (`false`) the link, both directions.
    pub fn hold(&self, on: bool) {
        let _ = self.hold.send(on);
    }
}

async fn forward(client: TcpStream, server: TcpStream, held: watch::Receiver<bool>) {
    let (client_rx, client_tx) = client.into_split();
    let (server_rx, server_tx) = server.into_split();
    let up = tokio::spawn(pump(client_rx, server_tx, held.clone()));
    pump(server_rx, client_tx, held).await;
    up.abort();
}

/// Copies `from` to `to`; bytes read while held wait until released.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: watch::Receiver<bool>,
) {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if held.wait_for(|h| !*h).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
