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
