//! Run logs (issue 23): what writing them costs a worker, and how soon a
//! line reaches a client following the run's log.
//!
//! - **Cost.** `noop` jobs through one belfry worker whose handler writes
//!   10 log lines per run, next to the same worker and backlog with the
//!   built-in `noop` (no lines), rounds alternated, medians. Both clocks
//!   are the same: from before the worker starts until every run succeeded,
//!   the worker stopped *and* every line is stored (the writer works after
//!   the outcome), so the ratio carries the whole cost and nothing else.
//!   A third scenario writes the same 10 lines as `tracing` events that
//!   the job type captures (`capture_tracing`), through the same
//!   subscriber the three scenarios share (the registry and the capture
//!   layer, INFO, no output).
//! - **Tail latency.** A handler writes a line every 20 ms carrying the
//!   instant it was written; a client follows `/v1/runs/{id}/logs/stream`
//!   of a real API and records when each line arrives: `ctx.log` to the
//!   client, p50 / p99 / max.

use std::time::{Duration, Instant};

use belfry_testkit::TestEnv;
use belfry_worker::{Job, JobContext, JobError, Registry};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::sample::{median, spread};
use crate::worker_throughput::{belfry_with, scenario, CONCURRENCY};

/// Lines per run in the cost scenario.
const LINES: u64 = 10;

/// A noop that writes [`LINES`] lines (with a field) first.
#[derive(Clone, Default)]
struct Chatty;

impl Job for Chatty {
    const TYPE: &'static str = "chatty";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        for i in 0..LINES {
            ctx.log_with(
                tracing::Level::INFO,
                "step done",
                serde_json::json!({"step": i}),
            );
        }
        Ok(())
    }
}

/// A noop that emits [`LINES`] `tracing` events (with a field) first; its
/// type captures them into the run's log.
#[derive(Clone, Default)]
struct Traced;

impl Job for Traced {
    const TYPE: &'static str = "traced";
    type Payload = serde_json::Value;
    async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        for i in 0..LINES {
            tracing::info!(step = i, "step done");
        }
        Ok(())
    }
}

/// Writes `lines` lines 20 ms apart, each carrying the instant it was
/// written (RFC 3339).
#[derive(Clone, Default)]
struct Ticker;

