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
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, scheduled_at, claimed_by, finished_at, \
             key_instant) \
         SELECT gen_random_uuid(), 'old', 'old@' || g, 'noop', 'succeeded', \
                now() - interval '60 days' + g * interval '1 second', 'sched-a', \
                now() - interval '59 days' + g * interval '1 second', belfry_key_instant('old', 'old@' || g) \
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
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, scheduled_at, claimed_by, finished_at, \
                 key_instant) \
             VALUES (gen_random_uuid(), $1, $1 || '@' || gen_random_uuid(), 'noop', $2, now() - interval '50 days', $3, \
                     {finished}, '1970-01-01Z')"
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

/// A run of `job_name` at `at`, claimed by `by`, finished `succeeded`
/// through the ledger's own transitions.
async fn finished(env: &TestEnv, job_name: &str, at: chrono::DateTime<Utc>, by: &str) {
    let run = belfry_ledger::NewRun {
        id: uuid::Uuid::now_v7(),
        job_name: job_name.into(),
        run_key: belfry_protocol::run_key(job_name, at).unwrap(),
        job_type: "noop".into(),
        payload: serde_json::Value::Null,
        scheduled_at: at,
        claimed_by: by.into(),
        trace_id: None,
        traceparent: None,
        options: Default::default(),
        next_dispatch_at: Utc::now(),
    };
    assert!(env.ledger.claim(&run).await.unwrap());
    env.finish(&run.to_message(), "w", belfry_ledger::RunStatus::Succeeded)
        .await;
}

belfry_testkit::both_backends! {
    async fn pruning_keeps_unfinished_runs_and_each_schedules_newest_fire(env: TestEnv) {
        env.broker.declare_group("default", &["noop"]).await.unwrap();
        let base = chrono::SubsecRound::trunc_subsecs(Utc::now(), 0) - chrono::Duration::days(3);
        for i in 0..5 {
            finished(&env, "daily", base + chrono::Duration::minutes(i), "sched-a").await;
        }
        for i in 0..3 {
            finished(&env, "manual-only", base + chrono::Duration::minutes(i), "manual:sched-a").await;
        }
        // An unfinished run of its own schedule.
        let open = env
            .enqueue("open", "noop", serde_json::Value::Null, base)
            .await;
        // Everything finished before the cutoff (just ahead of now), in
        // batches of 2.
        let cutoff = Utc::now() + chrono::Duration::seconds(1);
        let mut pruned = 0;
        loop {
            let n = env.ledger.prune_finished_runs(cutoff, 2).await.unwrap();
            assert!(n <= 2, "a batch is at most its size: {n}");
            if n == 0 {
                break;
            }
            pruned += n;
        }
        // 4 of "daily" (its newest fire stays) and all 3 manual runs (not
        // fires of a timetable).
        assert_eq!(pruned, 7);
        let daily = env.ledger.runs_of("daily", 10).await.unwrap();
        assert_eq!(daily.len(), 1);
        assert_eq!(daily[0].scheduled_at, base + chrono::Duration::minutes(4));
        assert!(env.ledger.runs_of("manual-only", 10).await.unwrap().is_empty());
        assert_eq!(env.run_of(&open).await.status_text, "claimed");
        // Newer finished runs stay with an older cutoff.
        finished(&env, "daily", base + chrono::Duration::minutes(5), "sched-a").await;
        assert_eq!(
            env.ledger
                .prune_finished_runs(Utc::now() - chrono::Duration::hours(1), 100)
                .await
                .unwrap(),
            0
        );
        env.teardown(&["default"]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_logs_older_than_any_window_are_pruned_and_live_ones_kept() {
    let env = belfry_testkit::service_env!();
    let pool = env.ledger.pg_pool().expect("a Postgres ledger");
    // A key no run asked for in two days (a tenant gone), 1,500 starts of
    // it (more than a batch), and a key in use.
    sqlx::query(
        "INSERT INTO rate_limit_starts (limit_key, started_at) \
         SELECT 'export:gone', now() - interval '2 days' - g * interval '1 second' \
         FROM generate_series(1, 1500) g",
    )
    .execute(pool)
    .await
    .unwrap();
    for sql in [
        "INSERT INTO rate_limit_starts (limit_key, started_at) \
         VALUES ('export:live', now() - interval '10 seconds'), ('export:live', now())",
        "INSERT INTO rate_limit_turns (limit_key, next_turn) \
         VALUES ('export:gone', now() - interval '2 days'), ('export:live', now() + interval '1 minute')",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
    // Runs are kept for 30 days: the rate log's age is its own.
    let retention = Retention::new(env.ledger.clone(), Duration::from_secs(30 * 24 * 3600));
    let pruned = retention
        .prune_once(Utc::now(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(pruned.rate_starts, 1500);
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM rate_limit_starts WHERE limit_key = 'export:live'"
        )
        .await,
        2
    );
    assert_eq!(
        count(&env, "SELECT count(*) FROM rate_limit_starts").await,
        2
    );
    assert_eq!(
        count(
            &env,
            "SELECT count(*) FROM rate_limit_turns WHERE limit_key = 'export:live'"
        )
        .await,
        1
    );
    assert_eq!(
        count(&env, "SELECT count(*) FROM rate_limit_turns").await,
        1
    );
    env.teardown(&[]).await;
}
