//! A million schedules across three replicas (issue 21): real
//! `belfry-scheduler` processes (this build's release binaries, default
//! settings, sharding on) and two real `belfry-worker` processes.
//!
//! `--schedules` cron schedules (1,000,000 by default) are written straight
//! into `schedules`, every one due at the same instant `T` (the "top of
//! the hour": a cron on `T`'s second, minute and hour), a little after the
//! replicas start. Measured:
//!
//! * load: from a replica's spawn to its last line saying how many
//!   schedules its timer holds ("scheduler replica running", "schedules of
//!   taken shards added"), once every schedule is in some replica's timer;
//! * memory: each process's resident set once loaded, and its peak after
//!   the burst (`VmRSS`, `VmHWM`);
//! * the burst: from `T` until every run is claimed, dispatched and
//!   `succeeded`, and the runs lost or doubled (must be 0);
//! * the raw limit in the same run: the batched raw claim-and-publish
//!   pipeline (no belfry code) and a naive consume + `UPDATE` + ack loop,
//!   each over `--raw` fires/jobs, and the time a million would take at
//!   their rates one after the other (their sum: the lower bound of a
//!   pipeline that shares two cores) and at the slower of the two (the
//!   bound if they overlapped perfectly).
//!
//! On a server with `autovacuum = off` (this machine's), the benchmark runs
//! `VACUUM (ANALYZE)` every minute in its place (see
//! [`crate::autovacuum_stand_in`]): belfry is measured as it runs on a
//! normally configured Postgres.
//!
//! The replicas' heartbeats are registered before they start, so each one's
//! first lease pass takes its third of the shards (as in a rolling restart
//! of a running cluster) instead of the first loading everything.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{SubsecRound, Timelike, Utc};

use belfry_testkit::TestEnv;

