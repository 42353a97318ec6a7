//! Replicas racing for the same fires at once, as a fleet whose timers ring
//! together does: the building block of the exactly-once tests, on any
//! Redis deployment (one server, Sentinel, Cluster) or none.

use std::collections::HashSet;
use std::sync::Arc;

use std::sync::atomic::AtomicU64;

use belfry_scheduler::{FireCounters, FireOutcome, Replica, Schedule};
use belfry_testkit::TestEnv;
use chrono::{DateTime, Utc};

/// `count` replicas named `{name}-{i}` in `env`, locking through `redis`.
pub async fn replicas(
    env: &TestEnv,
    name: &str,
    count: usize,
    redis: Option<&str>,
) -> Vec<Arc<Replica>> {
    let mut replicas = Vec::new();
    for i in 0..count {
        replicas.push(Arc::new(
            crate::replica(env, &format!("{name}-{i}"), redis).await,
        ));
    }
    replicas
}

/// Every replica fires `schedule` at every instant, all at once.
pub async fn fire_all(
    replicas: &[Arc<Replica>],
    schedule: &Arc<Schedule>,
    instants: &[DateTime<Utc>],
) -> Vec<FireOutcome> {
    futures::future::join_all(
        instants
            .iter()
            .flat_map(|at| replicas.iter().map(move |r| (r.clone(), *at)))
            .map(|(r, at)| {
                let s = schedule.clone();
                async move { r.fire(&s, at).await }
            }),
    )
    .await
}

/// Asserts that of `outcomes` (each instant fired by every replica) exactly
/// one per instant dispatched and the others lost, and that the ledger holds
/// one `dispatched` row per instant of the schedule `name` among `instants`.
///
/// # Panics
///
/// When any of it does not hold.
pub async fn assert_one_run_each(
    env: &TestEnv,
    name: &str,
    instants: &[DateTime<Utc>],
    outcomes: &[FireOutcome],
) {
    let dispatched = outcomes
        .iter()
        .filter(|o| matches!(o, FireOutcome::Dispatched { .. }))
        .count();
    let lost = outcomes
        .iter()
        .filter(|o| matches!(o, FireOutcome::Lost))
        .count();
    assert_eq!(
        (dispatched, lost),
        (instants.len(), outcomes.len() - instants.len()),
        "{outcomes:?}"
    );
    let keys: HashSet<String> = instants
        .iter()
        .map(|at| belfry_protocol::run_key(name, *at).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let runs: Vec<_> = env
        .all_runs()
        .await
        .into_iter()
        .filter(|r| r.job_name == name && keys.contains(&r.run_key))
        .collect();
    assert_eq!(runs.len(), instants.len(), "one row per run key: {runs:?}");
    let distinct: HashSet<_> = runs.iter().map(|r| r.run_key.clone()).collect();
    assert_eq!(distinct.len(), instants.len());
    assert!(
        runs.iter().all(|r| r.status_text == "dispatched"),
        "{runs:?}"
    );
}

/// The sum over `replicas` of the counter `f` picks.
pub fn total(replicas: &[Arc<Replica>], f: impl Fn(&FireCounters) -> &AtomicU64) -> u64 {
    replicas
        .iter()
        .map(|r| FireCounters::get(f(r.counters())))
        .sum()
}
