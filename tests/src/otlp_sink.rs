//! A minimal OTLP/HTTP receiver for process-level tests: accepts `POST`
//! requests (HTTP/1.1, `content-length` bodies, keep-alive), keeps every
//! body and answers `200`. Tests look for byte strings in what arrived (a
//! service name, a run's 16 raw trace-id bytes) rather than decoding the
//! protobuf, which is enough to tell which process exported which trace.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncWriteExt, BufReader};

use crate::http_request::read_request;
use crate::loopback::serve_loopback;

/// Request bodies received, with their paths.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A running sink.
pub struct OtlpSink {
    /// Where it listens.
    pub addr: SocketAddr,
    bodies: Received,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpSink {
    /// Listens on a free loopback port.
    ///
    /// # Panics
    ///
    /// When no port can be bound.
    pub async fn start() -> Self {
        let bodies: Received = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let (addr, task) = serve_loopback("sink", move |stream, _| {
            let kept = kept.clone();
            async move {
                let mut stream = BufReader::new(stream);
                while let Some(request) = read_request(&mut stream).await {
                    kept.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((request.path, request.body));
                    let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if stream.get_mut().write_all(ok.as_bytes()).await.is_err() {
                        return;
                    }
                }
            }
        })
        .await;
        Self { addr, bodies, task }
    }

    /// The base URL for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Bodies received on `path`, in arrival order.
    pub fn bodies(&self, path: &str) -> Vec<Vec<u8>> {
        self.bodies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b.clone())
            .collect()
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
