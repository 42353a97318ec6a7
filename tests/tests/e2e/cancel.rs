//! Cancelling a run (issue 19): a waiting run never executes; a running
//! one is stopped on its worker within moments through the cancel
//! announcement, or within a heartbeat when the announcement was missed;
//! a handler that ignores its token is abandoned after the grace period;
//! a cancelled run is never retried, handed back or dead-lettered.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_ledger::{CancelOutcome, CancelRequest, RunStatus};
use belfry_tests::{worker, RunningWorker};
use belfry_worker::builtin::Sleep;
use belfry_worker::{Job, JobContext, JobError, Registry, WorkerCounters};
use chrono::Utc;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::api::{assert_error, call, guarded_api};

/// Counts its calls; succeeds.
#[derive(Clone, Default)]
struct Counted(Arc<AtomicUsize>);

impl Job for Counted {
    const TYPE: &'static str = "counted";
    type Payload = serde_json::Value;

    async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Sleeps a minute without looking at its cancellation token; counts the
/// naps it finished.
#[derive(Clone, Default)]
struct Stubborn(Arc<AtomicUsize>);

impl Job for Stubborn {
    const TYPE: &'static str = "stubborn";
    type Payload = serde_json::Value;

    async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_secs(60)).await;
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

belfry_testkit::both_backends! {
    async fn a_waiting_run_is_cancelled_at_once_and_never_executes(env: TestEnv) {
        let (_replica, api, admin, read) = guarded_api(&env, "cancel-api").await;
        env.declare_default_group(&["counted"]).await;
        let m = env
            .enqueue("report", "counted", json!({}), Utc::now())
            .await;
        let cancel = |id: &str| api.url(&format!("/v1/runs/{id}/cancel"));
        let id = m.message_id.to_string();
        // Read-only tokens cannot cancel.
        assert_error(
            &call(Method::POST, &cancel(&id), Some(read), None).await,
            StatusCode::FORBIDDEN,
            "forbidden",
            None,
        );
        let got = call(
            Method::POST,
            &cancel(&id),
            Some(admin),
            Some(json!({"reason": "wrong payload"})),
        )
        .await;
        assert_eq!(got.0, StatusCode::OK, "{:?}", got.1);
        assert_eq!(got.1["result"], "cancelled");
        assert_eq!(got.1["status"], "cancelled");
        let run = env.run_of(&m).await;
        assert_eq!(run.status().unwrap(), RunStatus::Cancelled);
        assert_eq!(run.last_error.as_deref(), Some("cancelled by ops: wrong payload"));
        assert!(run.finished_at.is_some() && run.next_dispatch_at.is_none());

        // Its message is still queued: the worker drops it unexecuted.
        let job = Counted::default();
        let registry = Registry::builder().job(job.clone()).build().unwrap();
        let running = RunningWorker::spawn(worker(&env, "w1", "default", registry, &[]).await);
        let counters = running.counters.clone();
        belfry_testkit::eventually("the delivery to be dropped", Duration::from_secs(10), || async {
            (WorkerCounters::get(&counters.duplicates) == 1).then_some(())
        })
        .await;
        assert_eq!(job.0.load(Ordering::SeqCst), 0, "a cancelled run executed");
        assert_eq!(env.run_of(&m).await.status().unwrap(), RunStatus::Cancelled);
        assert!(env.drain_dead_letters().await.is_empty(), "a cancelled run was dead-lettered");

        // Errors: finished (409), unknown (404), not an id (400).
        assert_error(
            &call(Method::POST, &cancel(&id), Some(admin), None).await,
            StatusCode::CONFLICT,
            "conflict",
            None,
        );
        assert_error(
            &call(Method::POST, &cancel(&uuid::Uuid::now_v7().to_string()), Some(admin), None).await,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        );
        assert_error(
            &call(Method::POST, &cancel("nope"), Some(admin), None).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some("id"),
        );
        assert_error(
            &call(Method::POST, &cancel(&id), Some(admin), Some(json!({"reson": "x"}))).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("reson"),
        );
        // The run list filters on the new status.
        let list = call(Method::GET, &api.url("/v1/runs?status=cancelled"), Some(read), None).await;
        assert_eq!(list.0, StatusCode::OK, "{:?}", list.1);
        assert_eq!(list.1["runs"][0]["id"], id.as_str());
        running.stop().await;
    }
}

belfry_testkit::both_backends! {
    async fn a_running_sleep_is_stopped_within_moments(env: TestEnv) {
        let (_replica, api, admin, _read) = guarded_api(&env, "cancel-api").await;
        let registry = Registry::builder().job(Sleep).build().unwrap();
        // A one-minute lease: the heartbeat (every 15 s) cannot be what
        // delivers the cancel within the 3 s asserted below.
        let running = RunningWorker::spawn(
            worker(&env, "w1", "default", registry, &[("BELFRY_LEASE", "60s")]).await,
        );
        let counters = running.counters.clone();
        let m = env
            .enqueue("nap", "sleep", json!({"duration_ms": 60_000}), Utc::now())
            .await;
        belfry_testkit::wait_running(&env, &m, Duration::from_secs(10)).await;
        let asked = Instant::now();
        let got = call(
            Method::POST,
            &api.url(&format!("/v1/runs/{}/cancel", m.message_id)),
            Some(admin),
            None,
        )
        .await;
        assert_eq!(got.0, StatusCode::ACCEPTED, "{:?}", got.1);
        assert_eq!(got.1["result"], "cancel_requested");
        // As read back just after: the worker may have stopped it already.
        assert!(
            got.1["status"] == "running" || got.1["status"] == "cancelled",
            "{:?}",
            got.1
        );
        let run = env.wait_terminal_of(&m, Duration::from_secs(10)).await;
        let took = asked.elapsed();
        assert!(took < Duration::from_secs(3), "the cancel took {took:?}");
        assert_eq!(run.status().unwrap(), RunStatus::Cancelled);
        assert_eq!(run.last_error.as_deref(), Some("cancelled by ops"));
        assert_eq!(run.attempts, 1);
        let entries = run.attempt_entries().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].outcome, "cancelled");
        assert_eq!(WorkerCounters::get(&counters.cancelled), 1);
        assert!(env.drain_dead_letters().await.is_empty(), "a cancelled run was dead-lettered");
        // Nothing is published again for it.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(env.run_of(&m).await.attempts, 1);
        running.stop().await;
    }
}

