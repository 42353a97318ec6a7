//! Building blocks for belfry's end-to-end tests and demos: scheduler
//! replicas and workers wired to a [`TestEnv`], each replica with its own
//! connections, as separate processes would have.

pub mod alert_sink;
pub mod fault;
pub mod fire_window;
pub mod held_link;
pub mod http_request;
pub mod loopback;
pub mod otlp_sink;
pub mod process_window;
pub mod race;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_broker::Broker;
use belfry_ledger::Ledger;
use belfry_protocol::ScheduleSpec;
use belfry_runtime::Settings;
use belfry_scheduler::{ClaimLock, Replica, ReplicaTiming, Schedule};
use belfry_testkit::{amqp_url, redis_url, TestEnv};
use belfry_worker::{
    Job, JobContext, JobError, Registry, Worker, WorkerConfig, WorkerCounters, WorkerError,
};
use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use belfry_testkit;

/// The timing of test replicas: the defaults, a 10 s shutdown.
fn replica_timing() -> ReplicaTiming {
    ReplicaTiming {
        shutdown_timeout: Duration::from_secs(10),
        ..ReplicaTiming::default()
    }
}

/// A scheduler replica named `instance` in `env`, locking through
/// `redis_url` (`None`: database only).
pub async fn replica(env: &TestEnv, instance: &str, redis_url: Option<&str>) -> Replica {
    let timing = replica_timing();
    if env.is_embedded() {
        // One process owns an embedded database: replicas share its handle
        // and need no lock.
        return Replica::new(
            instance,
            None,
            env.ledger.clone(),
            env.broker.clone(),
            timing,
        );
    }
    let lock = redis_url.map(|url| {
        ClaimLock::new(url, env.topology.clone(), instance, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"))
    });
    replica_locked(env, instance, lock).await
}

/// A distributed scheduler replica named `instance` in `env` with `lock`
/// (built by the caller: TLS, a Sentinel group, ...).
///
/// # Panics
///
/// When the ledger or the broker cannot be reached.
pub async fn replica_locked(env: &TestEnv, instance: &str, lock: Option<ClaimLock>) -> Replica {
    let timing = replica_timing();
    let ledger = Ledger::connect(&env.database_url, 4)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let broker = Broker::connect(&amqp_url(), env.topology.clone(), instance)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Replica::new(instance, lock, ledger, broker, timing)
}

/// A worker named `instance` of group `group` in `env`, with extra settings
/// (`BELFRY_MAX_ATTEMPTS`, `BELFRY_RETRY_INITIAL`, ...).
pub async fn worker(
    env: &TestEnv,
    instance: &str,
    group: &str,
    registry: Registry,
    extra: &[(&str, &str)],
) -> Worker {
    let mut pairs: Vec<(String, String)> = env.process_env();
    pairs.push(("BELFRY_INSTANCE".into(), instance.into()));
    pairs.push(("BELFRY_WORKER_GROUP".into(), group.into()));
    pairs.push(("BELFRY_RETRY_JITTER".into(), "false".into()));
    pairs.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let config =
        WorkerConfig::from_settings(&Settings::from_pairs(pairs)).unwrap_or_else(|e| panic!("{e}"));
    if env.is_embedded() {
        return Worker::start_on(&config, registry, env.ledger.clone(), env.broker.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    Worker::start(&config, registry)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// An interval schedule of `job_type` every `every`.
pub fn every(name: &str, every: &str, job_type: &str) -> Arc<Schedule> {
    every_with(name, every, job_type, |_| {})
}

/// [`every`] with more of its spec set by `extra` (a payload, a misfire
/// policy, a jitter, ...).
pub fn every_with(
    name: &str,
    every: &str,
    job_type: &str,
    extra: impl FnOnce(&mut ScheduleSpec),
) -> Arc<Schedule> {
    let mut spec = ScheduleSpec {
        name: name.into(),
        every: Some(every.into()),
        job_type: job_type.into(),
        ..Default::default()
    };
    extra(&mut spec);
    Arc::new(Schedule::from_spec(&spec).unwrap_or_else(|e| panic!("{e}")))
}

/// The instant `s` (RFC 3339), for runs fired at fixed times.
///
/// # Panics
///
/// When `s` is not an RFC 3339 instant.
pub fn at(s: &str) -> DateTime<Utc> {
    s.parse()
        .unwrap_or_else(|e| panic!("{s:?} is not an instant: {e}"))
}

/// A replica's reconcile loop as a running scheduler has it: the
/// follow-up pass, then the outbox (publishing waiting and follow-up runs
/// as they come due), every 100 ms until the returned token is cancelled.
pub fn reconciling(r: Arc<Replica>) -> CancellationToken {
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        while !token.is_cancelled() {
            let _ = r.settle_follow_ups_once().await;
            let _ = r.reconciler().reconcile_once().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    stop
}

/// The instant the worker tests fire their runs at, 2026-07-26T03:00:00Z.
pub fn t0() -> DateTime<Utc> {
    at("2026-07-26T03:00:00Z")
}

/// A registry of the built-in job types only.
pub fn builtins() -> Registry {
    Registry::builder()
        .builtins()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A registry of `job` only.
pub fn one_job<J: Job>(job: J) -> Registry {
    Registry::builder()
        .job(job)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A job of type `flaky` that fails with a retryable error (`transient
/// failure {n}` on its `n`th call) until `fail_first` calls are used up,
/// then succeeds; it counts its calls (clones share the count).
#[derive(Clone)]
pub struct Flaky {
    /// Calls so far.
    pub calls: Arc<AtomicU32>,
    /// How many calls fail before one succeeds (`u32::MAX`: all of them).
    pub fail_first: u32,
}

impl Flaky {
    /// A flaky job whose first `fail_first` calls fail.
    pub fn failing_first(fail_first: u32) -> Self {
        Self {
            calls: Arc::new(AtomicU32::new(0)),
            fail_first,
        }
    }

    /// Calls so far.
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Job for Flaky {
    const TYPE: &'static str = "flaky";
    type Payload = serde_json::Value;

    async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= self.fail_first {
            Err(JobError::retryable(format!("transient failure {n}")))
        } else {
            Ok(())
        }
    }
}

/// Starts worker `w1` of group `default` with `registry` and `extra`
/// settings, consuming in the background.
pub async fn serve(env: &TestEnv, registry: Registry, extra: &[(&str, &str)]) -> RunningWorker {
    RunningWorker::spawn(worker(env, "w1", "default", registry, extra).await)
}

/// A worker running its consume loop in the background.
pub struct RunningWorker {
    stop: CancellationToken,
    task: JoinHandle<Result<(), WorkerError>>,
    /// The worker's counters.
    pub counters: Arc<WorkerCounters>,
}

impl RunningWorker {
    /// Starts `worker`'s loop.
    pub fn spawn(worker: Worker) -> Self {
        let stop = CancellationToken::new();
        let counters = worker.counters().clone();
        let task = tokio::spawn(worker.run(stop.clone()));
        Self {
            stop,
            task,
            counters,
        }
    }

    /// Stops the loop gracefully and checks it ended without error.
    pub async fn stop(self) {
        self.stop.cancel();
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("worker loop failed: {e}"),
            Err(e) => panic!("worker task failed: {e}"),
        }
    }

    /// [`RunningWorker::stop`], then tears `env` down with its `default`
    /// group: how a test served by [`serve`] ends.
    pub async fn stop_and_teardown(self, env: TestEnv) {
        self.stop().await;
        env.teardown(&["default"]).await;
    }
}

/// A REST API served in-process for tests.
pub struct TestApi {
    /// `http://127.0.0.1:{port}`.
    pub base: String,
    stop: CancellationToken,
}

impl TestApi {
    /// Serves the API of `replica` on a free loopback port with `tokens`.
    pub async fn serve(replica: Arc<Replica>, tokens: belfry_server::api::Tokens) -> Self {
        Self::serve_state(belfry_server::api::ApiState::new(replica, tokens)).await
    }

    /// Serves, with `tokens`, the API of a new replica `instance` of `env`
    /// that locks through Redis; the replica too, for the test to drive.
    pub async fn of_replica(
        env: &TestEnv,
        instance: &str,
        tokens: belfry_server::api::Tokens,
    ) -> (Arc<Replica>, Self) {
        let r = Arc::new(replica(env, instance, Some(&redis_url())).await);
        (r.clone(), Self::serve(r, tokens).await)
    }

    /// Serves `state` on a free loopback port.
    pub async fn serve_state(state: belfry_server::api::ApiState) -> Self {
        let stop = CancellationToken::new();
        let addr = belfry_server::api::serve("127.0.0.1:0", state, stop.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            base: format!("http://{addr}"),
            stop,
        }
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for TestApi {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Sleeps 300 ms and records the highest number of its runs running at
/// once (across every worker it is registered with).
#[derive(Clone, Default)]
pub struct Gauge {
    /// Runs running now.
    pub now: Arc<std::sync::atomic::AtomicUsize>,
    /// The most seen running at once.
    pub peak: Arc<std::sync::atomic::AtomicUsize>,
}

impl Job for Gauge {
    const TYPE: &'static str = "gauge";
    type Payload = serde_json::Value;
    async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}