impl Job for Ticker {
    const TYPE: &'static str = "ticker";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, p: serde_json::Value) -> Result<(), JobError> {
        for _ in 0..p["lines"].as_u64().unwrap_or(0) {
            ctx.log(tracing::Level::INFO, Utc::now().to_rfc3339());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

/// How long `n` runs take through one worker of `registry`, from before
/// the worker starts until it stopped and `lines` lines a run are stored:
/// the one clock of both scenarios.
async fn until_stored(
    env: &TestEnv,
    n: usize,
    lines: u64,
    registry: impl Fn() -> anyhow::Result<Registry>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    belfry_with(env, n, 1, CONCURRENCY, registry).await?;
    let pool = env.ledger.pg_pool().expect("a Postgres ledger");
    let want = i64::try_from(n)? * i64::try_from(lines)?;
    loop {
        let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM run_logs")
            .fetch_one(pool)
            .await?;
        if stored >= want {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(600),
            "{stored} of {want} lines stored"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `ctx.log` to a stream client, in milliseconds, for `lines` lines.
async fn tail_latency(lines: u64) -> anyhow::Result<Vec<f64>> {
    let env = TestEnv::new().await;
    env.declare_default_group(&["ticker"]).await;
    let stop = CancellationToken::new();
    let addr = crate::ui_pages::serve_api(&env, "bench-logs", &stop).await?;
    let mut pairs = env.process_env();
    pairs.push(("BELFRY_INSTANCE".into(), "bench-logs-w".into()));
    let config =
        belfry_worker::WorkerConfig::from_settings(&belfry_runtime::Settings::from_pairs(pairs))?;
    let worker =
        belfry_worker::Worker::start(&config, Registry::builder().job(Ticker).build()?).await?;
    let worker = tokio::spawn(worker.run(stop.clone()));
    let m = env
        .enqueue(
            "ticker",
            "ticker",
            serde_json::json!({"lines": lines}),
            Utc::now(),
        )
        .await;
    let mut resp = reqwest::Client::new()
        .get(format!(
            "http://{addr}/v1/runs/{}/logs/stream",
            m.message_id
        ))
        .send()
        .await?;
    let (mut buf, mut latencies) = (String::new(), Vec::new());
    'read: while let Some(chunk) =
        tokio::time::timeout(Duration::from_secs(60), resp.chunk()).await??
    {
        let arrived = Utc::now();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find("\n\n") {
            let event: String = buf.drain(..i + 2).collect();
            if event.contains("event: end") || event.contains("event:end") {
                break 'read;
            }
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) else {
                continue;
            };
            let line: serde_json::Value = serde_json::from_str(data.trim())?;
            let written: DateTime<Utc> = line["message"].as_str().unwrap_or_default().parse()?;
            latencies.push((arrived - written).num_microseconds().unwrap_or(0) as f64 / 1000.0);
        }
    }
    stop.cancel();
    worker.await??;
    anyhow::ensure!(
        latencies.len() == usize::try_from(lines)?,
        "{} of {lines} lines arrived",
        latencies.len()
    );
    env.teardown(&["default"]).await;
    Ok(latencies)
}

/// One round of one scenario: `jobs` runs of `job_type` on a fresh
/// database through one worker of `registry`, `lines` lines a run (jobs/s,
/// by [`until_stored`]'s clock).
async fn round_of(
    job_type: &str,
    jobs: usize,
    lines: u64,
    registry: fn() -> anyhow::Result<Registry>,
) -> anyhow::Result<f64> {
    scenario(
        job_type,
        serde_json::json!({}),
        jobs,
        0,
        false,
        |env| async move { until_stored(&env, jobs, lines, registry).await },
    )
    .await
}

/// The baseline: the built-in `noop`, no lines.
fn quiet_registry() -> anyhow::Result<Registry> {
    Ok(Registry::builder().builtins().build()?)
}

/// [`Chatty`]: 10 `ctx.log_with` lines a run.
fn chatty_registry() -> anyhow::Result<Registry> {
    Ok(Registry::builder().job(Chatty).build()?)
}

/// [`Traced`]: 10 captured `tracing` events a run.
fn traced_registry() -> anyhow::Result<Registry> {
    Ok(Registry::builder()
        .job(Traced)
        .capture_tracing::<Traced>(tracing::Level::INFO)
        .build()?)
}

/// Runs both measurements and prints a markdown table.
pub async fn run(jobs: usize, rounds: usize, lines: u64) -> anyhow::Result<()> {
    {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        // What a worker process has (its log output left out): the
        // registry, INFO, the capture layer; for every scenario alike.
        tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::INFO)
            .with(belfry_worker::RunLogCapture::layer())
            .try_init()?;
    }
    let (mut quiet, mut logging, mut traced) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds.max(1) {
        quiet.push(round_of("noop", jobs, 0, quiet_registry).await?);
        logging.push(round_of("chatty", jobs, LINES, chatty_registry).await?);
        traced.push(round_of("traced", jobs, LINES, traced_registry).await?);
        eprintln!(
            "round {round}: no lines {:.0} jobs/s, {LINES} lines a run {:.0} jobs/s, {LINES} captured events a run {:.0} jobs/s",
            quiet[round - 1],
            logging[round - 1],
            traced[round - 1]
        );
    }
    let (q, l, t) = (median(quiet), median(logging), median(traced));
    let (p50, p99, max) = spread(tail_latency(lines).await?);
    println!(
        "run logs, median of {} rounds, 1 worker, concurrency {CONCURRENCY}",
        rounds.max(1)
    );
    println!();
    println!("| scenario | jobs | jobs/s | ratio |");
    println!("| --- | ---: | ---: | --- |");
    println!("| belfry, noop, no log lines (baseline) | {jobs} | {q:.0} | 1.00 |");
    println!(
        "| belfry, {LINES} log lines a run (until every line is stored) | {jobs} | {l:.0} | {:.2} × baseline ({:.0} % cost) |",
        l / q,
        (1.0 - l / q) * 100.0
    );
    println!(
        "| belfry, {LINES} tracing events a run, captured (until every line is stored) | {jobs} | {t:.0} | {:.2} × baseline ({:.0} % cost) |",
        t / q,
        (1.0 - t / q) * 100.0
    );
    println!();
    println!(
        "tail latency, ctx.log to a client of /v1/runs/{{id}}/logs/stream, {lines} lines: p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms"
    );
    Ok(())
}