belfry_testkit::both_backends! {
    async fn a_handler_ignoring_its_token_is_abandoned_after_the_grace(env: TestEnv) {
        let job = Stubborn::default();
        let registry = Registry::builder().job(job.clone()).build().unwrap();
        let running = RunningWorker::spawn(
            worker(
                &env,
                "w1",
                "default",
                registry,
                &[("BELFRY_LEASE", "60s"), ("BELFRY_CANCEL_GRACE", "2s")],
            )
            .await,
        );
        let m = env.enqueue("stuck", "stubborn", json!({}), Utc::now()).await;
        belfry_testkit::wait_running(&env, &m, Duration::from_secs(10)).await;
        let asked = Instant::now();
        let outcome = env
            .ledger
            .cancel_run(&CancelRequest {
                id: m.message_id,
                reason: "cancelled by test",
                immediate: false,
            })
            .await
            .unwrap();
        assert_eq!(outcome, CancelOutcome::Requested);
        let run = env.wait_terminal_of(&m, Duration::from_secs(10)).await;
        let took = asked.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(5),
            "abandoned after {took:?}, the grace is 2 s"
        );
        assert_eq!(run.status().unwrap(), RunStatus::Cancelled);
        assert_eq!(run.last_error.as_deref(), Some("cancelled by test"));
        assert_eq!(job.0.load(Ordering::SeqCst), 0, "the handler ran to its end");
        running.stop().await;
    }
}

