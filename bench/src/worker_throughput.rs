//! Worker throughput: `noop` jobs per second through one and three belfry
//! workers of one group, next to a baseline consumer that does only what
//! the broker and the database need (consume, one `UPDATE` per job, ack) at
//! the same prefetch and concurrency; and 100 ms `sleep` jobs through one
//! and three workers with the same per-worker concurrency.
//!
//! Every scenario starts from the same state: N claimed rows in a fresh
//! database and N persistent messages in the group's queue, loaded before
//! the clock starts. Rounds alternate the scenarios and the median round is
//! reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use tokio::sync::Semaphore;
use uuid::Uuid;

use belfry_protocol::{run_key, JobMessage, MESSAGE_VERSION};
use belfry_runtime::Settings;
use belfry_testkit::{amqp_url, TestEnv};
use belfry_worker::{Registry, Worker, WorkerConfig, WorkerCounters};

use crate::sample::median;

const PREFETCH: u16 = 64;
pub(crate) const CONCURRENCY: usize = 32;
const SLEEP_CONCURRENCY: usize = 8;
/// Batches in flight in the batched baseline.
const BATCHES_IN_FLIGHT: usize = 4;
/// Past days of run partitions in the aged-ledger scenario: what a 30-day
/// retention keeps (with today's and the days ahead, 36 partitions).
const AGED_DAYS: u64 = 30;

