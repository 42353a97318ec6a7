//! How exactly the cluster-wide limits hold (issue 22), with real
//! processes: one `belfry-scheduler` (its outbox publishes waiting runs
//! again) and three `belfry-worker` processes (this build's release
//! binaries, built-in job types, 8 handlers each).
//!
//! * **Concurrency:** `--runs` runs of `sleep` (400 ms) carrying
//!   `concurrency = 4`; once a few have succeeded, the worker running the
//!   most of them is killed with SIGKILL. The most handlers running at
//!   once is read two ways: from the attempts' own start and end instants
//!   (`attempt_log`; a killed attempt counts from the run's start to the
//!   kill), and from the ledger, sampled every 50 ms (runs `running` under
//!   a live lease). Neither may exceed 4. The workers run with
//!   `BELFRY_LEASE=4s`, so the killed worker's slots come back about 4 s
//!   after the kill (the default is 20 s).
//! * **Rate:** `50 × --seconds` `noop` runs carrying `rate_limit = 50/s`,
//!   all enqueued at once; their attempts' start instants are counted per
//!   second from the first start, and in every sliding one-second window.
//!
//! The baseline of the same run: the rate's own arithmetic (runs / 50 per
//! second) and, for the concurrency, the limit itself.

use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use belfry_ledger::{RunFilter, RunRecord};
use belfry_protocol::{JobOptions, RateLimit};
use belfry_testkit::TestEnv;

use crate::processes::{release_binary, Processes};

/// The limit the concurrency part runs under.
const CONCURRENCY: u32 = 4;
/// The rate the rate part runs under, per second.
const RATE: u32 = 50;

/// Starts the scheduler and three workers, logs in `dir`.
pub(crate) fn spawn(
    env: &TestEnv,
    dir: &std::path::Path,
    names: &[&str],
) -> anyhow::Result<Processes> {
    // No schedules: only the benchmark's runs (the default file's would
    // share the job types).
    let schedules = dir.join("schedules.toml");
    std::fs::write(&schedules, "# none\n")?;
    let mut procs = Processes(Vec::new());
    for name in names {
        let bin = if name.starts_with("s") {
            release_binary("belfry-scheduler")?
        } else {
            release_binary("belfry-worker")?
        };
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let child = Command::new(bin)
            .envs(env.process_env())
            .env("BELFRY_INSTANCE", name)
            .env("BELFRY_CONCURRENCY", "8")
            .env("BELFRY_LEASE", "4s")
            .env("BELFRY_SCHEDULES", &schedules)
            .env("RUST_LOG", "warn")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        procs.0.push(((*name).to_owned(), child));
    }
    Ok(procs)
}

/// Every run of the namespace.
async fn runs(env: &TestEnv) -> anyhow::Result<Vec<RunRecord>> {
    Ok(env
        .ledger
        .list_runs(&RunFilter::default(), None, i64::MAX)
        .await?)
}