/// The announcement is missed (here: never sent; the request is written
/// by hand): the worker's heartbeat finds the request on the run's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_announcement_is_caught_by_the_heartbeat() {
    let env = belfry_testkit::service_env!();
    let registry = Registry::builder().job(Sleep).build().unwrap();
    // Lease 4 s: a heartbeat every second.
    let running = RunningWorker::spawn(
        worker(&env, "w1", "default", registry, &[("BELFRY_LEASE", "4s")]).await,
    );
    let m = env
        .enqueue("nap", "sleep", json!({"duration_ms": 60_000}), Utc::now())
        .await;
    belfry_testkit::wait_running(&env, &m, Duration::from_secs(10)).await;
    let pool = env.ledger.pg_pool().unwrap();
    sqlx::query(
        "UPDATE job_runs SET cancel_requested_at = now(), cancel_reason = 'cancelled by hand' \
         WHERE id = $1",
    )
    .bind(m.message_id)
    .execute(pool)
    .await
    .unwrap();
    let run = env.wait_terminal_of(&m, Duration::from_secs(5)).await;
    assert_eq!(run.status().unwrap(), RunStatus::Cancelled);
    assert_eq!(run.last_error.as_deref(), Some("cancelled by hand"));
    running.stop().await;
}

belfry_testkit::both_backends! {
    async fn a_cancelled_run_ends_instead_of_retrying_or_being_taken_over(env: TestEnv) {
        let lease = Duration::from_secs(1);
        let request = |id| CancelRequest { id, reason: "cancelled by test", immediate: false };
        // A running attempt that fails retryably after the request: the
        // run ends `cancelled`, and nothing publishes it again.
        env.declare_default_group(&["noop"]).await;
        let a = env.enqueue("a", "noop", json!({}), Utc::now()).await;
        let (id, attempt) = env.start_attempt(&a, "w1", Duration::from_secs(60)).await;
        assert_eq!(env.ledger.cancel_run(&request(id)).await.unwrap(), CancelOutcome::Requested);
        assert!(env.end_attempt(id, attempt, "w1", RunStatus::Retrying).await);
        let run = env.run_of(&a).await;
        assert_eq!(run.status().unwrap(), RunStatus::Cancelled);
        assert_eq!(run.last_error.as_deref(), Some("cancelled by test"));
        assert!(run.finished_at.is_some() && run.next_dispatch_at.is_none());

        // Handed back at shutdown after the request: it ends too.
        let b = env.enqueue("b", "noop", json!({}), Utc::now()).await;
        let (id, attempt) = env.start_attempt(&b, "w1", Duration::from_secs(60)).await;
        assert_eq!(env.ledger.cancel_run(&request(id)).await.unwrap(), CancelOutcome::Requested);
        assert!(env.ledger.hand_back(id, attempt, "shutdown").await.unwrap());
        assert_eq!(env.run_of(&b).await.status().unwrap(), RunStatus::Cancelled);

        // Its worker died after the request: the redelivery does not take
        // the run over, it ends it.
        let c = env.enqueue("c", "noop", json!({}), Utc::now()).await;
        let (id, _) = env.start_attempt(&c, "w1", lease).await;
        assert_eq!(env.ledger.cancel_run(&request(id)).await.unwrap(), CancelOutcome::Requested);
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        let again = env.ledger.begin_attempt(&c, "w2", lease).await.unwrap();
        assert_eq!(
            again,
            belfry_ledger::AttemptStart::AlreadyFinished { id, status: RunStatus::Cancelled }
        );
        assert_eq!(env.run_of(&c).await.last_error.as_deref(), Some("cancelled by test"));

        // Its worker died before any request: cancelled at once.
        let d = env.enqueue("d", "noop", json!({}), Utc::now()).await;
        let (id, _) = env.start_attempt(&d, "w1", lease).await;
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        assert_eq!(
            env.ledger.cancel_run(&request(id)).await.unwrap(),
            CancelOutcome::Cancelled { was: RunStatus::Running }
        );
        // Finished runs keep their outcome.
        assert_eq!(
            env.ledger.cancel_run(&request(id)).await.unwrap(),
            CancelOutcome::Finished(RunStatus::Cancelled)
        );
    }
}
