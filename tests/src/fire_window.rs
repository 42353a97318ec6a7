//! The checks an end-to-end test of real processes ends with: every run
//! reached an end, and every second of a window has the fire of every
//! every-second schedule (nothing lost; twice is impossible by the unique
//! index on `(job_name, run_key)`).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use belfry_testkit::{eventually, TestEnv};
use chrono::{DateTime, Utc};

/// `(job_name, scheduled_at, status, attempts)` of every row of `env`.
pub async fn rows(env: &TestEnv) -> Vec<(String, DateTime<Utc>, String, i32)> {
    sqlx::query_as("SELECT job_name, scheduled_at, status, attempts FROM job_runs")
        .fetch_all(env.ledger.pg_pool().expect("a Postgres ledger"))
        .await
        .unwrap_or_else(|e| panic!("reading job_runs: {e}"))
}

/// Waits until every row of `env` is `succeeded`, `failed` or `dead`.
///
/// # Panics
///
/// When one is not within `within`.
pub async fn wait_every_run_ended(env: &TestEnv, within: Duration) {
    eventually("every run to end", within, || async {
        rows(env)
            .await
            .iter()
            .all(|r| matches!(r.2.as_str(), "succeeded" | "failed" | "dead"))
            .then_some(())
    })
    .await;
}

/// Asserts that each of `names` (every-second schedules) has a row for
/// every whole second from `start` to `end` in `env`.
///
/// # Panics
///
/// Naming the schedule and the seconds without a row.
pub async fn assert_no_fire_lost(
    env: &TestEnv,
    names: &[String],
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) {
    let rows = rows(env).await;
    let mut by_schedule: HashMap<&str, BTreeSet<i64>> = HashMap::new();
    for r in &rows {
        by_schedule.entry(&r.0).or_default().insert(r.1.timestamp());
    }
    for name in names {
        let seen = by_schedule.get(name.as_str()).cloned().unwrap_or_default();
        let lost: Vec<i64> = (start.timestamp()..=end.timestamp())
            .filter(|t| !seen.contains(t))
            .collect();
        assert!(lost.is_empty(), "{name}: no row for {lost:?}");
    }
}
