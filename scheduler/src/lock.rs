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
//!
//! Redis may be one server, a Sentinel group or a Cluster
//! ([`crate::redis_topology`]). Each lock is one key, `{namespace}:lock:{job_name}:{run_key}`,
//! set and read by single-key commands only, so on a Cluster the keys
//! spread over every slot and no command ever spans two. A failover of
//! either may lose a lock written just before it (replication is
//! asynchronous); then a second replica passes the filter and the ledger's
//! unique insert turns it away — the filter costs an insert, never a
//! duplicate.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;

use belfry_protocol::Topology;
use belfry_runtime::ClientTls;

use crate::redis_topology::{RedisConnection, RedisTopology};

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
    conn: Option<RedisConnection>,
    retry_at: Option<Instant>,
    warned_at: Option<Instant>,
}

/// The Redis filter of the claim path.
pub struct ClaimLock {
    redis: RedisTopology,
    url_masked: String,
    // What /readyz and the node metric show: the URL, and for a Sentinel
    // group the master in use. A std mutex held only to copy or replace
    // the string.
    node: Arc<Mutex<String>>,
    topology: Topology,
    instance: String,
    ttl: Duration,
    // A std mutex: held only to read or swap the cached connection, never
    // across an await, so it cannot block the runtime or deadlock.
    state: Mutex<ConnState>,
    // One connection attempt at a time: the fires that find no connection
    // wait for the attempt under way instead of each opening their own (a
    // burst of fires at start would otherwise open one per fire; over TLS
    // to a six-node cluster that is hundreds of handshakes). A tokio
    // mutex: held across the attempt's awaits, bounded by its timeouts.
    connecting: tokio::sync::Mutex<()>,
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
    /// The Redis this lock uses, its URL with the password masked; for a
    /// Sentinel group followed by ` master host:port` once connected.
    pub fn node(&self) -> String {
        self.node.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A function telling [`ClaimLock::node`] whenever called, for
    /// `belfry_runtime::service_nodes::ServiceNodes`.
    pub fn node_source(&self) -> impl Fn() -> Option<String> + Send + Sync + 'static {
        let node = self.node.clone();
        move || Some(node.lock().unwrap_or_else(|p| p.into_inner()).clone())
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

    /// As [`ClaimLock::new`], with `tls` for a `rediss://` URL (`url` may
    /// also name a Sentinel group or a Cluster, see
    /// [`crate::redis_topology`]): a CA to
    /// trust (given, it is the only one trusted, as the redis crate does)
    /// and an optional client certificate. The server's certificate is
    /// always verified; without `tls` against the system trust store.
    ///
    /// # Errors
    ///
    /// [`LockError::Unavailable`] when `url` is not a Redis URL (the
    /// message says what is wrong in it) or the TLS material is unusable.
    pub fn with_tls(
        url: &str,
        tls: &ClientTls,
        topology: Topology,
        instance: &str,
        ttl: Duration,
    ) -> Result<Self, LockError> {
        let url_masked = belfry_runtime::masked(url);
        let redis = RedisTopology::parse(url, tls).map_err(|e| LockError::Unavailable {
            url: e.url,
            message: e.message,
        })?;
        Ok(Self {
            redis,
            node: Arc::new(Mutex::new(url_masked.clone())),
            url_masked,
            topology,
            instance: instance.to_owned(),
            ttl,
            state: Mutex::new(ConnState {
                conn: None,
                retry_at: None,
                warned_at: None,
            }),
            connecting: tokio::sync::Mutex::new(()),
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
        let reply: Result<Option<String>, _> = self
            .set_nx(job_name, run_key, ttl_ms)
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
            // The connection manager reconnects by itself after an error
            // (a Sentinel connection is dropped to find the master again);
            // this fire falls back to the ledger.
            Err(e) => Err(self.failed(e.to_string())),
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
        let replies: Result<Vec<Option<String>>, redis::RedisError> =
            if self.redis.pipelines_across_keys() {
                let mut pipe = redis::pipe();
                for (job_name, run_key) in fires {
                    pipe.add_command(self.set_nx(job_name, run_key, ttl_ms));
                }
                pipe.query_async(&mut conn).await
            } else {
                // A Cluster refuses a pipeline across hash slots: send the
                // commands concurrently instead; the cluster connection
                // multiplexes those of one node on its connection to it.
                futures::future::join_all(fires.iter().map(|(job_name, run_key)| {
                    let mut conn = conn.clone();
                    let cmd = self.set_nx(job_name, run_key, ttl_ms);
                    async move { cmd.query_async::<Option<String>>(&mut conn).await }
                }))
                .await
                .into_iter()
                .collect()
            };
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
            Ok(replies) => Err(self.failed(format!(
                "pipeline answered {} replies for {} commands",
                replies.len(),
                fires.len()
            ))),
            Err(e) => Err(self.failed(e.to_string())),
        }
    }

    /// `SET key instance NX PX ttl`: one fire's lock.
    fn set_nx(&self, job_name: &str, run_key: &str, ttl_ms: u64) -> redis::Cmd {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.topology.lock_key(job_name, run_key))
            .arg(&self.instance)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms);
        cmd
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
            self.forget_if_moved();
            tracing::warn!(%run_key, error = %e, "could not release the claim lock; it expires after its TTL");
        }
    }

    /// Whether Redis answers a `PING` now (for readiness probes).
    pub async fn ping(&self) -> bool {
        let Ok(mut conn) = self.connection().await else {
            return false;
        };
        let answered = redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_ok();
        if !answered {
            self.forget_if_moved();
        }
        answered
    }

    async fn connection(&self) -> Result<RedisConnection, LockError> {
        if let Some(ready) = self.cached() {
            return ready;
        }
        let _attempt = self.connecting.lock().await;
        // The attempt this caller waited for may have connected (or failed
        // and set the back-off): look again before trying.
        if let Some(ready) = self.cached() {
            return ready;
        }
        match self.redis.connect().await {
            Ok((conn, master)) => {
                let mut state = self.lock_state();
                // One attempt at a time (`connecting`), but keep whatever
                // connection is already there all the same.
                let conn = state.conn.get_or_insert(conn).clone();
                state.retry_at = None;
                drop(state);
                if let Some(master) = master {
                    *self.node.lock().unwrap_or_else(|p| p.into_inner()) =
                        format!("{} master {master}", self.url_masked);
                }
                Ok(conn)
            }
            Err(e) => {
                self.lock_state().retry_at = Some(Instant::now() + RECONNECT_BACKOFF);
                Err(self.unavailable(e))
            }
        }
    }

    /// The cached connection, or the back-off's refusal; `None`: connect.
    fn cached(&self) -> Option<Result<RedisConnection, LockError>> {
        let state = self.lock_state();
        if let Some(conn) = &state.conn {
            return Some(Ok(conn.clone()));
        }
        if state.retry_at.is_some_and(|t| Instant::now() < t) {
            return Some(Err(LockError::Unavailable {
                url: self.url_masked.clone(),
                message: "not connected (retrying shortly)".into(),
            }));
        }
        None
    }

    /// A command failed: for a Sentinel group, drop the connection so the
    /// next call asks the sentinels for the master again (it may have
    /// moved); then report it as [`ClaimLock::unavailable`] does.
    fn failed(&self, message: String) -> LockError {
        self.forget_if_moved();
        self.unavailable(message)
    }

    fn forget_if_moved(&self) {
        if self.redis.re_resolves() {
            self.lock_state().conn = None;
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
