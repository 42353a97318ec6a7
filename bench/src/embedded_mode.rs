//! Embedded mode beside the distributed mode: the same replica and worker
//! code, one process, on SQLite and its job queue versus Postgres,
//! RabbitMQ and Redis. The distributed mode, measured in the same run, is
//! the baseline.
//!
//! - **fires/s**: `fires` one-shot schedules due at the same second, one
//!   replica; from the instant to the last run confirmed by the broker
//!   (`dispatched_at`).
//! - **noop jobs/s**: `jobs` claimed runs and their messages loaded before
//!   the clock starts, one worker (prefetch 64, concurrency 32) until all
//!   succeeded.
//!
//! Rounds alternate the modes; the median round is reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{SubsecRound, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use belfry_broker::Broker;
use belfry_ledger::{Ledger, NewRun, RunFilter, RunStatus};
use belfry_protocol::{run_key, ScheduleSpec};
use belfry_runtime::{Settings, SystemClock};
use belfry_scheduler::{ClaimLock, Replica, ReplicaTiming, Schedule, Timer};
use belfry_testkit::{amqp_url, redis_url, TestEnv};
use belfry_worker::{Registry, Worker, WorkerConfig, WorkerCounters};

use crate::sample::median;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Distributed,
    Embedded,
}

impl Mode {
    async fn env(self) -> TestEnv {
        match self {
            Mode::Distributed => TestEnv::new().await,
            Mode::Embedded => TestEnv::embedded().await,
        }
    }
}

/// A replica with the connections its mode gives a real process.
async fn replica(env: &TestEnv, mode: Mode) -> anyhow::Result<Replica> {
    let timing = ReplicaTiming::default();
    Ok(match mode {
        Mode::Embedded => Replica::new(
            "bench",
            None,
            env.ledger.clone(),
            env.broker.clone(),
            timing,
        ),
        Mode::Distributed => Replica::new(
            "bench",
            Some(ClaimLock::new(
                &redis_url(),
                env.topology.clone(),
                "bench",
                Duration::from_secs(60),
            )?),
            Ledger::connect(&env.database_url, 8).await?,
            Broker::connect(&amqp_url(), env.topology.clone(), "bench").await?,
            timing,
        ),
    })
}

async fn count(env: &TestEnv, status: RunStatus) -> anyhow::Result<i64> {
    Ok(env
        .ledger
        .count_by_status()
        .await?
        .get(status.as_str())
        .copied()
        .unwrap_or(0))
}

