//! Flow control across the cluster (issue 22): cluster-wide concurrency
//! and rate limits. A slot is a running attempt under a live lease with the
//! limit's key (`belfry_ledger::ConcurrencyLimit`); a rate start is a row
//! of the key's sliding window (`belfry_ledger::StartRate`). A run that
//! finds every slot taken, or the window full, waits in the ledger without
//! using an attempt.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use belfry_ledger::{AttemptStart, ConcurrencyLimit, LimitKind, RunLimits, StartRate};
use belfry_protocol::{JobOptions, Priority, RateLimit};
use belfry_testkit::{eventually, redis_url};
use belfry_tests::{reconciling, replica, t0, worker, Gauge, RunningWorker};
use belfry_worker::{Job, JobContext, JobError, Registry, WorkerCounters};
use serde_json::json;

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

/// Three workers (four handlers and eight prefetched deliveries each) run
/// `count` runs of the limited `job_type` and four `quick` runs enqueued
/// after them, a replica's outbox publishing waiting runs again. Checks
/// that every limited run succeeded in one attempt however often it
/// waited, and that the quick type was not held up behind the limit
/// (no head-of-line blocking); returns the workers' waits for a slot and
/// for a rate start, and the limited runs as they ended.
async fn three_workers_beside_quick(
    env: &belfry_testkit::TestEnv,
    registry: impl Fn() -> Registry,
    job_type: &str,
    count: usize,
) -> (u64, u64, Vec<belfry_ledger::RunRecord>) {
    let extra = [("BELFRY_CONCURRENCY", "4"), ("BELFRY_PREFETCH", "8")];
    let mut workers = Vec::new();
    for name in ["w1", "w2", "w3"] {
        workers.push(RunningWorker::spawn(
            worker(env, name, "default", registry(), &extra).await,
        ));
    }
    let r = Arc::new(replica(env, "sched-a", Some(&redis_url())).await);
    let outbox = reconciling(r);
    let mut limited = Vec::new();
    for i in 0..count {
        limited.push(
            env.enqueue(&format!("{job_type}{i}"), job_type, json!(null), t0())
                .await,
        );
    }
    let mut quicks = Vec::new();
    for i in 0..4 {
        quicks.push(
            env.enqueue(&format!("quick{i}"), "quick", json!(null), t0())
                .await,
        );
    }
    let mut quick_done = Vec::new();
    for m in &quicks {
        quick_done.push(env.wait_terminal_of(m, Duration::from_secs(30)).await);
    }
    let mut limited_done = Vec::new();
    for m in &limited {
        limited_done.push(env.wait_terminal_of(m, Duration::from_secs(60)).await);
    }
    outbox.cancel();
    for run in &limited_done {
        assert_eq!(
            (run.status_text.as_str(), run.attempts),
            ("succeeded", 1),
            "{run:?}"
        );
    }
    let last_quick = quick_done
        .iter()
        .filter_map(|r| r.finished_at)
        .max()
        .unwrap();
    let last_limited = limited_done
        .iter()
        .filter_map(|r| r.finished_at)
        .max()
        .unwrap();
    assert!(
        last_quick < last_limited,
        "quick runs finished at {last_quick}, limited ones at {last_limited}"
    );
    let waits = |c: fn(&WorkerCounters) -> &std::sync::atomic::AtomicU64| -> u64 {
        workers
            .iter()
            .map(|w| WorkerCounters::get(c(&w.counters)))
            .sum()
    };
    let counted = (waits(|c| &c.limited), waits(|c| &c.rate_limited));
    for w in workers {
        w.stop().await;
    }
    (counted.0, counted.1, limited_done)
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
                    .begin_attempt_limited(m, &format!("w{i}"), Duration::from_secs(60), &RunLimits::concurrency(limit))
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
            .begin_attempt_limited(&other, "w9", Duration::from_secs(60), &RunLimits::concurrency(other_limit))
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
        let (waits, _, _) = three_workers_beside_quick(&env, registry, "gauge", 8).await;
        // Never more than two at once across the three workers.
        assert_eq!(gauge.peak.load(Ordering::SeqCst), 2);
        assert!(waits > 0, "eight runs over a limit of two: some waited");
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn concurrent_starts_never_exceed_the_rate_and_waiting_runs_get_spaced_turns(env: TestEnv) {
        let rate = StartRate { key: "gauge".into(), starts: 3, per: Duration::from_secs(60) };
        env.declare_default_group(&["gauge"]).await;
        let mut messages = Vec::new();
        for i in 0..8 {
            messages.push(env.enqueue(&format!("r{i}"), "gauge", json!(null), t0()).await);
        }
        // Eight workers ask at once: the window's count and the start are
        // one step, so exactly three start.
        let starts = futures::future::join_all(messages.iter().enumerate().map(|(i, m)| {
            let ledger = env.ledger.clone();
            let limits = RunLimits::rate(rate.clone());
            async move {
                ledger
                    .begin_attempt_limited(m, &format!("w{i}"), Duration::from_secs(60), &limits)
                    .await
                    .unwrap()
            }
        }))
        .await;
        let started = starts.iter().filter(|s| matches!(s, AttemptStart::Started { .. })).count();
        assert_eq!(started, 3, "{starts:?}");
        let mut turns = Vec::new();
        for (m, s) in messages.iter().zip(&starts) {
            let run = env.run_of(m).await;
            match s {
                AttemptStart::Started { .. } => {
                    assert_eq!((run.status_text.as_str(), run.attempts), ("running", 1));
                }
                AttemptStart::Waiting { limit, running, .. } => {
                    assert_eq!((*limit, *running), (LimitKind::Rate, 3));
                    assert_eq!((run.status_text.as_str(), run.attempts), ("retrying", 0));
                    let said = run.last_error.clone().unwrap_or_default();
                    assert!(said.contains("3 of 3 starts in the last 60000 ms"), "{said}");
                    turns.push(run.next_dispatch_at.unwrap());
                }
                other => panic!("unexpected start {other:?}"),
            }
        }
        // The five waiting runs come back one turn apart (60 s / 3), the
        // first when the window frees a start: not all at once.
        turns.sort();
        assert_eq!(turns.len(), 5);
        let first_wait = turns[0] - chrono::Utc::now();
        assert!(first_wait > chrono::Duration::seconds(55), "first turn in {first_wait}");
        for pair in turns.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                (gap - chrono::Duration::seconds(20)).num_milliseconds().abs() <= 1,
                "turns {turns:?}"
            );
        }
        // Another key has a window of its own.
        let other = env.enqueue("o", "gauge", json!(null), t0()).await;
        let limits = RunLimits::rate(StartRate { key: "gauge:other".into(), ..rate.clone() });
        let s = env.ledger.begin_attempt_limited(&other, "w9", Duration::from_secs(60), &limits).await.unwrap();
        assert!(matches!(s, AttemptStart::Started { .. }), "{s:?}");
        // A delivery of a run that is not startable (held by a running
        // attempt) takes no start of the window: the window's other two
        // starts are still there for new runs, and only then is it full.
        let held = env.ledger.begin_attempt_limited(&other, "w10", Duration::from_secs(60), &limits).await.unwrap();
        assert!(matches!(held, AttemptStart::Busy { .. }), "{held:?}");
        for (i, expect_start) in [(2, true), (3, true), (4, false)] {
            let next = env.enqueue(&format!("o{i}"), "gauge", json!(null), t0()).await;
            let s = env.ledger.begin_attempt_limited(&next, "w11", Duration::from_secs(60), &limits).await.unwrap();
            assert_eq!(
                matches!(s, AttemptStart::Started { .. }),
                expect_start,
                "start {i} of a window of 3 (the busy delivery must not count): {s:?}"
            );
        }
        env.teardown(&["default"]).await;
    }
}

