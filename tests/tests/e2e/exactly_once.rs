//! The core promise: replicas race for every fire and exactly one wins,
//! with or without Redis; a worker runs each run once.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_runtime::SystemClock;
use belfry_scheduler::{FireOutcome, Timer};
use belfry_testkit::{redis_url, TestEnv, DEAD_REDIS_URL};
use belfry_tests::{every, race, replica, worker};
use belfry_worker::{Job, JobContext, JobError, Registry};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

/// Counts handler executions per run key.
#[derive(Clone, Default)]
struct Counted(Arc<Mutex<HashMap<String, u32>>>);

impl Job for Counted {
    const TYPE: &'static str = "counted";
    type Payload = serde_json::Value;

    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *seen.entry(ctx.run_key).or_default() += 1;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_two_workers_every_fire_runs_exactly_once() {
    let env = belfry_testkit::service_env!();
    let counted = Counted::default();
    let registry = || Registry::builder().job(counted.clone()).build().unwrap();
    let stop_workers = CancellationToken::new();
    let mut worker_tasks = Vec::new();
    for name in ["worker-1", "worker-2"] {
        let w = worker(&env, name, "default", registry(), &[]).await;
        worker_tasks.push(tokio::spawn(w.run(stop_workers.clone())));
    }
    let schedule = every("tick", "1s", "counted");
    let mut replicas = Vec::new();
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for name in ["sched-a", "sched-b", "sched-c"] {
        let r = Arc::new(replica(&env, name, Some(&redis_url())).await);
        let stop = CancellationToken::new();
        let timer = Timer::new(vec![schedule.clone()], Utc::now());
        tasks.push(tokio::spawn(r.clone().run(
            timer,
            Arc::new(SystemClock),
            stop.clone(),
        )));
        replicas.push(r);
        stops.push(stop);
    }
    tokio::time::sleep(Duration::from_millis(3200)).await;
    // Stop the replica that won the latest fire so far.
    let runs = env.all_runs().await;
    let last = runs.last().expect("fires in the first 3 seconds");
    let winner = last.claimed_by.clone().expect("claimed_by");
    let stopped_at: DateTime<Utc> = Utc::now();
    let idx = replicas
        .iter()
        .position(|r| r.instance() == winner)
        .expect("winner is one of ours");
    stops[idx].cancel();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for s in &stops {
        s.cancel();
    }
    for t in tasks {
        t.await.unwrap();
    }
    let runs = env.all_runs().await;
    for run in &runs {
        env.wait_terminal(&run.job_name, &run.run_key, Duration::from_secs(15))
            .await;
    }
    stop_workers.cancel();
    for t in worker_tasks {
        t.await.unwrap().unwrap();
    }
    let runs = env.all_runs().await;
    assert!(
        runs.len() >= 5,
        "expected about 5 fires, got {}",
        runs.len()
    );
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &runs {
        *per_key.entry(r.run_key.as_str()).or_default() += 1;
        assert_eq!(r.status_text, "succeeded", "{r:?}");
        assert_eq!(r.attempts, 1, "{r:?}");
    }
    assert!(
        per_key.values().all(|n| *n == 1),
        "duplicate rows: {per_key:?}"
    );
    // Handler executions equal the number of run keys, one each.
    let seen = counted.0.lock().unwrap().clone();
    assert_eq!(seen.len(), runs.len(), "executions {seen:?}");
    assert!(
        seen.values().all(|n| *n == 1),
        "a run executed twice: {seen:?}"
    );
    // No fire was lost, also after the winner stopped: one row per second.
    let secs: Vec<i64> = runs.iter().map(|r| r.scheduled_at.timestamp()).collect();
    for pair in secs.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1,
            "a fire is missing between {pair:?}: {secs:?}"
        );
    }
    assert!(
        runs.iter().any(|r| r.scheduled_at > stopped_at),
        "no fire after the winner {winner} stopped at {stopped_at}"
    );
    assert!(runs
        .iter()
        .filter(|r| r.scheduled_at > stopped_at)
        .all(|r| r.claimed_by.as_deref() != Some(winner.as_str())));
    // Every replica computed every fire while running; the losers lost.
    assert_eq!(race::total(&replicas, |c| &c.claims_won), runs.len() as u64);
    assert!(
        race::total(&replicas, |c| &c.claims_lost_lock)
            + race::total(&replicas, |c| &c.claims_lost_ledger)
            >= runs.len() as u64
    );
    env.teardown(&["default"]).await;
}

