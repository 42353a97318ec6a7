//! Every overlap policy (issue 19) with three replicas racing for each
//! fire and a job that runs until the test opens its gate: what becomes of
//! the fires that come due while the previous run is unfinished (skipped,
//! buffered and started in order, the previous run cancelled or
//! terminated), on both backends. Each instant is decided once, whatever
//! the race; runs of a policy that serialises never overlap.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_ledger::RunRecord;
use belfry_scheduler::{FireOutcome, Replica, Schedule};
use belfry_testkit::TestEnv;
use belfry_tests::race::{fire_all, replicas};
use belfry_tests::{every_with, worker, RunningWorker};
use belfry_worker::{Job, JobContext, JobError, Registry};
use chrono::{DateTime, SubsecRound, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Runs until the gate opens; returns early (as an error) when its token
/// fires, unless its payload says `{"stubborn": true}`.
#[derive(Clone)]
struct Gate {
    open: watch::Receiver<bool>,
    starts: Arc<Mutex<Vec<String>>>,
}

impl Job for Gate {
    const TYPE: &'static str = "gate";
    type Payload = serde_json::Value;

    async fn run(&self, ctx: JobContext, payload: serde_json::Value) -> Result<(), JobError> {
        self.starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ctx.run_key.clone());
        let mut open = self.open.clone();
        if payload["stubborn"] == true {
            let _ = open.wait_for(|o| *o).await;
            return Ok(());
        }
        tokio::select! {
            _ = open.wait_for(|o| *o) => Ok(()),
            _ = ctx.cancel.cancelled() => Err(JobError::retryable("told to stop")),
        }
    }
}

/// Three replicas, a worker serving `gate` under `worker_env`, and a task
/// releasing buffered fires and publishing the outbox on every replica at
/// once every 50 ms (the reconcile loop's steps).
struct Stage {
    env: TestEnv,
    replicas: Vec<Arc<Replica>>,
    schedule: Arc<Schedule>,
    open: watch::Sender<bool>,
    starts: Arc<Mutex<Vec<String>>>,
    worker: RunningWorker,
    pump: CancellationToken,
}

impl Stage {
    async fn new(env: TestEnv, policy: &str, stubborn: bool, worker_env: &[(&str, &str)]) -> Self {
        let (open, rx) = watch::channel(false);
        let starts = Arc::new(Mutex::new(Vec::new()));
        let gate = Gate {
            open: rx,
            starts: starts.clone(),
        };
        let registry = Registry::builder().job(gate).build().unwrap();
        let worker =
            RunningWorker::spawn(worker(&env, "w1", "default", registry, worker_env).await);
        let replicas = replicas(&env, "r", 3, Some(&belfry_testkit::redis_url())).await;
        let schedule = every_with("job", "10s", "gate", |s| {
            s.overlap = Some(policy.into());
            if stubborn {
                s.payload = Some(serde_json::json!({"stubborn": true}));
            }
        });
        let pump = CancellationToken::new();
        for r in &replicas {
            let (r, stop) = (r.clone(), pump.clone());
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let _ = r.release_buffered_once().await;
                    let _ = r.reconciler().reconcile_once().await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }
        Self {
            env,
            replicas,
            schedule,
            open,
            starts,
            worker,
            pump,
        }
    }

    /// Every replica fires instant `at` at once; exactly one of them
    /// decides it, the others lose the race. The deciding outcome.
    async fn fire(&self, at: DateTime<Utc>) -> FireOutcome {
        let outcomes = fire_all(&self.replicas, &self.schedule, &[at]).await;
        let deciding: Vec<_> = outcomes
            .into_iter()
            .filter(|o| !matches!(o, FireOutcome::Lost))
            .collect();
        assert_eq!(deciding.len(), 1, "one replica decides {at}: {deciding:?}");
        deciding.into_iter().next().unwrap()
    }

    fn key(&self, at: DateTime<Utc>) -> String {
        belfry_protocol::run_key("job", at).unwrap()
    }

    async fn run(&self, at: DateTime<Utc>) -> Option<RunRecord> {
        self.env
            .ledger
            .run_by_key("job", &self.key(at))
            .await
            .unwrap()
    }

    async fn wait_status(&self, at: DateTime<Utc>, status: &str) -> RunRecord {
        belfry_testkit::eventually(
            &format!("{} to be {status}", self.key(at)),
            Duration::from_secs(15),
            || async { self.run(at).await.filter(|r| r.status_text == status) },
        )
        .await
    }

    async fn skipped(&self) -> Vec<(String, String)> {
        self.env.ledger.skipped_fires("job", 100).await.unwrap()
    }

    async fn finish(self) {
        self.pump.cancel();
        self.worker.stop().await;
    }
}

/// Three fire instants ten seconds apart, in the past (due now).
fn instants() -> [DateTime<Utc>; 3] {
    let t = Utc::now().trunc_subsecs(0) - chrono::Duration::seconds(60);
    [
        t,
        t + chrono::Duration::seconds(10),
        t + chrono::Duration::seconds(20),
    ]
}

/// Runs that serialise: each started after the previous one finished.
fn assert_in_order(runs: &[RunRecord]) {
    for pair in runs.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let (Some(end), Some(start)) = (a.finished_at, b.started_at) else {
            panic!("{} or {} did not run: {runs:?}", a.run_key, b.run_key);
        };
        assert!(
            start >= end,
            "{} started before {} ended",
            b.run_key,
            a.run_key
        );
    }
}

