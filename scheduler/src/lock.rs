//! The Redis claim lock: a cheap filter in front of the ledger.
//!
//! `SET {ns}:lock:{job_name}:{run_key} {instance} NX PX {ttl}` lets the
//! first replica through and turns the others away with one round trip,
//! before they spend a database insert. It is only an optimisation: the
//! ledger's unique constraint decides ownership. So every Redis failure
//! (down, slow, not configured) degrades to database-only claiming, which is
//! still exactly-once, with a warning and a counter, and the lock comes back
//! on its own when Redis does.
//!
//! The lock is never released after a fire: it expires after its TTL. A
//! release would let a late replica (timer woke late, clock behind) pass
//! the filter and reach the insert, which is harmless but wasted work.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use thiserror::Error;

use belfry_protocol::Topology;
use belfry_runtime::ClientTls;

/// How long a Redis call may take before the claim falls back to the ledger.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
/// After a failed connect, how long to claim through the ledger alone before
/// trying Redis again.
const RECONNECT_BACKOFF: Duration = Duration::from_secs(2);
/// How often the "Redis unavailable" warning repeats while it lasts.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// Why the lock could not be consulted.
#[derive(Debug, Error)]
pub enum LockError {
    /// Redis is not reachable or failed the command.
    #[error("Redis lock at {url} unavailable: {message}")]
    Unavailable {
        /// The URL, password masked.
        url: String,
        /// What failed.
        message: String,
    },
}

/// What the lock said about a fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockOutcome {
    /// This replica set the key: go on to the ledger.
    Acquired,
    /// Another replica set it first: skip the fire.
    HeldElsewhere,
}

struct ConnState {
    conn: Option<ConnectionManager>,
    retry_at: Option<Instant>,
    warned_at: Option<Instant>,
}

/// The Redis filter of the claim path.
pub struct ClaimLock {
    client: redis::Client,
    url_masked: String,
    topology: Topology,
    instance: String,
    ttl: Duration,
    // A std mutex: held only to read or swap the cached connection, never
    // across an await, so it cannot block the runtime or deadlock.
    state: Mutex<ConnState>,
}

