//! How soon a follow-up starts after its parent ends (issue 22), with real
//! processes: one `belfry-scheduler` (its reconcile loop runs the
//! follow-up pass, then the outbox, every `BELFRY_RECONCILE_INTERVAL`,
//! default 1 s) and one `belfry-worker` (this build's release binaries).
//!
//! * **Follow-ups:** `--runs` `noop` parents, each with an `on_success`
//!   `noop` child, enqueued 10 ms apart; the latency of each child is its
//!   first start minus its parent's end, both the database's instants.
//! * **Chain:** one parent with follow-ups nested `--depth` deep (each
//!   child's `on_success` is the next): the time from the first end to the
//!   last start, per link.
//! * **Baseline, same run:** `--runs` delayed `noop` runs, due 10 ms apart,
//!   left to the same outbox (no follow-up pass involved): the latency of
//!   each is its first start minus the instant it came due. A follow-up
//!   takes the outbox's path after the pass, so the two should be alike.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use belfry_ledger::{NewRun, RunFilter, RunRecord};
use belfry_protocol::{FollowUp, FollowUps, JobOptions};
use belfry_testkit::TestEnv;

use crate::limit_accuracy::spawn;
use crate::sample::spread;

/// `options` with `on_success` = `child`.
fn then(child: FollowUp) -> JobOptions {
    JobOptions {
        follow_ups: FollowUps {
            on_success: vec![child],
            ..FollowUps::default()
        },
        ..JobOptions::default()
    }
}

/// A `noop` follow-up named `name`, with `options`.
fn noop(name: &str, options: JobOptions) -> FollowUp {
    FollowUp {
        job_name: name.into(),
        job_type: "noop".into(),
        options,
        ..FollowUp::default()
    }
}

fn ms(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(0) as f64 / 1000.0
}

/// Runs the three parts and prints their lines for BENCHMARKS.md.
///
/// # Errors
///
/// When a service or a process fails, or the runs do not finish in time.
pub async fn run(count: usize, depth: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        count > 0 && (1..=belfry_protocol::follow_up::MAX_DEPTH).contains(&depth),
        "--runs must be at least 1 and --depth 1 to {}",
        belfry_protocol::follow_up::MAX_DEPTH
    );
    let env = TestEnv::new().await;
    env.declare_default_group(&["noop"]).await;
    let dir = std::env::temp_dir().join(format!("belfry-follow-ups-{}", env.namespace));
    std::fs::create_dir_all(&dir)?;
    let procs = spawn(&env, &dir, &["s1", "w1"])?;
    let start = Utc::now();

    // The baseline's delayed runs, due 10 ms apart from 2 s on, beside the
    // parents (enqueued 10 ms apart from now), so both share the machine.
    let due0 = start + chrono::Duration::seconds(2);
    let mut due = Vec::with_capacity(count);
    for i in 0..count {
        let at = due0 + chrono::Duration::milliseconds(10 * i64::try_from(i)?);
        let run = NewRun {
            id: Uuid::now_v7(),
            job_name: format!("d{i}"),
            run_key: belfry_protocol::run_key(&format!("d{i}"), start)?,
            job_type: "noop".into(),
            payload: serde_json::Value::Null,
            scheduled_at: at,
            claimed_by: "bench".into(),
            trace_id: None,
            traceparent: None,
            options: JobOptions::default(),
            next_dispatch_at: at,
        };
        anyhow::ensure!(env.ledger.claim(&run).await?, "d{i} already claimed");
        due.push((format!("d{i}"), at));
    }
    for i in 0..count {
        env.enqueue_with(
            &format!("p{i}"),
            "noop",
            serde_json::Value::Null,
            start,
            then(noop(&format!("f{i}"), JobOptions::default())),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut chain = JobOptions::default();
    for link in (1..=depth).rev() {
        chain = then(noop(&format!("c{link}"), chain));
    }
    env.enqueue_with("c0", "noop", serde_json::Value::Null, start, chain)
        .await;

    let expected = 3 * count + depth + 1;
    let deadline = Instant::now() + Duration::from_secs(120 + 2 * u64::try_from(depth)?);
    let runs: Vec<RunRecord> = loop {
        let runs = env
            .ledger
            .list_runs(&RunFilter::default(), None, i64::MAX)
            .await?;
        let done = runs.iter().filter(|r| r.status_text == "succeeded").count();
        if done >= expected {
            break runs;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{done} of {expected} runs succeeded in time (namespace {})",
            env.namespace
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drop(procs);
    let by_name = |name: &str| runs.iter().find(|r| r.job_name == name);
    let mut follow = Vec::with_capacity(count);
    for i in 0..count {
        let (Some(p), Some(f)) = (by_name(&format!("p{i}")), by_name(&format!("f{i}"))) else {
            anyhow::bail!("p{i} or its follow-up f{i} is missing");
        };
        if let (Some(end), Some(started)) = (p.finished_at, f.started_at) {
            follow.push(ms(end, started));
        }
    }
    let mut delayed = Vec::with_capacity(count);
    for (name, at) in &due {
        if let Some(started) = by_name(name).and_then(|r| r.started_at) {
            delayed.push(ms(*at, started));
        }
    }
    let (Some(first), Some(last)) = (
        by_name("c0").and_then(|r| r.finished_at),
        by_name(&format!("c{depth}")).and_then(|r| r.started_at),
    ) else {
        anyhow::bail!("the chain did not run to its end");
    };
    let (f50, f99, fmax) = spread(follow);
    let (d50, d99, dmax) = spread(delayed);
    println!(
        "follow-ups, {count} noop parents (1 scheduler, 1 worker, reconcile interval 1 s): \
         parent end -> child start p50 {f50:.0} ms, p99 {f99:.0} ms, max {fmax:.0} ms; \
         same run, {count} delayed runs through the same outbox (due -> start): \
         p50 {d50:.0} ms, p99 {d99:.0} ms, max {dmax:.0} ms; ratio of medians {:.2}",
        f50 / d50
    );
    println!(
        "chain of {depth} follow-ups: first end -> last start {:.1} s, {:.0} ms per link",
        ms(first, last) / 1000.0,
        ms(first, last) / depth as f64
    );
    Ok(())
}