/// Records the instant each run's handler starts.
#[derive(Clone, Default)]
struct Stamped {
    starts: Arc<std::sync::Mutex<Vec<std::time::Instant>>>,
}

impl Job for Stamped {
    const TYPE: &'static str = "stamped";
    type Payload = serde_json::Value;
    async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        if let Ok(mut s) = self.starts.lock() {
            s.push(std::time::Instant::now());
        }
        Ok(())
    }
}

belfry_testkit::both_backends! {
    async fn a_rate_limit_holds_across_three_workers_without_blocking_other_types(env: TestEnv) {
        let stamped = Stamped::default();
        let per_second = JobOptions {
            rate_limit: Some(RateLimit { starts: 4, per_ms: 1000 }),
            ..JobOptions::default()
        };
        let registry = || {
            Registry::builder()
                .job_with(stamped.clone(), per_second.clone())
                .job(Quick)
                .build()
                .unwrap()
        };
        let (_, waits, runs) = three_workers_beside_quick(&env, registry, "stamped", 16).await;
        assert!(waits > 0, "sixteen runs at four a second: some waited");
        assert_eq!(stamped.starts.lock().unwrap().len(), 16, "each handler ran once");
        // At most four started in any second, across the three workers, by
        // the ledger's start instants (taken under the key's lock, as the
        // window's log: exact, whatever the handlers' scheduling delays).
        // Without the limit all sixteen start within a few hundred ms.
        let mut starts: Vec<_> = runs.iter().filter_map(|r| r.started_at).collect();
        starts.sort();
        assert_eq!(starts.len(), 16);
        for (i, s) in starts.iter().enumerate() {
            let in_window = starts[i..]
                .iter()
                .take_while(|t| **t - *s < chrono::Duration::seconds(1))
                .count();
            assert!(in_window <= 4, "{in_window} starts within a second of start {i}: {starts:?}");
        }
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_message_with_a_rate_limit_out_of_range_is_dead_lettered_once_and_its_neighbour_runs(env: TestEnv) {
        let registry = Registry::builder().job(Quick).build().unwrap();
        let running = belfry_tests::serve(&env, registry, &[]).await;
        // Published by hand (another language): a rate of 0 starts a second.
        let bad = json!({
            "version": 1, "message_id": uuid::Uuid::new_v4(), "job_name": "bad-rate",
            "job_type": "quick", "run_key": "bad-rate@2026-07-26T03:00:00Z",
            "scheduled_at": "2026-07-26T03:00:00Z", "published_at": "2026-07-26T03:00:00Z",
            "options": {"rate_limit": {"starts": 0, "per_ms": 1000}},
        });
        env.publish_raw("quick", bad.to_string().as_bytes()).await;
        let good = env.enqueue("good", "quick", json!(null), t0()).await;
        assert_eq!(env.wait_terminal_of(&good, Duration::from_secs(15)).await.status_text, "succeeded");
        let run = env
            .wait_terminal("bad-rate", "bad-rate@2026-07-26T03:00:00Z", Duration::from_secs(15))
            .await;
        assert_eq!((run.status_text.as_str(), run.attempts), ("dead", 0), "{run:?}");
        let said = run.last_error.unwrap_or_default();
        assert!(said.contains("rate_limit cannot be used") && said.contains("allowed 1 to 10000"), "{said}");
        let mut dead = Vec::new();
        eventually("the dead letter", Duration::from_secs(10), || {
            let env = &env;
            async move { Some(env.drain_dead_letters().await).filter(|d| !d.is_empty()) }
        })
        .await
        .into_iter()
        .for_each(|d| dead.push(d));
        assert_eq!(dead.len(), 1, "dead-lettered once: {dead:?}");
        assert!(dead[0].1.contains("rate_limit cannot be used"), "{}", dead[0].1);
        // Refused, not mistaken for an outage: nothing handed back.
        assert_eq!(WorkerCounters::get(&running.counters.handed_back), 0);
        running.stop_and_teardown(env).await;
    }
}

/// Records the order runs ran in (by job name), 20 ms each; a run does not
/// end before `open` (so the test can line up a backlog behind it).
#[derive(Clone, Default)]
struct Ordered {
    ran: Arc<std::sync::Mutex<Vec<String>>>,
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl Job for Ordered {
    const TYPE: &'static str = "ordered";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        if let Ok(mut ran) = self.ran.lock() {
            ran.push(ctx.job_name.clone());
        }
        while !self.open.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(())
    }
}

