//! What one fire costs the shared services, by number of replicas (issue
//! 21's "before" measurement): a burst of one-shot fires due at the same
//! second, run by 1, 3 and 6 replicas in this process, and for the burst
//! window the Redis commands processed (`INFO stats`), the Postgres
//! transactions committed and rows written in the bench's database
//! (`pg_stat_database`), and this process's CPU time (every replica's), each
//! divided by the fires. Each with sharding off (every replica evaluates
//! and races for every fire, so the costs grow with the replicas) and on
//! (each fire is its shard owner's alone, so they stay flat).
//!
//! The window opens just before the fires are due (the replicas' start-up
//! is not counted) and closes 2 s after the last is dispatched, when
//! Postgres has flushed its statistics; the replicas' background loops
//! (outbox, recovery, clock checks) in that window are counted too, as a
//! replica's share of the cost.

use std::time::Duration;

use chrono::{SubsecRound, Utc};
use tokio_util::sync::CancellationToken;

use belfry_protocol::ScheduleSpec;
use belfry_testkit::{redis_url, TestEnv};

use belfry_scheduler::ShardSettings;

use crate::dispatch_burst::{many, start_replicas, wait_dispatched, LedgerRoute};

/// This process's CPU time (user + system), from `/proc/self/stat`.
pub(crate) fn cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("unexpected /proc/self/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    let ticks: f64 = fields
        .get(11..13)
        .ok_or_else(|| anyhow::anyhow!("unexpected /proc/self/stat"))?
        .iter()
        .map(|f| f.parse::<f64>())
        .sum::<Result<f64, _>>()?;
    Ok(ticks / 100.0)
}

/// Redis commands processed so far (the whole server).
async fn redis_commands() -> anyhow::Result<i64> {
    let client = redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .ok_or_else(|| anyhow::anyhow!("no total_commands_processed in INFO"))?
        .trim()
        .parse()
        .map_err(Into::into)
}

/// (transactions committed, rows inserted + updated + deleted) of the
/// bench's database so far.
async fn postgres_counts(env: &TestEnv) -> anyhow::Result<(i64, i64)> {
    let pool = env
        .ledger
        .pg_pool()
        .ok_or_else(|| anyhow::anyhow!("a Postgres ledger"))?;
    let mut conn = pool.acquire().await?;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await?;
    let row: (i64, i64) = sqlx::query_as(
        "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted \
         FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(row)
}

/// One row of the table.
struct Cost {
    replicas: usize,
    sharded: bool,
    redis: f64,
    transactions: f64,
    rows: f64,
    cpu_ms: f64,
}

/// A burst of `fires` with `replicas` replicas: its cost per fire.
async fn burst_cost(replicas: usize, fires: usize, sharded: bool) -> anyhow::Result<Cost> {
    let env = TestEnv::new().await;
    env.broker.declare_group("bench", &["noop"]).await?;
    let at = Utc::now().trunc_subsecs(0) + chrono::Duration::seconds(5);
    let schedules = many(fires, |i| ScheduleSpec {
        name: format!("cost-{i}"),
        at: Some(at.to_rfc3339()),
        job_type: "noop".into(),
        ..Default::default()
    })?;
    let cancel = CancellationToken::new();
    let sharding = sharded.then(ShardSettings::default);
    let tasks = start_replicas(
        &env,
        replicas,
        &schedules,
        &cancel,
        LedgerRoute::Direct,
        sharding,
    )
    .await?;
    anyhow::ensure!(Utc::now() < at, "set-up took longer than the lead time");
    // Let start-up's own statistics flush, then open the window.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (r0, (x0, t0), c0) = (
        redis_commands().await?,
        postgres_counts(&env).await?,
        cpu_seconds()?,
    );
    wait_dispatched(&env, fires as i64, Duration::from_secs(120)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (r1, (x1, t1), c1) = (
        redis_commands().await?,
        postgres_counts(&env).await?,
        cpu_seconds()?,
    );
    cancel.cancel();
    for t in tasks {
        t.await?;
    }
    env.teardown(&["bench"]).await;
    let n = fires as f64;
    Ok(Cost {
        replicas,
        sharded,
        redis: (r1 - r0) as f64 / n,
        transactions: (x1 - x0) as f64 / n,
        rows: (t1 - t0) as f64 / n,
        cpu_ms: (c1 - c0) * 1000.0 / n,
    })
}

/// Runs the burst with 1, 3 and 6 replicas, sharding off and on,
/// `rounds` times each (alternating), and prints the medians.
pub async fn run(fires: usize, rounds: usize) -> anyhow::Result<()> {
    let cases: Vec<(usize, bool)> = [false, true]
        .into_iter()
        .flat_map(|sharded| [1usize, 3, 6].map(|r| (r, sharded)))
        .collect();
    let mut all: Vec<Vec<Cost>> = cases.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds.max(1) {
        for (i, (replicas, sharded)) in cases.iter().enumerate() {
            let c = burst_cost(*replicas, fires, *sharded).await?;
            println!(
                "round {round}: {replicas} replica(s), sharding {}: {:.2} Redis commands, {:.2} Postgres transactions, {:.2} rows written, {:.3} ms CPU per fire",
                if *sharded { "on" } else { "off" },
                c.redis, c.transactions, c.rows, c.cpu_ms
            );
            all[i].push(c);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!();
    println!("cost per fire of a {fires}-fire burst (median of {rounds} rounds)");
    println!();
    println!("| sharding | replicas | Redis commands | Postgres transactions | rows written | CPU ms (all replicas) | CPU vs 1 replica |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut one = None;
    for costs in &all {
        let replicas = costs[0].replicas;
        let sharding = if costs[0].sharded { "on" } else { "off" };
        if replicas == 1 {
            one = None;
        }
        let redis = median(&mut costs.iter().map(|c| c.redis).collect());
        let tx = median(&mut costs.iter().map(|c| c.transactions).collect());
        let rows = median(&mut costs.iter().map(|c| c.rows).collect());
        let cpu = median(&mut costs.iter().map(|c| c.cpu_ms).collect());
        let base = *one.get_or_insert(cpu);
        println!(
            "| {sharding} | {replicas} | {redis:.2} | {tx:.2} | {rows:.2} | {cpu:.3} | {:.2} × |",
            cpu / base
        );
    }
    Ok(())
}
