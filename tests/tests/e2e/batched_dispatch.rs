//! The batched claim and dispatch path keeps the single-fire guarantees:
//! replicas racing for a whole batch produce exactly one run per fire (with
//! and without Redis), unroutable fires inside a pipelined batch are
//! attributed to exactly their own runs, and a batch the ledger refuses
//! gives its locks back and is remembered for the misfire policy.

use std::collections::HashMap;
use std::sync::Arc;

use belfry_ledger::{NewRun, RunStatus};
use belfry_scheduler::{FireOutcome, FireSource, Replica, Schedule};
use belfry_testkit::{redis_url, DEAD_REDIS_URL};
use belfry_tests::{every, replica};
use chrono::{DateTime, SubsecRound, Utc};

fn batch(schedules: &[Arc<Schedule>], at: DateTime<Utc>) -> Vec<(Arc<Schedule>, DateTime<Utc>)> {
    schedules.iter().map(|s| (s.clone(), at)).collect()
}

/// `n` schedules of `noop` every second, named `{prefix}{i}`.
fn noop_schedules(prefix: &str, n: usize) -> Vec<Arc<Schedule>> {
    (0..n)
        .map(|i| every(&format!("{prefix}{i}"), "1s", "noop"))
        .collect()
}

/// `r`'s timer firing every schedule of `schedules` at `at` as one batch.
async fn fire_all(r: &Replica, schedules: &[Arc<Schedule>], at: DateTime<Utc>) -> Vec<FireOutcome> {
    r.fire_batch(&batch(schedules, at), FireSource::Timer).await
}

