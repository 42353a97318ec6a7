//! The probe: the HTTP endpoint the fault suite's `http` jobs call. Every
//! request is one execution of a job handler; the probe records which run
//! (from the `x-belfry-run-id` header the built-in `http` job sends), which
//! attempt and when it arrived, then answers `200` after a short random
//! delay, standing in for real work.
//!
//! It is a deliberately tiny HTTP/1.1 server (keep-alive, no bodies): the
//! suite needs to observe executions independently of belfry's own
//! bookkeeping, with no dependency that could hide a request.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use uuid::Uuid;

use crate::http_request::read_request;
use crate::loopback::serve_loopback;

/// One handler execution as the probe saw it.
#[derive(Debug, Clone)]
pub struct Execution {
    /// The run's id.
    pub run_id: Uuid,
    /// The attempt number the worker sent.
    pub attempt: u32,
    /// When the request arrived (system clock of this host, as the
    /// database's `now()`).
    pub arrived: DateTime<Utc>,
    /// When the probe answered it (`None`: never, the worker went away).
    pub answered: Option<DateTime<Utc>>,
}

/// A running probe.
pub struct Probe {
    /// Where it listens.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Execution>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Probe {
    /// Listens on a free loopback port; each answer waits a random
    /// 5–`max_delay_ms` ms (seeded by `seed`).
    ///
    /// # Panics
    ///
    /// When no port can be bound.
    pub async fn start(seed: u64, max_delay_ms: u64) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let (addr, task) = serve_loopback("probe", move |stream, connection| {
            let rng = rand::rngs::StdRng::seed_from_u64(seed ^ connection);
            serve(stream, recorded.clone(), rng, max_delay_ms.max(6))
        })
        .await;
        Self { addr, seen, task }
    }

    /// The URL jobs call.
    pub fn url(&self) -> String {
        format!("http://{}/work", self.addr)
    }

    /// Every execution so far.
    pub fn executions(&self) -> Vec<Execution> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    stream: TcpStream,
    seen: Arc<Mutex<Vec<Execution>>>,
    mut rng: rand::rngs::StdRng,
    max_delay_ms: u64,
) {
    let mut stream = BufReader::new(stream);
    while let Some(request) = read_request(&mut stream).await {
        let arrived = Utc::now();
        let headers = request.headers;
        let run_id = headers
            .get("x-belfry-run-id")
            .and_then(|v| Uuid::parse_str(v).ok());
        let attempt = headers
            .get("x-belfry-attempt")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let status = match run_id {
            Some(run_id) => {
                // Recorded on arrival, so an execution whose worker dies
                // mid-request still counts; the answer time is added after.
                let index = {
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    seen.push(Execution {
                        run_id,
                        attempt,
                        arrived,
                        answered: None,
                    });
                    seen.len() - 1
                };
                tokio::time::sleep(Duration::from_millis(rng.random_range(5..max_delay_ms))).await;
                if let Some(e) = seen
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_mut(index)
                {
                    e.answered = Some(Utc::now());
                }
                "200 OK"
            }
            // Not from a belfry http job: refuse, so the mistake shows.
            None => "400 Bad Request",
        };
        let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
        if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}