belfry_testkit::both_backends! {
    async fn skip_runs_the_first_and_records_the_others(env: TestEnv) {
        let stage = Stage::new(env, "skip", false, &[]).await;
        let [t1, t2, t3] = instants();
        assert!(matches!(stage.fire(t1).await, FireOutcome::Dispatched { .. }));
        stage.wait_status(t1, "running").await;
        for t in [t2, t3] {
            assert!(matches!(stage.fire(t).await, FireOutcome::Skipped { .. }));
            assert!(stage.run(t).await.is_none());
        }
        assert_eq!(stage.skipped().await.len(), 2);
        stage.open.send(true).unwrap();
        stage.wait_status(t1, "succeeded").await;
        stage.finish().await;
    }
}

belfry_testkit::both_backends! {
    async fn buffer_one_holds_one_fire_and_skips_the_rest(env: TestEnv) {
        let stage = Stage::new(env, "buffer_one", false, &[]).await;
        let [t1, t2, t3] = instants();
        assert!(matches!(stage.fire(t1).await, FireOutcome::Dispatched { .. }));
        stage.wait_status(t1, "running").await;
        assert!(matches!(stage.fire(t2).await, FireOutcome::Buffered { .. }));
        assert!(matches!(stage.fire(t3).await, FireOutcome::Skipped { .. }));
        assert_eq!(stage.run(t2).await.unwrap().status_text, "buffered");
        let skipped = stage.skipped().await;
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped[0].1.contains("already buffered"), "{skipped:?}");
        // Held while t1 runs.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(stage.run(t2).await.unwrap().status_text, "buffered");
        stage.open.send(true).unwrap();
        let first = stage.wait_status(t1, "succeeded").await;
        let second = stage.wait_status(t2, "succeeded").await;
        assert_in_order(&[first, second.clone()]);
        // Its nominal run key and instant, one attempt.
        assert_eq!((second.scheduled_at, second.attempts), (t2, 1));
        stage.finish().await;
    }
}

belfry_testkit::both_backends! {
    async fn buffer_all_runs_every_fire_in_order(env: TestEnv) {
        let stage = Stage::new(env, "buffer_all", false, &[]).await;
        let [t1, t2, t3] = instants();
        assert!(matches!(stage.fire(t1).await, FireOutcome::Dispatched { .. }));
        stage.wait_status(t1, "running").await;
        for t in [t2, t3] {
            assert!(matches!(stage.fire(t).await, FireOutcome::Buffered { .. }));
        }
        assert!(stage.skipped().await.is_empty());
        stage.open.send(true).unwrap();
        let mut runs = Vec::new();
        for t in [t1, t2, t3] {
            runs.push(stage.wait_status(t, "succeeded").await);
        }
        assert_in_order(&runs);
        let starts = stage.starts.lock().unwrap().clone();
        assert_eq!(starts, [t1, t2, t3].map(|t| stage.key(t)), "each ran once, in order");
        stage.finish().await;
    }
}

belfry_testkit::both_backends! {
    async fn cancel_other_cancels_the_running_run_then_starts(env: TestEnv) {
        let stage = Stage::new(env, "cancel_other", false, &[]).await;
        let [t1, t2, t3] = instants();
        assert!(matches!(stage.fire(t1).await, FireOutcome::Dispatched { .. }));
        stage.wait_status(t1, "running").await;
        // t1 is told to stop; t2 waits for it, then runs.
        assert!(matches!(stage.fire(t2).await, FireOutcome::Buffered { .. }));
        let first = stage.wait_status(t1, "cancelled").await;
        assert!(
            first.last_error.as_deref().unwrap_or("").contains("cancel_other"),
            "{first:?}"
        );
        stage.wait_status(t2, "running").await;
        assert!(matches!(stage.fire(t3).await, FireOutcome::Buffered { .. }));
        let second = stage.wait_status(t2, "cancelled").await;
        stage.wait_status(t3, "running").await;
        stage.open.send(true).unwrap();
        let third = stage.wait_status(t3, "succeeded").await;
        assert_in_order(&[first, second, third]);
        stage.finish().await;
    }
}

belfry_testkit::both_backends! {
    async fn terminate_other_abandons_the_running_run_without_grace(env: TestEnv) {
        // Handlers that ignore their token, and a grace of a minute: only
        // the termination's "no grace" ends them in time.
        let stage = Stage::new(env, "terminate_other", true, &[("BELFRY_CANCEL_GRACE", "60s")]).await;
        let [t1, t2, _] = instants();
        assert!(matches!(stage.fire(t1).await, FireOutcome::Dispatched { .. }));
        stage.wait_status(t1, "running").await;
        let asked = std::time::Instant::now();
        // t2 starts at once; t1 is abandoned.
        assert!(matches!(stage.fire(t2).await, FireOutcome::Dispatched { .. }));
        let first = stage.wait_status(t1, "cancelled").await;
        assert!(asked.elapsed() < Duration::from_secs(5), "{:?}", asked.elapsed());
        assert!(
            first.last_error.as_deref().unwrap_or("").contains("terminate_other"),
            "{first:?}"
        );
        stage.open.send(true).unwrap();
        stage.wait_status(t2, "succeeded").await;
        stage.finish().await;
    }
}

belfry_testkit::both_backends! {
    async fn allow_all_runs_every_fire_at_once(env: TestEnv) {
        let stage = Stage::new(env, "allow_all", false, &[]).await;
        let instants = instants();
        for t in instants {
            assert!(matches!(stage.fire(t).await, FireOutcome::Dispatched { .. }));
        }
        for t in instants {
            stage.wait_status(t, "running").await;
        }
        stage.open.send(true).unwrap();
        for t in instants {
            stage.wait_status(t, "succeeded").await;
        }
        stage.finish().await;
    }
}
