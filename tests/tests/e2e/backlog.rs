//! A backlog deeper than every page (issue 16, defect 2): thousands of
//! schedules on one instant claimed while RabbitMQ was down, never
//! published. The late-claim pass used to read the same first page of
//! 10,000 rows again and again without reaching the outbox; now every pass
//! pages through all of them and the outbox publishes what the policies
//! keep. Run with the default page size, as users run it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_protocol::ScheduleSpec;
use belfry_runtime::SystemClock;
use belfry_scheduler::{Schedule, Timer};
use belfry_tests::{replica, serve};
use belfry_worker::Registry;
use chrono::{SubsecRound, Utc};
use tokio_util::sync::CancellationToken;

/// `catch_up` schedules, one late claim each: 3x the default page.
const BURST: i64 = 30_000;
/// `fire_once` schedules sorting after the burst, 5 late claims each: only
/// reached once the pass gets past the burst's pages.
const ONCE: i64 = 100;

/// Stores `spec` as a template and copies it to `count` schedules named
/// `{prefix}{n:05}`.
async fn schedules_like(
    pool: &sqlx::PgPool,
    env: &belfry_testkit::TestEnv,
    spec: ScheduleSpec,
    prefix: &str,
    count: i64,
) {
    env.ledger
        .upsert_schedule(&Schedule::row_for(&spec).unwrap())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO schedules (name, cron, every_ms, timezone, job_type, payload, options, spec) \
         SELECT $2 || lpad(g::text, 5, '0'), cron, every_ms, timezone, job_type, payload, options, \
                jsonb_set(spec, '{name}', to_jsonb($2 || lpad(g::text, 5, '0'))) \
         FROM schedules, generate_series(1, $3) g WHERE name = $1",
    )
    .bind(&spec.name)
    .bind(prefix)
    .bind(count)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("DELETE FROM schedules WHERE name = $1")
        .bind(&spec.name)
        .execute(pool)
        .await
        .unwrap();
}

/// `per` late `claimed` rows for each schedule named `{prefix}...`, the
/// newest `ago` seconds old, one second apart, claimed at their instants
/// and never published.
async fn claimed_during_outage(pool: &sqlx::PgPool, prefix: &str, per: i64, ago: i64) {
    let now = Utc::now().trunc_subsecs(0);
    sqlx::query(
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
             claimed_by, claimed_at, next_dispatch_at, key_instant) \
         SELECT gen_random_uuid(), s.name, rk.run_key, \
                s.job_type, 'claimed', 'null'::jsonb, t, 'replica-during-outage', t, t + interval '30 seconds', \
                belfry_key_instant(s.name, rk.run_key) \
         FROM schedules s, \
              LATERAL (SELECT $2::timestamptz - make_interval(secs => $3 + i) AS t \
                       FROM generate_series(0, $4 - 1) i) k, \
              LATERAL (SELECT s.name || '@' || \
                           to_char(k.t AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS run_key) rk \
         WHERE s.name LIKE $1 || '%'",
    )
    .bind(prefix)
    .bind(now)
    .bind(ago as f64)
    .bind(per)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_several_pages_deep_claimed_during_an_outage_all_runs() {
    let env = belfry_testkit::service_env!();
    let pool = env.ledger.pg_pool().expect("a Postgres ledger").clone();
    let burst = ScheduleSpec {
        name: "burst-template".into(),
        cron: Some("0 0 * * * *".into()),
        job_type: "noop".into(),
        misfire: Some("catch_up".into()),
        catch_up_max: Some(3),
        ..Default::default()
    };
    schedules_like(&pool, &env, burst, "b-", BURST).await;
    let once = ScheduleSpec {
        name: "once-template".into(),
        every: Some("1s".into()),
        job_type: "noop".into(),
        misfire: Some("fire_once".into()),
        ..Default::default()
    };
    schedules_like(&pool, &env, once, "z-once-", ONCE).await;
    // The hourly burst fired 60 s ago while RabbitMQ was down: every fire
    // claimed on time, none published, the confirm grace (30 s) long past.
    claimed_during_outage(&pool, "b-", 1, 60).await;
    claimed_during_outage(&pool, "z-once-", 5, 60).await;
    let running = serve(
        &env,
        Registry::builder().builtins().build().unwrap(),
        &[("BELFRY_CONCURRENCY", "64"), ("BELFRY_PREFETCH", "256")],
    )
    .await;
    let replica = Arc::new(replica(&env, "after-outage", None).await);
    let stop = CancellationToken::new();
    let started = Instant::now();
    // No schedule in the timer: only the late-claim pass and the outbox work.
    let task = tokio::spawn(replica.clone().run(
        Timer::new(Vec::new(), Utc::now()),
        Arc::new(SystemClock),
        stop.clone(),
    ));
    let expected_runs = BURST + ONCE;
    let bound = Duration::from_secs(180);
    let counts = loop {
        let counts: (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), \
                    count(*) FILTER (WHERE status = 'dead'), \
                    count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'dead')) \
             FROM job_runs",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if counts.2 == 0 || started.elapsed() > bound {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let took = started.elapsed();
    stop.cancel();
    task.await.unwrap();
    running.stop().await;
    eprintln!(
        "backlog of {} late claims ({} runs kept): all settled in {:.1} s",
        BURST + 5 * ONCE,
        expected_runs,
        took.as_secs_f64()
    );
    assert_eq!(
        counts,
        (expected_runs, 4 * ONCE, 0),
        "(succeeded, dead, unfinished) after {took:?}: every catch_up fire runs, fire_once keeps its latest"
    );
    let dead_reason: Option<String> =
        sqlx::query_scalar("SELECT last_error FROM job_runs WHERE status = 'dead' LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        dead_reason.unwrap_or_default().contains("FireOnce"),
        "skipped fires say which policy skipped them"
    );
    env.teardown(&["default"]).await;
}