impl std::fmt::Debug for ClaimLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimLock")
            .field("url", &self.url_masked)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl ClaimLock {
    /// The Redis this lock uses, its URL with the password masked.
    pub fn node(&self) -> &str {
        &self.url_masked
    }

    /// A lock on the Redis at `url`, holding keys for `ttl`.
    ///
    /// Does not connect: the first fire does, so a replica starts (and
    /// claims through the ledger) while Redis is down.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when `url` is not a Redis URL.
    pub fn new(
        url: &str,
        topology: Topology,
        instance: &str,
        ttl: Duration,
    ) -> Result<Self, LockError> {
        Self::with_tls(url, &ClientTls::default(), topology, instance, ttl)
    }

    /// As [`ClaimLock::new`], with `tls` for a `rediss://` URL: a CA to
    /// trust (given, it is the only one trusted, as the redis crate does)
    /// and an optional client certificate. The server's certificate is
    /// always verified; without `tls` against the system trust store.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when `url` is not a Redis URL or the TLS
    /// material is unusable.
    pub fn with_tls(
        url: &str,
        tls: &ClientTls,
        topology: Topology,
        instance: &str,
        ttl: Duration,
    ) -> Result<Self, LockError> {
        let url_masked = belfry_runtime::masked(url);
        let client = if tls.is_configured() {
            let certificates = redis::TlsCertificates {
                client_tls: tls.identity.as_ref().map(|id| redis::ClientTlsConfig {
                    client_cert: id.cert.pem.clone(),
                    client_key: id.key.pem.clone(),
                }),
                root_cert: tls.ca.as_ref().map(|ca| ca.pem.clone()),
            };
            redis::Client::build_with_tls(url, certificates)
        } else {
            redis::Client::open(url)
        };
        let client = client.map_err(|e| LockError::Unavailable {
            url: url_masked.clone(),
            message: e.to_string(),
        })?;
        Ok(Self {
            client,
            url_masked,
            topology,
            instance: instance.to_owned(),
            ttl,
            state: Mutex::new(ConnState {
                conn: None,
                retry_at: None,
                warned_at: None,
            }),
        })
    }

    /// Tries to take the lock of one fire.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when Redis cannot answer; the caller falls
    /// back to the ledger alone.
    pub async fn try_acquire(
        &self,
        job_name: &str,
        run_key: &str,
    ) -> Result<LockOutcome, LockError> {
        let mut conn = self.connection().await?;
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let reply: Result<Option<String>, _> = redis::cmd("SET")
            .arg(self.topology.lock_key(job_name, run_key))
            .arg(&self.instance)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut conn)
            .await;
        match reply {
            Ok(Some(_)) => {
                self.recovered();
                Ok(LockOutcome::Acquired)
            }
            Ok(None) => {
                self.recovered();
                Ok(LockOutcome::HeldElsewhere)
            }
            // The connection manager reconnects by itself after an error;
            // this fire falls back to the ledger.
            Err(e) => Err(self.unavailable(e.to_string())),
        }
    }

    /// Tries to take the locks of many fires in one round trip (a pipeline
    /// of `SET NX PX`); one outcome per `(job_name, run_key)`, in order.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when Redis cannot answer; the caller falls
    /// back to the ledger alone for the whole batch.
    pub async fn try_acquire_many(
        &self,
        fires: &[(&str, &str)],
    ) -> Result<Vec<LockOutcome>, LockError> {
        let mut conn = self.connection().await?;
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let mut pipe = redis::pipe();
        for (job_name, run_key) in fires {
            pipe.cmd("SET")
                .arg(self.topology.lock_key(job_name, run_key))
                .arg(&self.instance)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms);
        }
        let replies: Result<Vec<Option<String>>, _> = pipe.query_async(&mut conn).await;
        match replies {
            Ok(replies) if replies.len() == fires.len() => {
                self.recovered();
                Ok(replies
                    .into_iter()
                    .map(|r| match r {
                        Some(_) => LockOutcome::Acquired,
                        None => LockOutcome::HeldElsewhere,
                    })
                    .collect())
            }
            Ok(replies) => Err(self.unavailable(format!(
                "pipeline answered {} replies for {} commands",
                replies.len(),
                fires.len()
            ))),
            Err(e) => Err(self.unavailable(e.to_string())),
        }
    }

    /// Releases the lock of a fire this replica took but could not claim
    /// (its ledger insert failed), so another replica's claim is not turned
    /// away by a lock whose holder never recorded the fire. Only a key still
    /// holding this instance's name is deleted (compare-and-delete in one
    /// script), never another replica's.
    pub async fn release(&self, job_name: &str, run_key: &str) {
        let Ok(mut conn) = self.connection().await else {
            return;
        };
        let script = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
        );
        let released: Result<i64, _> = script
            .key(self.topology.lock_key(job_name, run_key))
            .arg(&self.instance)
            .invoke_async(&mut conn)
            .await;
        if let Err(e) = released {
            tracing::warn!(%run_key, error = %e, "could not release the claim lock; it expires after its TTL");
        }
    }

    /// Whether Redis answers a `PING` now (for readiness probes).
    pub async fn ping(&self) -> bool {
        let Ok(mut conn) = self.connection().await else {
            return false;
        };
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_ok()
    }

    async fn connection(&self) -> Result<ConnectionManager, LockError> {
        {
            let state = self.lock_state();
            if let Some(conn) = &state.conn {
                return Ok(conn.clone());
            }
            if state.retry_at.is_some_and(|t| Instant::now() < t) {
                return Err(LockError::Unavailable {
                    url: self.url_masked.clone(),
                    message: "not connected (retrying shortly)".into(),
                });
            }
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(RESPONSE_TIMEOUT)
            .set_response_timeout(RESPONSE_TIMEOUT)
            .set_number_of_retries(1)
            .set_max_delay(1_000);
        match ConnectionManager::new_with_config(self.client.clone(), config).await {
            Ok(conn) => {
                let mut state = self.lock_state();
                // Two fires may connect at once; keep the first connection.
                let conn = state.conn.get_or_insert(conn).clone();
                state.retry_at = None;
                Ok(conn)
            }
            Err(e) => {
                self.lock_state().retry_at = Some(Instant::now() + RECONNECT_BACKOFF);
                Err(self.unavailable(e.to_string()))
            }
        }
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, ConnState> {
        // A poisoned mutex only means another thread panicked while holding
        // it; the state (a cached connection and two instants) is still
        // consistent, so keep using it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unavailable(&self, message: String) -> LockError {
        let mut state = self.lock_state();
        let now = Instant::now();
        if state
            .warned_at
            .is_none_or(|t| now.duration_since(t) >= WARN_EVERY)
        {
            state.warned_at = Some(now);
            tracing::warn!(
                url = %self.url_masked,
                error = %message,
                "Redis lock unavailable; claiming through the database only (still exactly once, more database load)"
            );
        }
        LockError::Unavailable {
            url: self.url_masked.clone(),
            message,
        }
    }

    fn recovered(&self) {
        let mut state = self.lock_state();
        if state.warned_at.take().is_some() {
            tracing::info!(url = %self.url_masked, "Redis lock available again");
        }
    }
}
