//! Web view page timings (issue 10): 1,000 schedules and 1,000,000 runs in
//! `job_runs`, every page requested repeatedly over loopback from the
//! in-process API; the time of a request is the server's time to render
//! it plus a loopback round trip. `/healthz` (no database) is measured in
//! the same run as the floor.
//!
//! The runs spread over 30 days across the 1,000 schedules, as a busy
//! deployment's history would: 97 % succeeded, 2 % failed, 0.5 % dead,
//! the rest unfinished, each with one attempt in its log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_broker::Broker;
use belfry_ledger::Ledger;
use belfry_protocol::ScheduleSpec;
use belfry_scheduler::{Replica, ReplicaTiming, Schedule};
use belfry_server::api::{ApiState, Tokens};
use belfry_testkit::{amqp_url, TestEnv};
use tokio_util::sync::CancellationToken;

/// Loads the data, times every page `rounds` times, prints the table.
pub async fn run(schedules: usize, runs: usize, rounds: usize) -> anyhow::Result<()> {
    let only: Option<String> = std::env::var("BELFRY_BENCH_UI_ONLY").ok();
    let env = TestEnv::new().await;
    let loading = Instant::now();
    let now = chrono::Utc::now();
    for i in 0..schedules {
        let spec = ScheduleSpec {
            name: format!("sched-{i}"),
            cron: (i % 2 == 0).then(|| format!("0 {} {} * * *", i % 60, i % 24)),
            timezone: (i % 2 == 0).then(|| "Europe/London".to_owned()),
            every: (i % 2 == 1).then(|| format!("{}s", 60 + i)),
            job_type: "noop".into(),
            ..Default::default()
        };
        env.ledger
            .upsert_schedule(&Schedule::storable_row(&spec, now, false)?)
            .await?;
    }
    sqlx::query(
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, attempts, \
             claimed_by, claimed_at, dispatched_at, started_at, finished_at, worker, last_error, attempt_log, trace_id, \
             key_instant) \
         SELECT gen_random_uuid(), 'sched-' || (g % $2), 'sched-' || (g % $2) || '@' || g, 'noop', \
                st, '{\"n\": 1}', t, 1, 'sched-a', t, t + interval '20 ms', t + interval '30 ms', \
                CASE WHEN st IN ('succeeded', 'failed', 'dead') THEN t + interval '1 s' END, 'w-1', \
                CASE WHEN st IN ('failed', 'dead') THEN 'boom' END, \
                jsonb_build_array(jsonb_build_object('attempt', 1, 'worker', 'w-1', 'started_at', t, \
                    'finished_at', t + interval '1 s', 'outcome', st)), md5(g::text), \
                belfry_key_instant('sched-' || (g % $2), 'sched-' || (g % $2) || '@' || g) \
         FROM (SELECT g, now() - (g::double precision / $1 * interval '30 days') AS t, \
                      CASE WHEN g % 200 = 7 THEN 'dead' WHEN g % 50 = 3 THEN 'failed' \
                           WHEN g % 1000 = 11 THEN 'running' ELSE 'succeeded' END AS st \
               FROM generate_series(1, $1) g) s",
    )
    .bind(i64::try_from(runs)?)
    .bind(i64::try_from(schedules)?)
    .execute(env.ledger.pg_pool().expect("a Postgres ledger"))
    .await?;
    sqlx::query("ANALYZE job_runs")
        .execute(env.ledger.pg_pool().expect("a Postgres ledger"))
        .await?;
    println!(
        "loaded {schedules} schedules and {runs} runs in {:.1} s",
        loading.elapsed().as_secs_f64()
    );
    let stop = CancellationToken::new();
    let addr = serve_api(&env, "bench-ui", &stop).await?;
    let some_run: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM job_runs WHERE status = 'failed' LIMIT 1")
            .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
            .await?;
    let pages = [
        "/healthz".to_owned(),
        "/ui".into(),
        "/ui/schedules".into(),
        "/ui/schedules?cursor=sched-500".into(),
        "/ui/schedules/sched-1".into(),
        "/ui/runs".into(),
        "/ui/runs?status=failed".into(),
        "/ui/runs?status=dead&schedule=sched-7".into(),
        // Needles: statuses with no row at all, a schedule with no runs.
        "/ui/runs?status=retrying".into(),
        "/ui/runs?status=dead&job_type=none".into(),
        "/ui/runs?schedule=no-such".into(),
        "/ui/runs?job_type=none".into(),
        "/ui/runs?job_type=noop&from=2026-01-01T00:00:00Z".into(),
        format!("/ui/runs/{some_run}"),
        "/v1/runs?status=dead&limit=100".into(),
    ];
    let client = reqwest::Client::new();
    println!();
    println!("| page | p50 ms | p95 ms | max ms | bytes |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for path in pages
        .iter()
        .filter(|p| only.as_deref().is_none_or(|o| p.contains(o)))
    {
        let url = format!("http://{addr}{path}");
        let mut times = Vec::with_capacity(rounds);
        let mut bytes = 0;
        for _ in 0..rounds {
            let started = Instant::now();
            let resp = client.get(&url).send().await?;
            anyhow::ensure!(resp.status().is_success(), "{path}: {}", resp.status());
            bytes = resp.bytes().await?.len();
            times.push(started.elapsed());
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "| `{path}` | {:.1} | {:.1} | {:.1} | {bytes} |",
            ms(times[times.len() / 2]),
            ms(times[times.len() * 95 / 100]),
            ms(times[times.len() - 1])
        );
    }
    stop.cancel();
    env.teardown(&[]).await;
    Ok(())
}

/// Serves the API and web view of a new replica `instance` of `env` (no
/// timer, no Redis lock) on a free loopback port until `stop`.
///
/// # Errors
///
/// When the ledger or the broker cannot be reached, or the port bound.
pub(crate) async fn serve_api(
    env: &TestEnv,
    instance: &str,
    stop: &CancellationToken,
) -> anyhow::Result<std::net::SocketAddr> {
    let ledger = Ledger::connect(&env.database_url, 8).await?;
    let broker = Broker::connect(&amqp_url(), env.topology.clone(), instance).await?;
    let replica = Arc::new(Replica::new(
        instance,
        None,
        ledger,
        broker,
        ReplicaTiming::default(),
    ));
    Ok(belfry_server::api::serve(
        "127.0.0.1:0",
        ApiState::new(replica, Tokens::default()),
        stop.clone(),
    )
    .await?)
}
