//! The accept loop the tests' small servers share (the fault suite's
//! probe, the OTLP sink, the held link's proxy, a status-code server): a
//! listener on a free loopback port that hands each connection to a task
//! of its own.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Listens on a free loopback port and runs `handle(stream, n)` in a task
/// of its own for the `n`th connection accepted (counting from 1), until
/// the returned accept task is aborted (dropping it leaves it running).
/// `what` names the server in a panic.
///
/// # Panics
///
/// When no loopback port can be bound.
pub async fn serve_loopback<H, F>(what: &str, mut handle: H) -> (SocketAddr, JoinHandle<()>)
where
    H: FnMut(TcpStream, u64) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{what} cannot bind a loopback port: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("{what} address: {e}"));
    let task = tokio::spawn(async move {
        let mut accepted = 0u64;
        while let Ok((stream, _)) = listener.accept().await {
            accepted += 1;
            tokio::spawn(handle(stream, accepted));
        }
    });
    (addr, task)
}