/// Fires per second of a burst of `n` fires due at one instant.
async fn fires(mode: Mode, n: usize) -> anyhow::Result<f64> {
    let env = mode.env().await;
    env.broker.declare_group("bench", &["noop"]).await?;
    let at = Utc::now().trunc_subsecs(0) + chrono::Duration::seconds(3);
    let schedules = (0..n)
        .map(|i| {
            Ok(Arc::new(Schedule::from_spec(&ScheduleSpec {
                name: format!("burst-{i}"),
                at: Some(at.to_rfc3339()),
                job_type: "noop".into(),
                ..Default::default()
            })?))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let replica = Arc::new(replica(&env, mode).await?);
    let cancel = CancellationToken::new();
    let timer = Timer::new(schedules, Utc::now());
    let task = tokio::spawn(replica.run(timer, Arc::new(SystemClock), cancel.clone()));
    anyhow::ensure!(Utc::now() < at, "set-up took longer than the lead time");
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(&env, RunStatus::Dispatched).await? < i64::try_from(n)? {
        anyhow::ensure!(Instant::now() < deadline, "burst not dispatched in 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    task.await.context("replica task")?;
    let runs = env
        .ledger
        .list_runs(&RunFilter::default(), None, i64::try_from(n)? + 1)
        .await?;
    anyhow::ensure!(runs.len() == n, "{} runs for {n} fires", runs.len());
    let last = runs
        .iter()
        .filter_map(|r| r.dispatched_at)
        .max()
        .context("no dispatch recorded")?;
    let took = (last - at).to_std().unwrap_or(Duration::from_millis(1));
    env.teardown(&["bench"]).await;
    Ok(n as f64 / took.as_secs_f64().max(1e-3))
}

/// `noop` jobs per second through one worker, `n` loaded beforehand.
async fn jobs(mode: Mode, n: usize) -> anyhow::Result<f64> {
    let env = mode.env().await;
    let mut pairs = env.process_env();
    pairs.extend([
        ("BELFRY_INSTANCE".to_owned(), "bench-worker".to_owned()),
        ("BELFRY_PREFETCH".to_owned(), "64".to_owned()),
        ("BELFRY_CONCURRENCY".to_owned(), "32".to_owned()),
    ]);
    let config = WorkerConfig::from_settings(&Settings::from_pairs(pairs))?;
    let registry = Registry::builder().builtins().build()?;
    let worker = match mode {
        Mode::Embedded => {
            Worker::start_on(&config, registry, env.ledger.clone(), env.broker.clone()).await?
        }
        Mode::Distributed => Worker::start(&config, registry).await?,
    };
    // Loaded before the clock starts: claimed rows, then their messages.
    let base = Utc::now();
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        let at = base + chrono::Duration::seconds(i64::try_from(i)?);
        runs.push(NewRun {
            id: Uuid::now_v7(),
            job_name: "bench".into(),
            run_key: run_key("bench", at)?,
            job_type: "noop".into(),
            payload: serde_json::json!({}),
            scheduled_at: at,
            claimed_by: "bench".into(),
            trace_id: None,
            traceparent: None,
            options: Default::default(),
            next_dispatch_at: base + chrono::Duration::hours(1),
        });
    }
    let publisher = env.broker.publisher().await?;
    for chunk in runs.chunks(256) {
        env.ledger.claim_many(chunk).await?;
        let messages: Vec<_> = chunk.iter().map(NewRun::to_message).collect();
        for answer in publisher.publish_many(&messages).await {
            anyhow::ensure!(
                matches!(answer?, belfry_broker::PublishOutcome::Confirmed),
                "load publish not confirmed"
            );
        }
    }
    let counters = worker.counters().clone();
    let stop = CancellationToken::new();
    let start = Instant::now();
    let task = tokio::spawn(worker.run(stop.clone()));
    while WorkerCounters::get(&counters.succeeded) < u64::try_from(n)? {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(300),
            "jobs not done in 300 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = start.elapsed();
    stop.cancel();
    task.await??;
    anyhow::ensure!(
        count(&env, RunStatus::Succeeded).await? == i64::try_from(n)?,
        "not every run is recorded succeeded"
    );
    env.teardown(&["default"]).await;
    Ok(n as f64 / elapsed.as_secs_f64())
}

/// Runs the comparison and prints a markdown table.
pub async fn run(fire_count: usize, job_count: usize, rounds: usize) -> anyhow::Result<()> {
    let rounds = rounds.max(1);
    let (mut df, mut ef, mut dj, mut ej) = (vec![], vec![], vec![], vec![]);
    for round in 1..=rounds {
        df.push(fires(Mode::Distributed, fire_count).await?);
        ef.push(fires(Mode::Embedded, fire_count).await?);
        dj.push(jobs(Mode::Distributed, job_count).await?);
        ej.push(jobs(Mode::Embedded, job_count).await?);
        eprintln!(
            "round {round}: fires/s distributed {:.0} embedded {:.0}; noop jobs/s distributed {:.0} embedded {:.0}",
            df[round - 1],
            ef[round - 1],
            dj[round - 1],
            ej[round - 1]
        );
    }
    let (df, ef, dj, ej) = (median(df), median(ef), median(dj), median(ej));
    println!("| measure | distributed (baseline) | embedded | embedded / distributed |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| fires/s, burst of {fire_count}, 1 replica | {df:.0} | {ef:.0} | {:.2} |",
        ef / df
    );
    println!(
        "| noop jobs/s, {job_count} jobs, 1 worker | {dj:.0} | {ej:.0} | {:.2} |",
        ej / dj
    );
    Ok(())
}
