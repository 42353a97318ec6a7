//! Building blocks for belfry's end-to-end tests and demos: scheduler
//! replicas and workers wired to a [`TestEnv`], each replica with its own
//! connections, as separate processes would have.

pub mod fault;
pub mod held_link;
pub mod http_request;
pub mod otlp_sink;

use std::sync::Arc;
use std::time::Duration;

use belfry_broker::Broker;
use belfry_ledger::Ledger;
use belfry_protocol::ScheduleSpec;
use belfry_runtime::Settings;
use belfry_scheduler::{ClaimLock, Replica, ReplicaTiming, Schedule};
use belfry_testkit::{amqp_url, TestEnv};
use belfry_worker::{Registry, Worker, WorkerConfig, WorkerCounters, WorkerError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use belfry_testkit;

/// A scheduler replica named `instance` in `env`, locking through
/// `redis_url` (`None`: database only).
pub async fn replica(env: &TestEnv, instance: &str, redis_url: Option<&str>) -> Replica {
    let timing = ReplicaTiming {
        shutdown_timeout: Duration::from_secs(10),
        ..ReplicaTiming::default()
    };
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
    Arc::new(
        Schedule::from_spec(&ScheduleSpec {
            name: name.into(),
            cron: None,
            every: Some(every.into()),
            timezone: None,
            job_type: job_type.into(),
            payload: None,
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}")),
    )
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
