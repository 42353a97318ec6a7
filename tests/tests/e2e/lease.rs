//! A worker that cannot renew its leases (issue 16, defect 4) stops its
//! handlers before the leases can expire, so a run never executes on two
//! workers at once; once the database answers again the run goes on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_tests::held_link::HeldLink;
use belfry_tests::{worker, RunningWorker};
use belfry_worker::{Job, JobContext, JobError, Registry, WorkerCounters};
use chrono::{DateTime, Utc};
use serde_json::json;

/// Attempts started: `(attempt, when)`.
type Starts = Arc<Mutex<Vec<(u32, DateTime<Utc>)>>>;

/// Runs until cancelled on attempt 1 (recording when), succeeds after.
#[derive(Clone, Default)]
struct Watch {
    cancelled_at: Arc<Mutex<Option<DateTime<Utc>>>>,
    started: Starts,
}

impl Job for Watch {
    const TYPE: &'static str = "watch";
    type Payload = serde_json::Value;

    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((ctx.attempt, Utc::now()));
        if ctx.attempt > 1 {
            return Ok(());
        }
        ctx.cancel.cancelled().await;
        *self.cancelled_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Utc::now());
        Err(JobError::retryable("cancelled"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewable_lease_stops_the_handler_before_it_expires() {
    let env = belfry_testkit::service_env!();
    // The worker reaches Postgres through a link the test can hold.
    let link = HeldLink::start("127.0.0.1:5432".parse().unwrap()).await;
    let url = env
        .database_url
        .replacen("127.0.0.1:5432", &link.addr().to_string(), 1)
        .replacen("localhost:5432", &link.addr().to_string(), 1);
    assert_ne!(
        url, env.database_url,
        "the test database URL names 127.0.0.1:5432"
    );
    let job = Watch::default();
    let registry = Registry::builder().job(job.clone()).build().unwrap();
    let w = worker(
        &env,
        "w1",
        "default",
        registry,
        &[("DATABASE_URL", url.as_str()), ("BELFRY_LEASE", "4s")],
    )
    .await;
    let running = RunningWorker::spawn(w);
    let counters = running.counters.clone();
    let m = env.enqueue("watched", "watch", json!({}), Utc::now()).await;
    belfry_testkit::wait_running(&env, &m, Duration::from_secs(10)).await;
    // Let a few heartbeats pass, then make Postgres unreachable for the
    // worker (the test's own connection is direct).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held_at = Utc::now();
    link.hold(true);
    let cancelled_at = belfry_testkit::eventually(
        "the handler to be cancelled",
        Duration::from_secs(8),
        || async { *job.cancelled_at.lock().unwrap_or_else(|p| p.into_inner()) },
    )
    .await;
    let lease_until: DateTime<Utc> =
        sqlx::query_scalar("SELECT lease_until FROM job_runs WHERE id = $1")
            .bind(m.message_id)
            .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
            .await
            .unwrap();
    assert!(
        cancelled_at < lease_until,
        "the handler ran until {cancelled_at}, past its lease ({lease_until})"
    );
    assert!(
        cancelled_at - held_at <= chrono::Duration::seconds(4),
        "stopped {} after the database became unreachable",
        cancelled_at - held_at
    );
    // Counted once the attempt has returned (just after the handler saw
    // its token).
    belfry_testkit::eventually(
        "the interruption to be counted",
        Duration::from_secs(5),
        || async { (WorkerCounters::get(&counters.lease_lost) == 1).then_some(()) },
    )
    .await;
    // The database answers again: the run continues, attempt 2 never
    // overlapping attempt 1.
    link.hold(false);
    let done = env
        .wait_terminal(&m.job_name, &m.run_key, Duration::from_secs(30))
        .await;
    assert_eq!(done.status_text, "succeeded", "{done:?}");
    let started = job
        .started
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    assert_eq!(started.len(), 2, "{started:?}");
    assert!(started[1].1 > cancelled_at, "{started:?} vs {cancelled_at}");
    running.stop().await;
    env.teardown(&["default"]).await;
}

/// Sleeps `SLEEP` unless interrupted; records how it ended.
#[derive(Clone, Default)]
struct Steady {
    interrupted: Arc<Mutex<Vec<u32>>>,
}

impl Steady {
    const SLEEP: Duration = Duration::from_secs(6);
}

impl Job for Steady {
    const TYPE: &'static str = "steady";
    type Payload = serde_json::Value;

    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        tokio::select! {
            // Either ends the attempt: a cancel is recorded as one.
            _ = ctx.cancel.cancelled() => {
                self.interrupted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(ctx.attempt);
                Err(JobError::retryable("interrupted"))
            }
            _ = tokio::time::sleep(Self::SLEEP) => Ok(()),
        }
    }
}

/// Runs one `steady` job on a worker whose pool is small, holds all of
/// its connections for longer than the lease while the handler runs, and
/// returns the attempts that were interrupted. `own_heartbeat_pool` gives
/// the heartbeat a connection of its own (as `Worker::start` does).
async fn hold_the_pool_through_a_run(
    env: &belfry_testkit::TestEnv,
    name: &str,
    own_heartbeat_pool: bool,
) -> Vec<u32> {
    let job = Steady::default();
    let registry = Registry::builder().job(job.clone()).build().unwrap();
    let mut pairs = env.process_env();
    pairs.extend(
        [
            ("BELFRY_INSTANCE", "w1"),
            ("BELFRY_WORKER_GROUP", "default"),
            ("BELFRY_LEASE", "2s"),
            ("BELFRY_RETRY_JITTER", "false"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    let config =
        belfry_worker::WorkerConfig::from_settings(&belfry_runtime::Settings::from_pairs(pairs))
            .unwrap();
    // One connection (the smallest `BELFRY_DB_POOL`; the cancel listener
    // has one of its own).
    let ledger = belfry_ledger::Ledger::connect(&env.database_url, 1)
        .await
        .unwrap();
    let heartbeat = if own_heartbeat_pool {
        belfry_ledger::Ledger::connect(&env.database_url, belfry_worker::HEARTBEAT_POOL)
            .await
            .unwrap()
    } else {
        ledger.clone()
    };
    let w = belfry_worker::Worker::start_on_pools(
        &config,
        registry,
        ledger.clone(),
        heartbeat,
        env.broker.clone(),
    )
    .await
    .unwrap();
    let running = RunningWorker::spawn(w);
    let m = env.enqueue(name, "steady", json!({}), Utc::now()).await;
    belfry_testkit::wait_running(env, &m, Duration::from_secs(10)).await;
    // Every connection of the worker's pool busy for 4 s (twice the lease),
    // as a burst of starts and ends holds them on a saturated database:
    // taken until one more does not come.
    let pool = ledger.pg_pool().unwrap();
    let mut held = Vec::new();
    while let Ok(Ok(c)) = tokio::time::timeout(Duration::from_millis(300), pool.acquire()).await {
        held.push(c);
    }
    assert!(
        !held.is_empty(),
        "the worker's pool had no connection to hold"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    drop(held);
    let done = env
        .wait_terminal(&m.job_name, &m.run_key, Duration::from_secs(30))
        .await;
    assert_eq!(done.status_text, "succeeded", "{done:?}");
    running.stop().await;
    let interrupted = job.interrupted.lock().unwrap_or_else(|p| p.into_inner());
    interrupted.clone()
}

/// The heartbeat has a connection of its own: a pool held busy for twice
/// the lease does not stop a handler that is running fine (with the
/// heartbeat on the same pool, the same hold interrupts it: the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pool_does_not_starve_the_lease_heartbeat() {
    let env = belfry_testkit::service_env!();
    if env.is_embedded() {
        return;
    }
    assert_eq!(
        hold_the_pool_through_a_run(&env, "shared-pool", false).await,
        vec![1],
        "control: the hold must starve a heartbeat that shares the pool"
    );
    assert_eq!(
        hold_the_pool_through_a_run(&env, "own-pool", true).await,
        Vec::<u32>::new()
    );
    env.teardown(&["default"]).await;
}
