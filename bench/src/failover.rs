//! Failover with sharding (issue 21): three real `belfry-scheduler`
//! processes (this build's release binaries) share `--schedules` schedules
//! firing every second (`misfire = "catch_up"`); the one holding the most
//! shards is killed with SIGKILL. Measured from the kill: how long until
//! another replica claims a fire of the dead one's schedules (the lease
//! TTL plus a pass, `BELFRY_SHARD_LEASE_TTL` = 5 s by default), how late
//! the last of its missed instants was made, and over the whole window the
//! instants without a run (lost) and instants with more than one (must be
//! 0: the unique key). Baseline in the same run: the same instants' claim
//! lateness before the kill.

use std::process::{Command, Stdio};

use crate::processes::Processes;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};

use belfry_testkit::TestEnv;

/// One round's numbers.
struct Round {
    victim_shards: usize,
    victim_schedules: usize,
    resumed_s: f64,
    caught_up_s: f64,
    lateness_before_ms: f64,
    lost: i64,
    duplicates: i64,
}

async fn one_round(schedules: usize) -> anyhow::Result<Round> {
    let env = TestEnv::new().await;
    env.broker.declare_group("bench", &["noop"]).await?;
    let dir = std::env::temp_dir().join(format!("belfry-failover-{}", env.namespace));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("schedules.toml");
    let mut text = String::new();
    for i in 0..schedules {
        text.push_str(&format!(
            "[[schedule]]\nname = \"f-{i}\"\nevery = \"1s\"\njob_type = \"noop\"\n\
             misfire = \"catch_up\"\ncatch_up_window = \"10m\"\ncatch_up_max = 1000\n"
        ));
    }
    std::fs::write(&file, text)?;
    let bin = crate::processes::release_binary("belfry-scheduler")?;
    let mut procs = Processes(Vec::new());
    for k in 1..=3 {
        let name = format!("fo-{k}");
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let child = Command::new(&bin)
            .envs(env.process_env())
            .env("BELFRY_INSTANCE", &name)
            .env("BELFRY_SCHEDULES", &file)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        procs.0.push((name, child));
    }
    let pool = env
        .ledger
        .pg_pool()
        .ok_or_else(|| anyhow::anyhow!("a Postgres ledger"))?
        .clone();
    // Settled: three owners, and fires flowing for a few seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let owners: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT owner) FROM shard_leases WHERE expires_at > now()",
        )
        .fetch_one(&pool)
        .await?;
        if owners == 3 {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "replicas never shared the shards"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let window_start = Utc::now().trunc_subsecs(0) - chrono::Duration::seconds(3);
    let (victim, shards): (String, i64) = sqlx::query_as(
        "SELECT owner, count(*) FROM shard_leases WHERE expires_at > now() \
         GROUP BY owner ORDER BY count(*) DESC, owner LIMIT 1",
    )
    .fetch_one(&pool)
    .await?;
    let victim_shards: Vec<i32> = sqlx::query_scalar(
        "SELECT shard FROM shard_leases WHERE owner = $1 AND expires_at > now()",
    )
    .bind(&victim)
    .fetch_all(&pool)
    .await?;
    let count: u32 = sqlx::query_scalar::<_, i32>("SELECT shards FROM shard_map")
        .fetch_one(&pool)
        .await?
        .unsigned_abs();
    let orphans: Vec<String> = (0..schedules)
        .map(|i| format!("f-{i}"))
        .filter(|n| {
            victim_shards
                .iter()
                .any(|&s| s.unsigned_abs() == belfry_protocol::shard_of(n, count))
        })
        .collect();
    let killed_at = {
        let (_, child) = procs
            .0
            .iter_mut()
            .find(|(n, _)| *n == victim)
            .ok_or_else(|| anyhow::anyhow!("the owner {victim} is not one of ours"))?;
        child.kill()?;
        let at = Utc::now();
        child.wait()?;
        at
    };
    tokio::time::sleep(Duration::from_secs(15)).await;
    let window_end = Utc::now().trunc_subsecs(0) - chrono::Duration::seconds(2);
    // Resumed: the first claim of an orphan by another replica after the kill.
    let resumed: Option<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT min(claimed_at) FROM job_runs WHERE job_name = ANY($1) AND claimed_at > $2 \
         AND claimed_by <> $3",
    )
    .bind(&orphans)
    .bind(killed_at)
    .bind(&victim)
    .fetch_one(&pool)
    .await?;
    // Caught up: the last claim of an orphan instant due between the kill
    // and the resumption (the missed ones).
    let caught_up: Option<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT max(claimed_at) FROM job_runs WHERE job_name = ANY($1) \
         AND scheduled_at > $2 AND scheduled_at <= $3",
    )
    .bind(&orphans)
    .bind(killed_at)
    .bind(resumed.unwrap_or(window_end))
    .fetch_one(&pool)
    .await?;
    let (rows, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT (job_name, scheduled_at)) FROM job_runs \
         WHERE scheduled_at BETWEEN $1 AND $2",
    )
    .bind(window_start)
    .bind(window_end)
    .fetch_one(&pool)
    .await?;
    let lateness_before_ms: f64 = sqlx::query_scalar(
        "SELECT COALESCE(percentile_cont(0.99) WITHIN GROUP \
             (ORDER BY extract(epoch FROM claimed_at - scheduled_at) * 1000), 0)::float8 \
         FROM job_runs WHERE scheduled_at BETWEEN $1 AND $2",
    )
    .bind(window_start)
    .bind(killed_at)
    .fetch_one(&pool)
    .await?;
    let seconds = (window_end - window_start).num_seconds() + 1;
    let expected = i64::try_from(schedules)? * seconds;
    drop(procs);
    env.teardown(&["bench"]).await;
    let _ = std::fs::remove_dir_all(&dir);
    let since = |t: Option<DateTime<Utc>>| {
        t.map_or(f64::NAN, |t| {
            (t - killed_at).num_milliseconds() as f64 / 1000.0
        })
    };
    Ok(Round {
        victim_shards: usize::try_from(shards)?,
        victim_schedules: orphans.len(),
        resumed_s: since(resumed),
        caught_up_s: since(caught_up),
        lateness_before_ms,
        lost: expected - distinct,
        duplicates: rows - distinct,
    })
}

/// Runs `rounds` kills over `schedules` schedules and prints the table.
pub async fn run(schedules: usize, rounds: usize) -> anyhow::Result<()> {
    println!("| round | shards of the killed owner | its schedules | fires resumed after | missed instants made by | p99 claim lateness before the kill | lost | duplicates |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for round in 1..=rounds.max(1) {
        let r = one_round(schedules).await?;
        println!(
            "| {round} | {} | {} | {:.1} s | {:.1} s | {:.0} ms | {} | {} |",
            r.victim_shards,
            r.victim_schedules,
            r.resumed_s,
            r.caught_up_s,
            r.lateness_before_ms,
            r.lost,
            r.duplicates
        );
    }
    Ok(())
}
