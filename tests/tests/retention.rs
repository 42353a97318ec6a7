//! Retention prunes finished history past its age in batches, and keeps what
//! the scheduler still needs: unfinished runs, recent runs, and each
//! schedule's newest fire (misfire recovery counts from it).

use std::time::Duration;

use belfry_scheduler::retention::Retention;
use belfry_testkit::TestEnv;
use chrono::Utc;
use tokio_util::sync::CancellationToken;

async fn count(env: &TestEnv, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_old_finished_runs_in_batches_and_keeps_what_matters() {
    let env = belfry_testkit::service_env!();
    let pool = env.ledger.pg_pool().expect("a Postgres ledger");
    // 2,500 old finished fires of "old" (PRUNE_BATCH is 1,000: three batches), whose
    // newest must survive; plus old ad-hoc and manual runs.
    sqlx::query(
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, scheduled_at, claimed_by, finished_at) \
         SELECT gen_random_uuid(), 'old', 'old@' || g, 'noop', 'succeeded', \
                now() - interval '60 days' + g * interval '1 second', 'sched-a', \
                now() - interval '59 days' + g * interval '1 second' \
         FROM generate_series(1, 2500) g",
    )
    .execute(pool)
    .await
    .unwrap();
    for (name, by, status, finished) in [
        (
            "adhoc",
            "client:app",
            "succeeded",
            "now() - interval '40 days'",
        ),
        (
            "old",
            "manual:sched-a",
            "failed",
            "now() - interval '40 days'",
        ),
        ("recent", "sched-a", "succeeded", "now() - interval '1 day'"),
        (
            "recent",
            "sched-a",
            "succeeded",
            "now() - interval '2 days'",
        ),
        ("stuck", "sched-a", "running", "NULL"),
    ] {
        sqlx::query(&format!(
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, scheduled_at, claimed_by, finished_at) \
             VALUES (gen_random_uuid(), $1, $1 || '@' || gen_random_uuid(), 'noop', $2, now() - interval '50 days', $3, {finished})"
        ))
        .bind(name)
        .bind(status)
        .bind(by)
        .execute(pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO skipped_fires (job_name, run_key, scheduled_at, reason, recorded_by, recorded_at) \
         VALUES ('old', 'old@s1', now(), 'overlap', 'a', now() - interval '40 days'), \
                ('old', 'old@s2', now(), 'overlap', 'a', now())",
    )
    .execute(pool)
    .await
    .unwrap();
    let newest_old: chrono::DateTime<Utc> = sqlx::query_scalar(
        "SELECT max(scheduled_at) FROM job_runs WHERE job_name = 'old' AND claimed_by = 'sched-a'",
    )
    .fetch_one(pool)
    .await
    .unwrap();

    let retention = Retention::new(env.ledger.clone(), Duration::from_secs(30 * 24 * 3600));
    let pruned = retention
        .prune_once(Utc::now(), &CancellationToken::new())
        .await
        .unwrap();
    // 2,499 of "old", the ad-hoc and the manual run; one skipped-fire record.
    assert_eq!((pruned.runs, pruned.skipped_fires), (2_501, 1));
    assert_eq!(
        count(&env, "SELECT count(*) FROM job_runs WHERE job_name = 'old'").await,
        1
    );
    let kept: chrono::DateTime<Utc> =
        sqlx::query_scalar("SELECT scheduled_at FROM job_runs WHERE job_name = 'old'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(kept, newest_old, "the schedule's newest fire is kept");
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM job_runs WHERE job_name IN ('recent', 'stuck')"
        )
        .await,
        3
    );
    assert_eq!(count(&env, "SELECT count(*) FROM skipped_fires").await, 1);
    // Idempotent: a second pass finds nothing.
    let again = retention
        .prune_once(Utc::now(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((again.runs, again.skipped_fires), (0, 0));
    env.teardown(&[]).await;
}