belfry_testkit::both_backends! {
    async fn priorities_reorder_a_backlog(env: TestEnv) {
        env.declare_default_group(&["ordered"]).await;
        let at = |p: Priority| JobOptions { priority: Some(p), ..JobOptions::default() };
        // A backlog of thirty normal runs, one handler.
        let mut normal = Vec::new();
        for i in 0..30 {
            normal.push(env.enqueue(&format!("n{i:02}"), "ordered", json!(null), t0()).await);
        }
        let ordered = Ordered::default();
        let registry = Registry::builder().job(ordered.clone()).build().unwrap();
        let running = belfry_tests::serve(
            &env,
            registry,
            &[("BELFRY_CONCURRENCY", "1"), ("BELFRY_PREFETCH", "8")],
        )
        .await;
        // The first normal run holds the only handler until the late runs
        // are queued behind the other twenty-nine.
        eventually("the backlog to start", Duration::from_secs(10), || async {
            (ordered.ran.lock().map(|r| r.len()).unwrap_or(0) >= 1).then_some(())
        })
        .await;
        // Three low and three high runs join the backlog's tail.
        let mut late = Vec::new();
        for i in 0..3 {
            late.push(env.enqueue_with(&format!("l{i}"), "ordered", json!(null), t0(), at(Priority::Low)).await);
        }
        for i in 0..3 {
            late.push(env.enqueue_with(&format!("h{i}"), "ordered", json!(null), t0(), at(Priority::High)).await);
        }
        // Time for the broker to push them to the worker's consumers.
        tokio::time::sleep(Duration::from_millis(300)).await;
        ordered.open.store(true, Ordering::SeqCst);
        for m in normal.iter().chain(&late) {
            let run = env.wait_terminal_of(m, Duration::from_secs(30)).await;
            assert_eq!(run.status_text, "succeeded", "{run:?}");
        }
        let ran = ordered.ran.lock().unwrap().clone();
        let pos = |name: &str| ran.iter().position(|r| r == name).unwrap();
        // The high runs overtook the backlog: each ran among the first
        // few (in one queue they would have run last)...
        for h in ["h0", "h1", "h2"] {
            assert!(pos(h) < pos("n05"), "{h} ran at {} of {ran:?}", pos(h));
        }
        // ...and the low runs waited for every normal one.
        for l in ["l0", "l1", "l2"] {
            assert!(pos(l) > pos("n29"), "{l} ran at {} of {ran:?}", pos(l));
        }
        // The level travels with the run: stored in its options.
        assert_eq!(env.run_of(&late[3]).await.options["priority"], "high");
        running.stop_and_teardown(env).await;
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
        .begin_attempt_limited(
            &held,
            "dead-worker",
            Duration::from_secs(600),
            &RunLimits::concurrency(limit.clone()),
        )
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