async fn race(
    env: &TestEnv,
    redis: Option<&str>,
    name: &str,
) -> Vec<Arc<belfry_scheduler::Replica>> {
    env.declare_default_group(&["noop"]).await;
    let schedule = every(name, "1s", "noop");
    let replicas = race::replicas(env, name, 3, redis).await;
    let base: DateTime<Utc> = "2026-07-26T03:00:00Z".parse().unwrap();
    let instants: Vec<_> = (0..5)
        .map(|i| base + chrono::Duration::seconds(i))
        .collect();
    let outcomes = race::fire_all(&replicas, &schedule, &instants).await;
    race::assert_one_run_each(env, name, &instants, &outcomes).await;
    replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_unreachable_the_database_alone_keeps_one_row_per_run_key() {
    let env = belfry_testkit::service_env!();
    let replicas = race(&env, Some(DEAD_REDIS_URL), "no-redis").await;
    // Every claim fell back to the database and the insert decided alone.
    assert_eq!(race::total(&replicas, |c| &c.lock_fallbacks), 15);
    assert_eq!(race::total(&replicas, |c| &c.claims_lost_ledger), 10);
    assert_eq!(race::total(&replicas, |c| &c.claims_lost_lock), 0);
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_redis_the_lock_turns_losers_away_before_the_database() {
    let env = belfry_testkit::service_env!();
    let replicas = race(&env, Some(&redis_url()), "with-redis").await;
    assert_eq!(race::total(&replicas, |c| &c.lock_fallbacks), 0);
    assert_eq!(
        race::total(&replicas, |c| &c.claims_lost_lock),
        10,
        "the lock filters every loser"
    );
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_clocks_apart_agree_on_run_keys() {
    // Two replicas whose clocks differ by 1.5 s drive their timers with
    // their own notion of now; the run keys are the same nominal instants.
    let env = belfry_testkit::service_env!("noop");
    let schedule = every("skew", "1s", "noop");
    let a = replica(&env, "exact", Some(&redis_url())).await;
    let b = replica(&env, "late-clock", Some(&redis_url())).await;
    let t0: DateTime<Utc> = "2026-07-26T03:00:00.200Z".parse().unwrap();
    let skew = chrono::Duration::milliseconds(1500);
    let mut ta = Timer::new(vec![schedule.clone()], t0);
    let mut tb = Timer::new(vec![schedule], t0 - skew);
    let mut keys_a = Vec::new();
    let mut keys_b = Vec::new();
    for step in 1..=5 {
        let now = t0 + chrono::Duration::seconds(step);
        keys_a.extend(ta.due(now).fires.into_iter().map(|f| f.at));
        keys_b.extend(tb.due(now - skew).fires.into_iter().map(|f| f.at));
    }
    // The late clock is 1.5 s behind, so it has reached fewer instants, but
    // every instant it computed from the on-time replica's start on is one
    // the on-time replica computed too: the same nominal whole seconds.
    assert!(keys_b.iter().all(|k| k.timestamp_subsec_nanos() == 0));
    let shared: Vec<_> = keys_b.iter().filter(|k| **k >= keys_a[0]).collect();
    assert!(shared.len() >= 3, "{keys_a:?} {keys_b:?}");
    assert!(
        shared.iter().all(|k| keys_a.contains(k)),
        "{keys_a:?} {keys_b:?}"
    );
    let sched = every("skew", "1s", "noop");
    for at in keys_a.iter().chain(&keys_b) {
        let (x, y) = tokio::join!(a.fire(&sched, *at), b.fire(&sched, *at));
        assert!(
            matches!(
                (&x, &y),
                (FireOutcome::Dispatched { .. }, FireOutcome::Lost)
                    | (FireOutcome::Lost, FireOutcome::Dispatched { .. })
                    | (FireOutcome::Lost, FireOutcome::Lost)
            ),
            "{x:?} {y:?}"
        );
    }
    let runs = env.all_runs().await;
    let mut union: Vec<_> = keys_a.iter().chain(&keys_b).copied().collect();
    union.sort();
    union.dedup();
    assert_eq!(runs.len(), union.len(), "one row per distinct instant");
    env.teardown(&["default"]).await;
}