/// Waits until `n` runs of `job_type` succeeded.
async fn until_succeeded(
    env: &TestEnv,
    pool: &sqlx::PgPool,
    job_type: &str,
    n: i64,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM job_runs WHERE job_type = $1 AND status = 'succeeded'",
        )
        .bind(job_type)
        .fetch_one(pool)
        .await?;
        if done >= n {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{done} of {n} {job_type} runs succeeded within {within:?} (namespace {})",
            env.namespace
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The most intervals open at once (an end and a start at the same
/// instant do not overlap).
fn most_at_once(intervals: &[(DateTime<Utc>, DateTime<Utc>)]) -> usize {
    let mut edges: Vec<(DateTime<Utc>, i32)> = intervals
        .iter()
        .flat_map(|(a, b)| [(*a, 1), (*b, -1)])
        .collect();
    edges.sort();
    let (mut open, mut most) = (0_i32, 0_i32);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    usize::try_from(most).unwrap_or(0)
}

/// Runs both parts and prints their lines for BENCHMARKS.md.
///
/// # Errors
///
/// When a service or a process fails, or the runs do not finish in time.
pub async fn run(count: usize, seconds: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        count > 0 && seconds > 0,
        "--runs and --seconds must be at least 1"
    );
    let env = TestEnv::new().await;
    env.declare_default_group(&["noop", "sleep", "http"]).await;
    let pool = env
        .ledger
        .pg_pool()
        .ok_or_else(|| anyhow::anyhow!("a Postgres ledger"))?
        .clone();
    let dir = std::env::temp_dir().join(format!("belfry-limits-{}", env.namespace));
    std::fs::create_dir_all(&dir)?;
    let mut procs = spawn(&env, &dir, &["s1", "w1", "w2", "w3"])?;
    let at = Utc::now();

    // Concurrency, through a kill -9.
    let limited = JobOptions {
        concurrency: Some(CONCURRENCY),
        ..JobOptions::default()
    };
    for i in 0..count {
        env.enqueue_with(
            &format!("c{i}"),
            "sleep",
            serde_json::json!({"duration_ms": 400}),
            at,
            limited.clone(),
        )
        .await;
    }
    let sampler = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut most = 0_i64;
            let deadline = Instant::now() + Duration::from_secs(300);
            while Instant::now() < deadline {
                let (running, left): (i64, i64) = sqlx::query_as(
                    "SELECT count(*) FILTER (WHERE status = 'running' AND lease_until > now()), \
                            count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'dead')) \
                     FROM job_runs WHERE job_type = 'sleep'",
                )
                .fetch_one(&pool)
                .await?;
                most = most.max(running);
                if left == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(most)
        })
    };
    until_succeeded(&env, &pool, "sleep", 8, Duration::from_secs(60)).await?;
    // The victim: the worker holding the most slots at a moment when some
    // are held (between waves every run may be waiting).
    let deadline = Instant::now() + Duration::from_secs(30);
    let (victim, held) = loop {
        let holders: Vec<(String, i64)> = sqlx::query_as(
            "SELECT worker, count(*) FROM job_runs WHERE job_type = 'sleep' AND status = 'running' \
             GROUP BY worker ORDER BY count(*) DESC, worker",
        )
        .fetch_all(&pool)
        .await?;
        if let Some(first) = holders.first() {
            break first.clone();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no worker was running a limited run for 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let killed_at = Utc::now();
    if let Some((_, child)) = procs.0.iter_mut().find(|(n, _)| *n == victim) {
        // SIGKILL: no drain, no hand-back; its slots end with its leases.
        child.kill()?;
        child.wait()?;
    }
    until_succeeded(
        &env,
        &pool,
        "sleep",
        i64::try_from(count)?,
        Duration::from_secs(240),
    )
    .await?;
    let ledger_most = sampler.await??;
    let sleeps: Vec<RunRecord> = runs(&env)
        .await?
        .into_iter()
        .filter(|r| r.job_type == "sleep")
        .collect();
    let mut intervals = Vec::new();
    let mut retaken = Vec::new();
    for r in &sleeps {
        let entries = r.attempt_entries()?;
        for e in &entries {
            intervals.push((e.started_at, e.finished_at));
        }
        if usize::try_from(r.attempts)? > entries.len() {
            // The killed attempt: from the run's first start to the kill.
            if let Some(started) = r.started_at {
                intervals.push((started, killed_at));
            }
            if let Some(last) = entries.last() {
                retaken.push((last.started_at - killed_at).num_milliseconds() as f64 / 1000.0);
            }
        }
    }
    let seen_most = most_at_once(&intervals);
    let took = sleeps
        .iter()
        .filter_map(|r| r.finished_at)
        .max()
        .map(|t| (t - at).num_milliseconds() as f64 / 1000.0)
        .unwrap_or(0.0);
    retaken.sort_by(f64::total_cmp);
    println!(
        "concurrency = {CONCURRENCY}, 3 worker processes x 8 handlers, {count} sleep(400 ms) runs: \
         most running at once {seen_most} by the attempts' instants, {ledger_most} by the ledger \
         (sampled every 50 ms); {victim} killed -9 holding {held} slot(s) after 8 succeeded; \
         its runs started again {} s after the kill (lease 4 s); all {} succeeded after {took:.1} s \
         (the limit's own bound: {:.1} s)",
        retaken
            .iter()
            .map(|s| format!("{s:.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        sleeps.len(),
        count as f64 * 0.4 / f64::from(CONCURRENCY)
    );
    anyhow::ensure!(
        seen_most <= CONCURRENCY as usize && ledger_most <= i64::from(CONCURRENCY),
        "the limit of {CONCURRENCY} was exceeded: {seen_most} / {ledger_most}"
    );

    // Rate: the killed worker is back first, so three workers share it.
    let mut again = spawn(&env, &dir, &[victim.as_str()])?;
    procs.0.append(&mut again.0);
    let rated = JobOptions {
        rate_limit: Some(RateLimit::new(RATE, Duration::from_secs(1))?),
        ..JobOptions::default()
    };
    let n = usize::try_from(RATE)? * seconds;
    let enqueued = Instant::now();
    for i in 0..n {
        env.enqueue_with(
            &format!("r{i}"),
            "noop",
            serde_json::Value::Null,
            at,
            rated.clone(),
        )
        .await;
    }
    let enqueue_s = enqueued.elapsed().as_secs_f64();
    until_succeeded(
        &env,
        &pool,
        "noop",
        i64::try_from(n)?,
        Duration::from_secs(u64::try_from(seconds)? * 4 + 60),
    )
    .await?;
    drop(procs);
    let mut starts: Vec<DateTime<Utc>> = Vec::new();
    // The ledger's own start instants (a limited start stamps the run's
    // first start under the key's lock, as the window's log).
    let mut logged: Vec<DateTime<Utc>> = Vec::new();
    for r in runs(&env)
        .await?
        .into_iter()
        .filter(|r| r.job_type == "noop")
    {
        starts.extend(r.attempt_entries()?.iter().map(|e| e.started_at));
        logged.extend(r.started_at);
    }
    starts.sort();
    logged.sort();
    let first = *starts
        .first()
        .ok_or_else(|| anyhow::anyhow!("no rated run started"))?;
    let last = *starts.last().unwrap_or(&first);
    let span = (last - first).num_milliseconds() as f64 / 1000.0;
    let mut per_second = vec![0_usize; seconds];
    for s in &starts {
        let i = usize::try_from((*s - first).num_milliseconds() / 1000)?;
        if let Some(b) = per_second.get_mut(i) {
            *b += 1;
        }
    }
    let sliding_most = |starts: &[DateTime<Utc>]| {
        starts
            .iter()
            .enumerate()
            .map(|(i, s)| {
                starts[i..]
                    .iter()
                    .take_while(|t| **t - *s < chrono::Duration::seconds(1))
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    let (ledger_most, sliding_most) = (sliding_most(&logged), sliding_most(&starts));
    let mut sorted = per_second.clone();
    sorted.sort_unstable();
    let mean = per_second.iter().sum::<usize>() as f64 / seconds as f64;
    println!(
        "rate_limit = {RATE}/s, 3 worker processes, {n} noop runs enqueued in {enqueue_s:.1} s: \
         starts per second over the first {seconds} s from the first start: mean {mean:.1}, \
         min {}, median {}, max {}; most in any sliding second {ledger_most} by the ledger's start \
         instants, {sliding_most} by the workers' clocks; all started within {span:.1} s (the rate's own bound: {:.1} s, ratio {:.2} x)",
        sorted.first().copied().unwrap_or(0),
        sorted[sorted.len() / 2],
        sorted.last().copied().unwrap_or(0),
        (n as f64 - f64::from(RATE)) / f64::from(RATE),
        ((n as f64 - f64::from(RATE)) / f64::from(RATE)) / span.max(0.001),
    );
    println!("per second: {per_second:?}");
    println!("logs: {}", dir.display());
    env.teardown(&["default"]).await;
    Ok(())
}
