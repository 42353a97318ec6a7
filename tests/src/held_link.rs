//! A TCP link to a real service whose answers can be held back: a proxy on
//! a port of its own that forwards both ways, and, while held, stops
//! forwarding what the server sends (it is buffered, not dropped, and flows
//! again on release). A broker that has stored a message but whose confirm
//! is late, seen from the client, is exactly this.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

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
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind a proxy port: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy address: {e}"));
        let (hold, held) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let held = held.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        forward(client, server, held).await;
                    }
                });
            }
        });
        Self { addr, hold }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds back (`true`) or releases (`false`) what the server sends.
    pub fn hold(&self, on: bool) {
        let _ = self.hold.send(on);
    }
}

async fn forward(client: TcpStream, server: TcpStream, mut held: watch::Receiver<bool>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
        let _ = server_tx.shutdown().await;
    });
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match server_rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Bytes read while held wait here until released.
        if held.wait_for(|h| !*h).await.is_err() {
            break;
        }
        if client_tx.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    up.abort();
}
