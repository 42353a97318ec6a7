//! Flow control across the cluster (issue 22): cluster-wide concurrency
//! limits. A slot is a running attempt under a live lease with the limit's
//! key (`belfry_ledger::ConcurrencyLimit`); a run that finds every slot
//! taken waits in the ledger without using an attempt.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use belfry_ledger::{AttemptStart, ConcurrencyLimit};
use belfry_protocol::JobOptions;
use belfry_scheduler::Replica;
use belfry_testkit::{eventually, redis_url};
use belfry_tests::{replica, t0, worker, Gauge, RunningWorker};
use belfry_worker::{Job, JobContext, JobError, Registry, WorkerCounters};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Returns at once.
#[derive(Clone, Default)]
struct Quick;

impl Job for Quick {
    const TYPE: &'static str = "quick";
    type Payload = serde_json::Value;
    async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        Ok(())
    }
}

fn limited(max: u32) -> JobOptions {
    JobOptions {
        concurrency: Some(max),
        ..JobOptions::default()
    }
}

/// A replica's outbox reconciler, publishing waiting runs as they come due
/// until the token is cancelled (what a running scheduler does).
fn reconciling(r: Arc<Replica>) -> CancellationToken {
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        while !token.is_cancelled() {
            let _ = r.reconciler().reconcile_once().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    stop
}

belfry_testkit::both_backends! {
    async fn concurrent_starts_never_take_more_slots_than_the_limit(env: TestEnv) {
        let limit = ConcurrencyLimit {
            key: "gauge".into(),
            max: 2,
            wait: Duration::from_secs(60),
        };
        env.declare_default_group(&["gauge"]).await;
        let mut messages = Vec::new();
        for i in 0..6 {
            messages.push(env.enqueue(&format!("s{i}"), "gauge", json!(null), t0()).await);
        }
        // Six workers ask at once: the count and the start are one step.
        let starts = futures::future::join_all(messages.iter().enumerate().map(|(i, m)| {
            let ledger = env.ledger.clone();
            let limit = limit.clone();
            async move {
                ledger
                    .begin_attempt_limited(m, &format!("w{i}"), Duration::from_secs(60), Some(&limit))
                    .await
                    .unwrap()
            }
        }))
        .await;
        let started = starts.iter().filter(|s| matches!(s, AttemptStart::Started { .. })).count();
        let waiting = starts.iter().filter(|s| matches!(s, AttemptStart::Waiting { .. })).count();
        assert_eq!((started, waiting), (2, 4), "{starts:?}");
        // The waiting ones used no attempt and say why they wait.
        for (m, s) in messages.iter().zip(&starts) {
            let run = env.run_of(m).await;
            if let AttemptStart::Waiting { running, .. } = s {
                assert_eq!(*running, 2);
                assert_eq!((run.status_text.as_str(), run.attempts), ("retrying", 0));
                assert!(run.next_dispatch_at.is_some());
                let said = run.last_error.unwrap_or_default();
                assert!(said.contains("waiting for a concurrency slot: 2 of 2"), "{said}");
            } else {
                assert_eq!((run.status_text.as_str(), run.attempts), ("running", 1));
            }
        }
        // Another key has slots of its own.
        let other = env.enqueue("o", "gauge", json!(null), t0()).await;
        let other_limit = ConcurrencyLimit { key: "gauge:other".into(), ..limit.clone() };
        let s = env
            .ledger
            .begin_attempt_limited(&other, "w9", Duration::from_secs(60), Some(&other_limit))
            .await
            .unwrap();
        assert!(matches!(s, AttemptStart::Started { .. }), "{s:?}");
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_limit_holds_across_three_workers_without_blocking_other_types(env: TestEnv) {
        let gauge = Gauge::default();
        let registry = || {
            Registry::builder()
                .job_with(gauge.clone(), limited(2))
                .job(Quick)
                .build()
                .unwrap()
        };
        let extra = [("BELFRY_CONCURRENCY", "4"), ("BELFRY_PREFETCH", "8")];
        let mut workers = Vec::new();
        for name in ["w1", "w2", "w3"] {
            workers.push(RunningWorker::spawn(
                worker(&env, name, "default", registry(), &extra).await,
            ));
        }
        let r = Arc::new(replica(&env, "sched-a", Some(&redis_url())).await);
        let outbox = reconciling(r);
        let mut slows = Vec::new();
        for i in 0..8 {
            slows.push(env.enqueue(&format!("slow{i}"), "gauge", json!(null), t0()).await);
        }
        let mut quicks = Vec::new();
        for i in 0..4 {
            quicks.push(env.enqueue(&format!("quick{i}"), "quick", json!(null), t0()).await);
        }
        let mut quick_done = Vec::new();
        for m in &quicks {
            quick_done.push(env.wait_terminal_of(m, Duration::from_secs(30)).await);
        }
        let mut slow_done = Vec::new();
        for m in &slows {
            slow_done.push(env.wait_terminal_of(m, Duration::from_secs(60)).await);
        }
        outbox.cancel();
        // Never more than two at once across the three workers, and every
        // slow run took one attempt however often it waited.
        assert_eq!(gauge.peak.load(Ordering::SeqCst), 2);
        for run in &slow_done {
            assert_eq!((run.status_text.as_str(), run.attempts), ("succeeded", 1), "{run:?}");
        }
        let waits: u64 = workers
            .iter()
            .map(|w| WorkerCounters::get(&w.counters.limited))
            .sum();
        assert!(waits > 0, "eight runs over a limit of two: some waited");
        // The quick type was not held up behind the full limit.
        let last_quick = quick_done.iter().filter_map(|r| r.finished_at).max().unwrap();
        let last_slow = slow_done.iter().filter_map(|r| r.finished_at).max().unwrap();
        assert!(last_quick < last_slow, "quick runs finished at {last_quick}, slow ones at {last_slow}");
        for w in workers {
            w.stop().await;
        }
        env.teardown(&["default"]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_slot_is_freed_when_its_lease_runs_out() {
    let env = belfry_testkit::service_env!();
    let limit = ConcurrencyLimit {
        key: "gauge".into(),
        max: 1,
        wait: Duration::from_millis(200),
    };
    env.declare_default_group(&["gauge"]).await;
    // A worker that died mid-run holds the only slot under a long lease.
    let held = env.enqueue("held", "gauge", json!(null), t0()).await;
    let s = env
        .ledger
        .begin_attempt_limited(&held, "dead-worker", Duration::from_secs(600), Some(&limit))
        .await
        .unwrap();
    assert!(matches!(s, AttemptStart::Started { .. }), "{s:?}");
    let gauge = Gauge::default();
    let registry = Registry::builder()
        .job_with(gauge.clone(), limited(1))
        .build()
        .unwrap();
    let w = RunningWorker::spawn(worker(&env, "w1", "default", registry, &[]).await);
    let r = Arc::new(replica(&env, "sched-a", Some(&redis_url())).await);
    let outbox = reconciling(r);
    let next = env.enqueue("next", "gauge", json!(null), t0()).await;
    eventually("the next run to wait", Duration::from_secs(10), || async {
        (WorkerCounters::get(&w.counters.limited) >= 2).then_some(())
    })
    .await;
    let run = env.run_of(&next).await;
    assert_eq!(run.attempts, 0, "waiting uses no attempt");
    assert_eq!(gauge.peak.load(Ordering::SeqCst), 0);
    // The dead worker's lease runs out: its slot with it.
    sqlx::query("UPDATE job_runs SET lease_until = now() - interval '1 second' WHERE id = $1")
        .bind(held.message_id)
        .execute(env.ledger.pg_pool().unwrap())
        .await
        .unwrap();
    let run = env.wait_terminal_of(&next, Duration::from_secs(20)).await;
    assert_eq!((run.status_text.as_str(), run.attempts), ("succeeded", 1));
    outbox.cancel();
    w.stop().await;
    env.teardown(&["default"]).await;
}