/// Checks that every outcome of a batch is `expected`.
fn assert_all(outcomes: &[FireOutcome], expected: impl Fn(&FireOutcome) -> bool) {
    assert!(outcomes.iter().all(expected), "{outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_racing_for_a_batch_make_one_run_per_fire() {
    let env = belfry_testkit::service_env!("noop");
    let schedules = noop_schedules("b", 120);
    for (round, redis) in [(0, Some(redis_url())), (1, None)] {
        let at = Utc::now().trunc_subsecs(0) + chrono::Duration::seconds(round);
        let mut replicas = Vec::new();
        for k in 0..3 {
            replicas.push(Arc::new(
                replica(&env, &format!("r{round}-{k}"), redis.as_deref()).await,
            ));
        }
        let fires = batch(&schedules, at);
        let outcomes = futures::future::join_all(
            replicas
                .iter()
                .map(|r| r.fire_batch(&fires, FireSource::Timer)),
        )
        .await;
        // Per fire: exactly one replica dispatched it, the others lost.
        for i in 0..fires.len() {
            let won = outcomes
                .iter()
                .filter(|o| matches!(o[i], FireOutcome::Dispatched { .. }))
                .count();
            let lost = outcomes
                .iter()
                .filter(|o| o[i] == FireOutcome::Lost)
                .count();
            assert_eq!(
                (won, lost),
                (1, 2),
                "fire {i} (redis: {redis:?}): {outcomes:?}"
            );
        }
        let rows: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM job_runs WHERE scheduled_at = $1 AND status = 'dispatched'",
        )
        .bind(at)
        .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
        .await
        .unwrap();
        assert_eq!(rows, 120, "redis: {redis:?}");
    }
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_fires_in_a_pipelined_batch_are_exactly_their_own() {
    // Only "noop" has a queue: every "orphan" fire comes back unroutable.
    let env = belfry_testkit::service_env!("noop");
    let schedules: Vec<Arc<Schedule>> = (0..300)
        .map(|i| {
            let job_type = if i % 3 == 0 { "orphan" } else { "noop" };
            every(&format!("m{i}"), "1s", job_type)
        })
        .collect();
    let r = replica(&env, "mixed", Some(&redis_url())).await;
    let at = Utc::now().trunc_subsecs(0);
    let outcomes = fire_all(&r, &schedules, at).await;
    for (s, o) in schedules.iter().zip(&outcomes) {
        match (s.job_type.as_str(), o) {
            ("orphan", FireOutcome::Unroutable { .. })
            | ("noop", FireOutcome::Dispatched { .. }) => {}
            other => panic!("{}: {other:?}", s.name),
        }
    }
    let statuses: HashMap<String, (String, String)> = env
        .all_runs()
        .await
        .into_iter()
        .map(|r| (r.job_name.clone(), (r.job_type, r.status_text)))
        .collect();
    assert_eq!(statuses.len(), 300);
    for (name, (job_type, status)) in statuses {
        let expected = if job_type == "orphan" {
            "dead"
        } else {
            "dispatched"
        };
        assert_eq!(status, expected, "{name}");
    }
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_ledger_refuses_gives_its_locks_back_and_is_recovered() {
    let env = belfry_testkit::service_env!("noop");
    let schedules = noop_schedules("f", 20);
    let at = Utc::now().trunc_subsecs(0);
    let broken = replica(&env, "broken", Some(&redis_url())).await;
    // Its ledger goes away: the batch insert fails.
    broken.ledger().close().await;
    let outcomes = fire_all(&broken, &schedules, at).await;
    assert_all(&outcomes, |o| matches!(o, FireOutcome::ClaimFailed { .. }));
    // The locks were given back: a healthy replica claims every fire through
    // the lock at once, none lost to a lock nobody recorded.
    let healthy = replica(&env, "healthy", Some(&redis_url())).await;
    let outcomes = fire_all(&healthy, &schedules, at).await;
    assert_all(&outcomes, |o| matches!(o, FireOutcome::Dispatched { .. }));
    // A replica whose Redis is down claims through the ledger alone and
    // finds every fire taken.
    let no_redis = replica(&env, "no-redis", Some(DEAD_REDIS_URL)).await;
    let outcomes = fire_all(&no_redis, &schedules, at).await;
    assert_all(&outcomes, |o| *o == FireOutcome::Lost);
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_claims_a_batch_row_by_row() {
    let env = belfry_testkit::service_env!();
    let at = Utc::now().trunc_subsecs(0);
    let run = |name: &str| NewRun {
        id: uuid::Uuid::now_v7(),
        job_name: name.into(),
        run_key: belfry_protocol::run_key(name, at).unwrap(),
        job_type: "noop".into(),
        payload: serde_json::json!({"n": name}),
        scheduled_at: at,
        claimed_by: "a".into(),
        trace_id: None,
        traceparent: None,
        options: Default::default(),
        next_dispatch_at: at,
    };
    // "taken" is already claimed by someone else.
    assert!(env.ledger.claim(&run("taken")).await.unwrap());
    let batch: Vec<NewRun> = ["x", "taken", "y"].iter().map(|n| run(n)).collect();
    let won = env.ledger.claim_many(&batch).await.unwrap();
    assert_eq!(won.len(), 2);
    assert!(won.contains(&batch[0].id) && won.contains(&batch[2].id));
    assert!(!won.contains(&batch[1].id));
    // A fast worker already started "y": marking the batch dispatched must
    // not move it back, but gives it its dispatched_at.
    let y = env.ledger.run(batch[2].id).await.unwrap().unwrap();
    env.ledger
        .begin_attempt(&y.to_message(), "w", std::time::Duration::from_secs(60))
        .await
        .unwrap();
    env.ledger
        .mark_dispatched_many(&[batch[0].id, batch[2].id])
        .await
        .unwrap();
    let x = env.ledger.run(batch[0].id).await.unwrap().unwrap();
    let y = env.ledger.run(batch[2].id).await.unwrap().unwrap();
    assert_eq!(x.status().unwrap(), RunStatus::Dispatched);
    assert_eq!(y.status().unwrap(), RunStatus::Running);
    assert!(x.dispatched_at.is_some() && y.dispatched_at.is_some());
    assert!(env.ledger.claim_many(&[]).await.unwrap().is_empty());
    env.teardown(&[]).await;
}