use crate::processes::{release_binary, Processes};

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn memory_mib(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| anyhow::anyhow!("no {name} for {pid}"))?;
        let kb: f64 = line
            .split_whitespace()
            .nth(1)
            .ok_or_else(|| anyhow::anyhow!("bad {name} line {line:?}"))?
            .parse()?;
        Ok(kb / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// `text` without the terminal colour codes of the processes' log lines.
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... m
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs the benchmark.
///
/// # Errors
///
/// When a service, a process or a statement fails.
pub async fn run(schedules: usize, raw: usize) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    env.declare_default_group(&["noop"]).await;
    let pool = env
        .ledger
        .pg_pool()
        .ok_or_else(|| anyhow::anyhow!("a Postgres ledger"))?
        .clone();
    // Far enough ahead to write the schedules and start every process.
    let lead = 60 + i64::try_from(schedules / 20_000)?;
    let at = Utc::now().trunc_subsecs(0) + chrono::Duration::seconds(lead);
    let cron = format!("{} {} {} * * *", at.second(), at.minute(), at.hour());
    let written = Instant::now();
    sqlx::query(
        "INSERT INTO schedules (name, cron, job_type) \
         SELECT 'm-' || g, $1, 'noop' FROM generate_series(1, $2::bigint) g",
    )
    .bind(&cron)
    .bind(i64::try_from(schedules)?)
    .execute(&pool)
    .await?;
    println!(
        "{schedules} schedules (cron \"{cron}\", UTC) written in {:.1} s; all due at {at}",
        written.elapsed().as_secs_f64()
    );
    // After the schedules are written: autovacuum would see them within a
    // minute, before the instant.
    let stand_in = crate::autovacuum_stand_in::start_if_off(&pool, Duration::from_secs(60)).await?;
    sqlx::query(
        "INSERT INTO scheduler_replicas (instance, expires_at) \
         SELECT 'm-s' || k, now() + interval '30 seconds' FROM generate_series(1, 3) k",
    )
    .execute(&pool)
    .await?;

    let dir = std::env::temp_dir().join(format!("belfry-million-{}", env.namespace));
    std::fs::create_dir_all(&dir)?;
    let scheduler = release_binary("belfry-scheduler")?;
    let worker = release_binary("belfry-worker")?;
    let mut procs = Processes(Vec::new());
    let mut spawned = Vec::new();
    for (bin, name) in [
        (&scheduler, "m-s1"),
        (&scheduler, "m-s2"),
        (&scheduler, "m-s3"),
        (&worker, "m-w1"),
        (&worker, "m-w2"),
    ] {
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let child = Command::new(bin)
            .envs(env.process_env())
            .env("BELFRY_INSTANCE", name)
            .env(
                "RUST_LOG",
                "warn,belfry_scheduler::replica::run_loop=info,belfry_scheduler::shard_lease=info",
            )
            // Logs go to stdout (errors of the start-up to stderr): both kept.
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        spawned.push(Instant::now());
        procs.0.push((name.to_owned(), child));
    }
    // Loaded: every schedule in some replica's timer. A replica logs its
    // timer's size when it starts ("scheduler replica running": the shards
    // its first lease pass took) and "schedules of taken shards added" with
    // a count each time a later pass takes more; its load time is when its
    // last such line appeared.
    let mut loaded = [(0.0_f64, 0_usize); 3];
    let deadline = Instant::now() + Duration::from_secs(u64::try_from(lead)?);
    while loaded.iter().map(|l| l.1).sum::<usize>() < schedules {
        for (i, slot) in loaded.iter_mut().enumerate() {
            let name = &procs.0[i].0;
            let text = without_colours(&std::fs::read_to_string(dir.join(format!("{name}.log")))?);
            let held: usize = text
                .lines()
                .filter(|l| {
                    l.contains("scheduler replica running")
                        || l.contains("schedules of taken shards added")
                })
                .filter_map(|l| {
                    l.split("schedules=")
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                        .and_then(|n| n.parse::<usize>().ok())
                })
                .sum();
            if held != slot.1 {
                *slot = (spawned[i].elapsed().as_secs_f64(), held);
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the replicas did not load within {lead} s: see {}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut rss_loaded = Vec::new();
    for (_, child) in &procs.0 {
        rss_loaded.push(memory_mib(child.id())?.0);
    }
    anyhow::ensure!(Utc::now() < at, "set-up took longer than the lead time");

    // The burst.
    let expected = i64::try_from(schedules)?;
    let (mut claimed_s, mut dispatched_s) = (None, None);
    // A million runs at the workers' pace on this machine (~600 jobs/s
    // for both with a million-row partition) take about half an hour.
    let limit = Instant::now() + Duration::from_secs(3600);
    let succeeded_s = loop {
        let (claimed, dispatched, succeeded): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), count(dispatched_at), count(*) FILTER (WHERE status = 'succeeded') \
             FROM job_runs WHERE key_instant = $1",
        )
        .bind(at)
        .fetch_one(&pool)
        .await?;
        let since = (Utc::now() - at).num_milliseconds() as f64 / 1000.0;
        if claimed >= expected && claimed_s.is_none() {
            claimed_s = Some(since);
        }
        if dispatched >= expected && dispatched_s.is_none() {
            dispatched_s = Some(since);
        }
        if succeeded >= expected {
            break since;
        }
        anyhow::ensure!(
            Instant::now() < limit,
            "{succeeded} of {expected} succeeded after 60 minutes ({claimed} claimed, {dispatched} dispatched); logs in {}",
            dir.display()
        );
        // Each poll reads the instant's partition (up to a million
        // rows): not more often than every two seconds.
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let succeeded_s = Some(succeeded_s);
    let mut peaks = Vec::new();
    for (_, child) in &procs.0 {
        peaks.push(memory_mib(child.id())?.1);
    }
    let (rows, distinct, skipped): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM job_runs WHERE scheduled_at = $1), \
                (SELECT count(DISTINCT job_name) FROM job_runs WHERE scheduled_at = $1), \
                (SELECT count(*) FROM skipped_fires WHERE scheduled_at = $1)",
    )
    .bind(at)
    .fetch_one(&pool)
    .await?;
    let procs_names: Vec<String> = procs.0.iter().map(|(n, _)| n.clone()).collect();
    drop(procs);
    let vacuumed = stand_in.as_ref().map(|s| s.passes.summary());
    drop(stand_in);
    // What the safety checks did during the burst, from each process's
    // log, before the logs go.
    let mut trips = Vec::new();
    for name in &procs_names {
        let text = without_colours(&std::fs::read_to_string(dir.join(format!("{name}.log")))?);
        let count = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
        trips.push(format!(
            "{name}: lease pass failed {}, took shards {}, timer stuck {}, follower behind {}, worker lease lapsed {}",
            count("shard lease pass failed"),
            count("took shards"),
            count("timer loop stuck"),
            count("owned shards are not loaded"),
            count("lease may have expired"),
        ));
    }
    env.teardown(&["default"]).await;
    let _ = std::fs::remove_dir_all(&dir);

    // The raw limit, same run.
    let raw_fires = crate::dispatch_burst::raw_batched(raw, 4)
        .await
        .context("raw batched pipeline")?;
    let raw_jobs = crate::worker_throughput::raw_consume(raw)
        .await
        .context("raw consume loop")?;

    println!();
    println!("| replica | schedules held | load time | memory once loaded | peak memory |");
    println!("|---|---:|---:|---:|---:|");
    for (i, (secs, count)) in loaded.iter().enumerate() {
        println!(
            "| scheduler {} | {count} | {secs:.1} s | {:.0} MiB | {:.0} MiB |",
            i + 1,
            rss_loaded[i],
            peaks[i]
        );
    }
    for i in 3..5 {
        println!(
            "| worker {} | - | - | {:.0} MiB | {:.0} MiB |",
            i - 2,
            rss_loaded[i],
            peaks[i]
        );
    }
    let m = schedules as f64;
    let seconds = |v: Option<f64>| v.map_or("-".to_owned(), |s| format!("{s:.0} s"));
    println!();
    println!(
        "burst of {schedules} at one instant: all claimed after {}, dispatched after {}, succeeded after {}; \
         {} runs for {} schedules (lost {}, doubled {}), {skipped} recorded skipped",
        seconds(claimed_s),
        seconds(dispatched_s),
        seconds(succeeded_s),
        rows,
        distinct,
        expected - distinct,
        rows - distinct
    );
    println!(
        "raw limit (same run, {raw} each): claim+publish {raw_fires:.0} fires/s, consume+UPDATE+ack {raw_jobs:.0} jobs/s; \
         {schedules} at those rates: {:.0} s in sequence, {:.0} s perfectly overlapped; belfry took {} ({:.2}x of the sequence)",
        m / raw_fires + m / raw_jobs,
        m / raw_fires.min(raw_jobs),
        seconds(succeeded_s),
        succeeded_s.map_or(f64::NAN, |s| (m / raw_fires + m / raw_jobs) / s)
    );
    if let Some(vacuumed) = vacuumed {
        println!("{vacuumed}");
    }
    println!();
    for line in trips {
        println!("{line}");
    }
    Ok(())
}