/// Loads `n` claimed rows and their messages of `job_type` into `env`.
async fn load(
    env: &TestEnv,
    n: usize,
    job_type: &str,
    payload: serde_json::Value,
    spread: bool,
) -> anyhow::Result<()> {
    env.broker.declare_group("default", &[job_type]).await?;
    let base = chrono::Utc::now();
    let mut messages = Vec::with_capacity(n);
    for i in 0..n {
        let at = base + chrono::Duration::seconds(i64::try_from(i)?);
        messages.push(JobMessage {
            version: MESSAGE_VERSION,
            message_id: Uuid::now_v7(),
            job_name: "bench".into(),
            job_type: job_type.into(),
            run_key: run_key("bench", at)?,
            scheduled_at: at,
            published_at: base,
            attempt: 1,
            payload: payload.clone(),
            trace: None,
            options: belfry_protocol::JobOptions {
                priority: spread.then(|| belfry_protocol::Priority::ALL[i % 3]),
                ..Default::default()
            },
        });
    }
    let ids: Vec<Uuid> = messages.iter().map(|m| m.message_id).collect();
    let keys: Vec<String> = messages.iter().map(|m| m.run_key.clone()).collect();
    let ats: Vec<chrono::DateTime<chrono::Utc>> = messages.iter().map(|m| m.scheduled_at).collect();
    sqlx::query(
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, claimed_by, claimed_at, \
             dispatched_at, key_instant) \
         SELECT id, 'bench', key, $4, 'dispatched', $5, at, 'bench', now(), now(), belfry_key_instant('bench', key) \
         FROM unnest($1::uuid[], $2::text[], $3::timestamptz[]) AS t(id, key, at)",
    )
    .bind(&ids)
    .bind(&keys)
    .bind(&ats)
    .bind(job_type)
    .bind(&payload)
    .execute(env.ledger.pg_pool().expect("a Postgres ledger"))
    .await?;
    let conn =
        lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut confirms = Vec::with_capacity(n);
    for m in &messages {
        confirms.push(
            channel
                .basic_publish(
                    &env.topology.jobs_exchange(),
                    &m.options.priority().routing_key(job_type),
                    BasicPublishOptions::default(),
                    &m.to_vec(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?,
        );
    }
    for c in futures::future::join_all(confirms).await {
        c?;
    }
    let _ = conn.close(200, "loaded").await;
    Ok(())
}

/// A plain consumer of the group's queue at the benchmark's prefetch, on
/// its own connection (closed by the caller), and a database pool: what
/// the raw loops start from.
async fn raw_consumer(
    env: &TestEnv,
    tag: &str,
) -> anyhow::Result<(lapin::Connection, lapin::Consumer, sqlx::PgPool)> {
    let conn =
        lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let consumer = channel
        .basic_consume(
            &env.topology.group_queue("default"),
            tag,
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&env.database_url)
        .await?;
    Ok((conn, consumer, pool))
}

/// The baseline: consume, one UPDATE, ack; same prefetch and concurrency.
async fn baseline(env: &TestEnv, n: usize) -> anyhow::Result<Duration> {
    let (conn, mut consumer, pool) = raw_consumer(env, "baseline").await?;
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let permit = permits.clone().acquire_owned().await?;
        let delivery = consumer.next().await.context("consumer closed")??;
        let pool = pool.clone();
        tasks.spawn(async move {
            let _permit = permit;
            if let Ok(m) = JobMessage::from_slice(&delivery.data) {
                let _ = sqlx::query(
                    "UPDATE job_runs SET status = 'succeeded', finished_at = now() WHERE id = $1",
                )
                .bind(m.message_id)
                .execute(&pool)
                .await;
            }
            let _ = delivery.acker.ack(BasicAckOptions::default()).await;
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    let _ = conn.close(200, "done").await;
    Ok(elapsed)
}

/// The batched loop: whatever deliveries are ready (up to the prefetch)
/// become one `UPDATE ... WHERE id = ANY(...)` and one `multiple` ack, with
/// up to [`BATCHES_IN_FLIGHT`] batches in flight, acked in delivery order.
/// No belfry code: what the broker and the database allow.
async fn batched_baseline(env: &TestEnv, n: usize) -> anyhow::Result<Duration> {
    use futures::FutureExt;
    let (conn, mut consumer, pool) = raw_consumer(env, "batched").await?;
    let start = Instant::now();
    let mut in_flight = futures::stream::FuturesOrdered::new();
    let mut taken = 0;
    let mut done = 0;
    while done < n {
        // A new batch when there is room for one, else (or when a batch
        // finishes first) an ack: the broker sends nothing past the
        // prefetch until something is acked.
        let next = if taken < n && in_flight.len() < BATCHES_IN_FLIGHT {
            tokio::select! {
                d = consumer.next() => Ok(d.context("consumer closed")??),
                b = in_flight.next(), if !in_flight.is_empty() => Err(b.context("no batch in flight")??),
            }
        } else {
            Err(in_flight.next().await.context("no batch in flight")??)
        };
        match next {
            Ok(first) => {
                // One delivery awaited, then every one already there.
                let mut batch = vec![first];
                while batch.len() < usize::from(PREFETCH) {
                    match consumer.next().now_or_never() {
                        Some(Some(d)) => batch.push(d?),
                        _ => break,
                    }
                }
                taken += batch.len();
                let ids: Vec<Uuid> = batch
                    .iter()
                    .filter_map(|d| JobMessage::from_slice(&d.data).ok().map(|m| m.message_id))
                    .collect();
                let pool = pool.clone();
                in_flight.push_back(async move {
                    sqlx::query(
                        "UPDATE job_runs SET status = 'succeeded', finished_at = now() WHERE id = ANY($1)",
                    )
                    .bind(&ids)
                    .execute(&pool)
                    .await?;
                    anyhow::Ok(batch)
                });
            }
            Err(batch) => {
                // Batches finish in the order they were taken
                // (FuturesOrdered): the last tag of each acks every one
                // before it.
                if let Some(last) = batch.last() {
                    last.acker.ack(BasicAckOptions { multiple: true }).await?;
                }
                done += batch.len();
            }
        }
    }
    let elapsed = start.elapsed();
    let _ = conn.close(200, "done").await;
    Ok(elapsed)
}

/// `workers` belfry workers of one group until `n` runs succeeded; with
/// `limits` (a concurrency or rate limit), `noop` is registered under them.
async fn belfry(
    env: &TestEnv,
    n: usize,
    workers: usize,
    concurrency: usize,
    limits: Option<belfry_protocol::JobOptions>,
) -> anyhow::Result<Duration> {
    belfry_with(env, n, workers, concurrency, || {
        Ok(match &limits {
            None => Registry::builder().builtins(),
            Some(options) => {
                Registry::builder().job_with(belfry_worker::builtin::Noop, options.clone())
            }
        }
        .build()?)
    })
    .await
}

/// [`belfry`] with the workers' job types from `registry`: the time until
/// `n` runs succeeded.
pub(crate) async fn belfry_with(
    env: &TestEnv,
    n: usize,
    workers: usize,
    concurrency: usize,
    registry: impl Fn() -> anyhow::Result<Registry>,
) -> anyhow::Result<Duration> {
    let mut started = Vec::new();
    for i in 0..workers {
        let mut pairs = env.process_env();
        pairs.extend([
            ("BELFRY_INSTANCE".to_owned(), format!("bench-{i}")),
            ("BELFRY_PREFETCH".to_owned(), PREFETCH.to_string()),
            ("BELFRY_CONCURRENCY".to_owned(), concurrency.to_string()),
        ]);
        let config = WorkerConfig::from_settings(&Settings::from_pairs(pairs))?;
        let worker = Worker::start(&config, registry()?).await?;
        started.push(worker);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let start = Instant::now();
    let mut counters = Vec::new();
    let mut tasks = Vec::new();
    for w in started {
        counters.push(w.counters().clone());
        tasks.push(tokio::spawn(w.run(stop.clone())));
    }
    loop {
        let done: u64 = counters
            .iter()
            .map(|c| WorkerCounters::get(&c.succeeded))
            .sum();
        if done >= u64::try_from(n)? {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = start.elapsed();
    stop.cancel();
    for t in tasks {
        t.await??;
    }
    Ok(elapsed)
}

/// `n` jobs of `job_type` consumed by `run`, on a ledger that also has the
/// day partitions of `past_days` days before today (a fresh ledger has
/// today's and the next 3; a 30-day retention keeps about 30 more); with
/// `spread`, the jobs go round the three priorities (high, normal, low).
pub(crate) async fn scenario<F, Fut>(
    job_type: &str,
    payload: serde_json::Value,
    n: usize,
    past_days: u64,
    spread: bool,
    run: F,
) -> anyhow::Result<f64>
where
    F: FnOnce(Arc<TestEnv>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Duration>>,
{
    let env = Arc::new(TestEnv::new().await);
    let today = chrono::Utc::now().date_naive();
    let days: Vec<_> = (1..=past_days)
        .filter_map(|d| today.checked_sub_days(chrono::Days::new(d)))
        .collect();
    env.ledger.prepare_run_partitions(&days).await?;
    load(&env, n, job_type, payload, spread)
        .await
        .context("loading jobs")?;
    let elapsed = run(env.clone()).await?;
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM job_runs WHERE status = 'succeeded'")
            .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
            .await?;
    anyhow::ensure!(
        succeeded == i64::try_from(n)?,
        "{succeeded} of {n} runs succeeded"
    );
    if let Ok(env) = Arc::try_unwrap(env) {
        env.teardown(&["default"]).await;
    }
    Ok(n as f64 / elapsed.as_secs_f64())
}

/// The naive consume + `UPDATE` + ack loop over `n` noop jobs; jobs per
/// second.
pub(crate) async fn raw_consume(n: usize) -> anyhow::Result<f64> {
    scenario(
        "noop",
        serde_json::Value::Null,
        n,
        0,
        false,
        |env| async move { baseline(&env, n).await },
    )
    .await
}

/// One belfry scenario: `n` jobs of `job_type` with `payload`, consumed by
/// `count` workers of one group with `concurrency` each.
async fn workers(
    (job_type, payload): (&str, &serde_json::Value),
    n: usize,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    aged_workers((job_type, payload), n, count, concurrency, 0).await
}

/// [`workers`] on a ledger with `past_days` more day partitions.
async fn aged_workers(
    (job_type, payload): (&str, &serde_json::Value),
    n: usize,
    count: usize,
    concurrency: usize,
    past_days: u64,
) -> anyhow::Result<f64> {
    scenario(
        job_type,
        payload.clone(),
        n,
        past_days,
        false,
        |env| async move { belfry(&env, n, count, concurrency, None).await },
    )
    .await
}

/// Runs the benchmark and prints a markdown table.
pub async fn run(jobs: usize, sleep_jobs: usize, rounds: usize) -> anyhow::Result<()> {
    let rounds = rounds.max(1);
    let (mut base, mut one, mut three, mut s1, mut s3) = (vec![], vec![], vec![], vec![], vec![]);
    let mut batched = vec![];
    let mut aged = vec![];
    let mut limited = vec![];
    let mut rated = vec![];
    let mut spread = vec![];
    let (empty, nap) = (
        serde_json::json!({}),
        serde_json::json!({"duration_ms": 100}),
    );
    let (noop, sleep) = (("noop", &empty), ("sleep", &nap));
    for round in 1..=rounds {
        base.push(
            scenario("noop", empty.clone(), jobs, 0, false, |env| async move {
                baseline(&env, jobs).await
            })
            .await?,
        );
        batched.push(
            scenario("noop", empty.clone(), jobs, 0, false, |env| async move {
                batched_baseline(&env, jobs).await
            })
            .await?,
        );
        one.push(workers(noop, jobs, 1, CONCURRENCY).await?);
        aged.push(aged_workers(noop, jobs, 1, CONCURRENCY, AGED_DAYS).await?);
        // A limit as large as the worker's concurrency is never full: this
        // is the cost of the limited start itself (lock, count, start in
        // one transaction instead of a share of a batched statement).
        limited.push(
            scenario("noop", empty.clone(), jobs, 0, false, |env| async move {
                let options = belfry_protocol::JobOptions {
                    concurrency: Some(CONCURRENCY as u32),
                    ..Default::default()
                };
                belfry(&env, jobs, 1, CONCURRENCY, Some(options)).await
            })
            .await?,
        );
        // Likewise a rate limit far above what one worker starts (never
        // full): the window's log is written and counted at every start.
        rated.push(
            scenario("noop", empty.clone(), jobs, 0, false, |env| async move {
                let options = belfry_protocol::JobOptions {
                    rate_limit: Some(belfry_protocol::RateLimit::new(
                        belfry_protocol::rate_limit::MAX_RATE_STARTS,
                        Duration::from_secs(1),
                    )?),
                    ..Default::default()
                };
                belfry(&env, jobs, 1, CONCURRENCY, Some(options)).await
            })
            .await?,
        );
        // The same backlog spread over the three priorities: three queues
        // consumed at once, the highest ready first.
        spread.push(
            scenario("noop", empty.clone(), jobs, 0, true, |env| async move {
                belfry(&env, jobs, 1, CONCURRENCY, None).await
            })
            .await?,
        );
        three.push(workers(noop, jobs, 3, CONCURRENCY).await?);
        s1.push(workers(sleep, sleep_jobs, 1, SLEEP_CONCURRENCY).await?);
        s3.push(workers(sleep, sleep_jobs, 3, SLEEP_CONCURRENCY).await?);
        eprintln!(
            "round {round}: baseline {:.0}/s, batched {:.0}/s, 1 worker {:.0}/s (with {AGED_DAYS} days more of partitions {:.0}/s, with a concurrency limit {:.0}/s, with a rate limit {:.0}/s, spread over 3 priorities {:.0}/s), 3 workers {:.0}/s, sleep 1 worker {:.1}/s, sleep 3 workers {:.1}/s",
            base[round - 1], batched[round - 1], one[round - 1], aged[round - 1], limited[round - 1], rated[round - 1], spread[round - 1], three[round - 1], s1[round - 1], s3[round - 1]
        );
    }
    let (b, o, t, a, c) = (
        median(base),
        median(one),
        median(three),
        median(s1),
        median(s3),
    );
    println!("worker throughput, median of {rounds} rounds; prefetch {PREFETCH}");
    println!();
    println!("| scenario | jobs | concurrency per worker | jobs/s | ratio |");
    println!("| --- | ---: | ---: | ---: | --- |");
    println!(
        "| baseline: consume + 1 UPDATE + ack (noop) | {jobs} | {CONCURRENCY} | {b:.0} | 1.00 |"
    );
    let bb = median(batched);
    println!(
        "| batched: ready deliveries → 1 UPDATE + 1 multiple ack, {BATCHES_IN_FLIGHT} batches in flight (noop) | {jobs} | – | {bb:.0} | {:.2} × baseline |",
        bb / b
    );
    println!(
        "| belfry, 1 worker (noop) | {jobs} | {CONCURRENCY} | {o:.0} | {:.2} × baseline, {:.2} × batched |",
        o / b,
        o / bb
    );
    let g = median(aged);
    println!(
        "| belfry, 1 worker (noop), {AGED_DAYS} days more of run partitions | {jobs} | {CONCURRENCY} | {g:.0} | {:.2} × baseline, {:.2} × fresh ledger |",
        g / b,
        g / o
    );
    let l = median(limited);
    println!(
        "| belfry, 1 worker (noop) under a cluster-wide concurrency limit of {CONCURRENCY} (never full) | {jobs} | {CONCURRENCY} | {l:.0} | {:.2} × baseline, {:.2} × no limit |",
        l / b,
        l / o
    );
    let p = median(spread);
    println!(
        "| belfry, 1 worker (noop), the jobs spread over high / normal / low | {jobs} | {CONCURRENCY} | {p:.0} | {:.2} × baseline, {:.2} × one priority |",
        p / b,
        p / o
    );
    let r = median(rated);
    println!(
        "| belfry, 1 worker (noop) under a cluster-wide rate limit of {}/s (never full) | {jobs} | {CONCURRENCY} | {r:.0} | {:.2} × baseline, {:.2} × no limit |",
        belfry_protocol::rate_limit::MAX_RATE_STARTS,
        r / b,
        r / o
    );
    println!("| belfry, 3 workers of one group (noop) | {jobs} | {CONCURRENCY} | {t:.0} | {:.2} × baseline, {:.2} × batched |", t / b, t / bb);
    println!(
        "| belfry, 1 worker (sleep 100 ms) | {sleep_jobs} | {SLEEP_CONCURRENCY} | {a:.1} | 1.00 |"
    );
    println!("| belfry, 3 workers of one group (sleep 100 ms) | {sleep_jobs} | {SLEEP_CONCURRENCY} | {c:.1} | {:.2} × 1 worker |", c / a);
    Ok(())
}
