//! Dispatch at the machine's limit (issue 8), all in one run:
//!
//! 1. **Raw pipeline**, the baseline: a tight loop doing one fire at a time
//!    per worker task — Redis `SET NX PX`, `INSERT ... ON CONFLICT DO
//!    NOTHING RETURNING`, publish and wait for the confirm — with 1, 16 and
//!    64 fires in flight (each task its own channel; a shared Redis
//!    connection and Postgres pool).
//! 2. **belfry**: 1 and 3 scheduler replicas (each with its own
//!    connections, as separate processes would have) running their real
//!    timer loops, dispatching bursts of 1,000 and 10,000 one-shot fires due
//!    at the same second, and a steady 2,000 fires/s (2,000 schedules every
//!    second).
//!
//! 3. **Batched raw pipeline**, the machine's real limit (issue 21): per
//!    batch of 256 fires one Redis pipeline of `SET NX PX`, one multi-row
//!    `INSERT ... ON CONFLICT DO NOTHING RETURNING`, the publishes sent
//!    together and their confirms awaited together (a window of 256), and
//!    one `UPDATE` marking them dispatched; with 1 and 4 batches in flight.
//!    No belfry code. belfry's slowest burst is reported as a ratio of it.
//!
//! For belfry everything is read back from `job_runs`: fires dispatched per
//! second (fires / (last `dispatched_at` − the due instant)), lateness
//! (`dispatched_at` − `scheduled_at`) p50/p99/max, duplicates (more than one
//! row for one schedule and instant) and lost fires (no dispatched row).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, SubsecRound, Utc};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use belfry_broker::Broker;
use belfry_ledger::Ledger;
use belfry_protocol::{run_key, JobMessage, ScheduleSpec, MESSAGE_VERSION};
use belfry_runtime::SystemClock;
use belfry_scheduler::{ClaimLock, Replica, ReplicaTiming, Schedule, ShardSettings, Timer};
use belfry_testkit::{amqp_url, redis_url, TestEnv};

/// Runs every scenario and prints the table.
pub async fn run(raw_fires: usize, steady_seconds: u64) -> anyhow::Result<()> {
    println!("raw pipeline (one fire at a time per task; {raw_fires} fires each)");
    println!("{:>10} {:>12}", "in flight", "fires/s");
    let mut best_raw = 0.0_f64;
    for inflight in [1usize, 16, 64] {
        let n = if inflight == 1 {
            raw_fires / 4
        } else {
            raw_fires
        };
        let rate = raw(n, inflight).await?;
        best_raw = best_raw.max(rate);
        println!("{inflight:>10} {rate:>12.0}");
    }
    println!();
    println!(
        "raw pipeline, batched ({BATCH} fires a batch: one Redis pipeline, one INSERT, \
         confirms awaited together, one UPDATE; {raw_fires} fires each)"
    );
    println!("{:>10} {:>12}", "batches in flight", "fires/s");
    let mut best_batched = 0.0_f64;
    for inflight in [1usize, 4] {
        let rate = raw_batched(raw_fires, inflight).await?;
        best_batched = best_batched.max(rate);
        println!("{inflight:>17} {rate:>12.0}");
    }
    println!();
    println!("belfry (timer loop, batched claims and publishes)");
    println!(
        "{:<22} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9} {:>5} {:>5}",
        "scenario", "replicas", "fires", "fires/s", "p50 ms", "p99 ms", "max ms", "dup", "lost"
    );
    let mut burst_rates = Vec::new();
    let mut p99_1k = Vec::new();
    for replicas in [1usize, 3] {
        for burst in [1_000usize, 10_000] {
            let r = belfry_burst(replicas, burst, LedgerRoute::Direct, None).await?;
            r.print(&format!("burst {burst}"), replicas, burst);
            burst_rates.push(r.rate);
            if burst == 1_000 {
                p99_1k.push(r.p99_ms);
            }
        }
        let r = belfry_steady(replicas, 2_000, steady_seconds).await?;
        r.print(
            &format!("steady 2000/s x {steady_seconds}s"),
            replicas,
            2_000 * steady_seconds as usize,
        );
    }
    let worst_burst = burst_rates.iter().copied().fold(f64::INFINITY, f64::min);
    let worst_p99 = p99_1k.iter().copied().fold(0.0, f64::max);
    println!();
    println!(
        "bar: slowest belfry burst {worst_burst:.0}/s vs best raw {best_raw:.0}/s = {:.2} (>= 1.00); \
         worst p99 of a 1,000 burst {worst_p99:.0} ms (< 500)",
        worst_burst / best_raw
    );
    println!(
        "against the batched raw pipeline: slowest belfry burst {worst_burst:.0}/s vs best batched \
         {best_batched:.0}/s = {:.2} (issue 21's target >= 0.80)",
        worst_burst / best_batched
    );
    Ok(())
}

/// Fires per batch of the batched raw pipeline (belfry's default
/// `BELFRY_MAX_BATCH`).
const BATCH: usize = 256;

/// The batched raw pipeline with `inflight` batches at a time over `n`
/// fires; fires per second.
pub(crate) async fn raw_batched(n: usize, inflight: usize) -> anyhow::Result<f64> {
    let env = TestEnv::new().await;
    env.broker.declare_group("raw", &["noop"]).await?;
    let redis = redis::Client::open(redis_url())?;
    let redis = redis::aio::ConnectionManager::new(redis).await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::try_from(inflight.max(1))?)
        .connect(&env.database_url)
        .await?;
    let conn =
        lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default()).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let base = Utc::now().trunc_subsecs(0);
    let mut channels = Vec::with_capacity(inflight);
    for _ in 0..inflight {
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        channels.push(ch);
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for channel in channels {
        let (next, pool, mut redis) = (next.clone(), pool.clone(), redis.clone());
        let exchange = env.topology.jobs_exchange();
        let topology = env.topology.clone();
        tasks.spawn(async move {
            loop {
                let first = next.fetch_add(BATCH, Ordering::Relaxed);
                if first >= n {
                    return anyhow::Ok(());
                }
                let fires: Vec<(String, String, DateTime<Utc>, Uuid)> = (first
                    ..n.min(first + BATCH))
                    .map(|i| {
                        let name = format!("raw-{}", i % 1000);
                        let at = base + chrono::Duration::seconds(i64::try_from(i)?);
                        let key = run_key(&name, at)?;
                        anyhow::Ok((name, key, at, Uuid::now_v7()))
                    })
                    .collect::<Result<_, _>>()?;
                // One round trip for every lock of the batch.
                let mut pipe = redis::pipe();
                for (name, key, _, _) in &fires {
                    pipe.cmd("SET")
                        .arg(topology.lock_key(name, key))
                        .arg("raw")
                        .arg("NX")
                        .arg("PX")
                        .arg(60_000);
                }
                let locked: Vec<Option<String>> = pipe.query_async(&mut redis).await?;
                anyhow::ensure!(locked.iter().all(Option::is_some), "a lock was taken");
                // One statement for every row of the batch.
                let ids: Vec<Uuid> = fires.iter().map(|f| f.3).collect();
                let names: Vec<&str> = fires.iter().map(|f| f.0.as_str()).collect();
                let keys: Vec<&str> = fires.iter().map(|f| f.1.as_str()).collect();
                let ats: Vec<DateTime<Utc>> = fires.iter().map(|f| f.2).collect();
                let won: Vec<Uuid> = sqlx::query_scalar(
                    "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, \
                         scheduled_at, claimed_by, claimed_at, key_instant) \
                     SELECT id, name, key, 'noop', 'claimed', 'null', at, 'raw', now(), \
                         belfry_key_instant(name, key) \
                     FROM unnest($1::uuid[], $2::text[], $3::text[], $4::timestamptz[]) \
                         AS f(id, name, key, at) \
                     ON CONFLICT (job_name, run_key, key_instant) DO NOTHING RETURNING id",
                )
                .bind(&ids)
                .bind(&names)
                .bind(&keys)
                .bind(&ats)
                .fetch_all(&pool)
                .await?;
                anyhow::ensure!(won.len() == fires.len(), "a row was taken");
                // Every publish sent, then every confirm awaited.
                let mut confirms = Vec::with_capacity(fires.len());
                for (name, key, at, id) in fires {
                    let message = JobMessage {
                        version: MESSAGE_VERSION,
                        message_id: id,
                        job_name: name,
                        job_type: "noop".into(),
                        run_key: key,
                        scheduled_at: at,
                        published_at: Utc::now(),
                        attempt: 1,
                        payload: serde_json::Value::Null,
                        trace: None,
                        options: Default::default(),
                    };
                    confirms.push(
                        channel
                            .basic_publish(
                                &exchange,
                                "noop",
                                BasicPublishOptions {
                                    mandatory: true,
                                    ..Default::default()
                                },
                                &message.to_vec(),
                                BasicProperties::default().with_delivery_mode(2),
                            )
                            .await?,
                    );
                }
                for confirm in confirms {
                    anyhow::ensure!(confirm.await?.is_ack(), "a publish was not confirmed");
                }
                sqlx::query(
                    "UPDATE job_runs SET status = 'dispatched', dispatched_at = now() \
                     WHERE id = ANY($1)",
                )
                .bind(&ids)
                .execute(&pool)
                .await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let _ = conn.close(200, "done").await;
    env.teardown(&["raw"]).await;
    Ok(rate)
}

/// The raw pipeline with `inflight` tasks; fires per second.
async fn raw(n: usize, inflight: usize) -> anyhow::Result<f64> {
    let env = TestEnv::new().await;
    env.broker.declare_group("raw", &["noop"]).await?;
    let redis = redis::Client::open(redis_url())?;
    let redis = redis::aio::ConnectionManager::new(redis).await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::try_from(inflight.min(32))?)
        .connect(&env.database_url)
        .await?;
    let conn =
        lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default()).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let base = Utc::now().trunc_subsecs(0);
    let mut channels = Vec::with_capacity(inflight);
    for _ in 0..inflight {
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        channels.push(ch);
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for channel in channels {
        let (next, pool, mut redis) = (next.clone(), pool.clone(), redis.clone());
        let exchange = env.topology.jobs_exchange();
        let topology = env.topology.clone();
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(());
                }
                let name = format!("raw-{}", i % 1000);
                let at = base + chrono::Duration::seconds(i64::try_from(i)?);
                let key = run_key(&name, at)?;
                let locked: Option<String> = redis::cmd("SET")
                    .arg(topology.lock_key(&name, &key))
                    .arg("raw")
                    .arg("NX")
                    .arg("PX")
                    .arg(60_000)
                    .query_async(&mut redis)
                    .await?;
                anyhow::ensure!(locked.is_some(), "lock {key} taken");
                let id = Uuid::now_v7();
                let won: Option<Uuid> = sqlx::query_scalar(
                    "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, \
                         scheduled_at, claimed_by, claimed_at, key_instant) \
                     VALUES ($1, $2, $3, 'noop', 'claimed', 'null', $4, 'raw', now(), \
                         belfry_key_instant($2, $3)) \
                     ON CONFLICT (job_name, run_key, key_instant) DO NOTHING RETURNING id",
                )
                .bind(id)
                .bind(&name)
                .bind(&key)
                .bind(at)
                .fetch_optional(&pool)
                .await?;
                anyhow::ensure!(won.is_some(), "row {key} taken");
                let message = JobMessage {
                    version: MESSAGE_VERSION,
                    message_id: id,
                    job_name: name,
                    job_type: "noop".into(),
                    run_key: key,
                    scheduled_at: at,
                    published_at: Utc::now(),
                    attempt: 1,
                    payload: serde_json::Value::Null,
                    trace: None,
                    options: Default::default(),
                };
                channel
                    .basic_publish(
                        &exchange,
                        "noop",
                        BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        },
                        &message.to_vec(),
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await?
                    .await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let _ = conn.close(200, "done").await;
    env.teardown(&["raw"]).await;
    Ok(rate)
}

/// p50, p99 and max lateness (ms), the last dispatch, and the count.
type LatencyRow = (
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<DateTime<Utc>>,
    i64,
);

pub(crate) struct Measured {
    pub(crate) rate: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
    pub(crate) duplicates: i64,
    pub(crate) lost: i64,
    /// This process's CPU per fire (every replica's), ms, from just before
    /// the burst was due until it was dispatched; 0 where not measured.
    pub(crate) cpu_ms: f64,
}

/// How the replicas' ledger reaches Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LedgerRoute {
    /// Straight to Postgres (cached prepared statements).
    Direct,
    /// Through the PgBouncer of `scripts/pgbouncer` (transaction pooling,
    /// 127.0.0.1:56432), with the direct URL for `LISTEN` and migrations.
    Pooler,
}

impl LedgerRoute {
    async fn connect(self, database_url: &str) -> anyhow::Result<Ledger> {
        Ok(match self {
            Self::Direct => Ledger::connect(database_url, 8).await?,
            Self::Pooler => {
                let pooled = database_url.replacen("127.0.0.1:5432", "127.0.0.1:56432", 1);
                anyhow::ensure!(
                    pooled != database_url,
                    "the bench database is not on 127.0.0.1:5432"
                );
                Ledger::connect_routed(&pooled, Some(database_url), 8).await?
            }
        })
    }
}

/// Starts `count` replicas firing `schedules`. With `sharding`, each holds
/// shard leases (passed until the shares settle, before any timer starts)
/// and its timer holds only the schedules of its shards, as a
/// `belfry-scheduler` loads them; without, every timer holds every
/// schedule and the replicas race for each fire.
pub(crate) async fn start_replicas(
    env: &TestEnv,
    count: usize,
    schedules: &[Arc<Schedule>],
    cancel: &CancellationToken,
    route: LedgerRoute,
    sharding: Option<ShardSettings>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut replicas = Vec::new();
    for k in 0..count {
        let instance = format!("bench-{k}");
        let lock = ClaimLock::new(
            &redis_url(),
            env.topology.clone(),
            &instance,
            Duration::from_secs(60),
        )?;
        let ledger = route.connect(&env.database_url).await?;
        let broker = Broker::connect(&amqp_url(), env.topology.clone(), &instance).await?;
        let mut replica = Replica::new(
            &instance,
            Some(lock),
            ledger,
            broker,
            ReplicaTiming::default(),
        );
        if let Some(settings) = &sharding {
            replica = replica.sharded(settings.clone());
        }
        replicas.push(Arc::new(replica));
    }
    // Two rounds of passes: the first joins in order, the second lets the
    // early ones learn what later ones took.
    for _ in 0..2 {
        for replica in &replicas {
            if let Some(keeper) = replica.shard_keeper() {
                keeper.pass_once().await?;
            }
        }
    }
    let mut tasks = Vec::new();
    for replica in replicas {
        let mine: Vec<Arc<Schedule>> = match replica.shard_keeper() {
            Some(keeper) => {
                let owned = keeper.owned();
                schedules
                    .iter()
                    .filter(|s| owned.has(&s.name))
                    .cloned()
                    .collect()
            }
            None => schedules.to_vec(),
        };
        let timer = Timer::new(mine, Utc::now());
        tasks.push(tokio::spawn(replica.run(
            timer,
            Arc::new(SystemClock),
            cancel.clone(),
        )));
    }
    Ok(tasks)
}

/// Waits until `expected` runs are dispatched (at most `within`).
pub(crate) async fn wait_dispatched(
    env: &TestEnv,
    expected: i64,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let done: i64 =
            sqlx::query_scalar("SELECT count(*) FROM job_runs WHERE dispatched_at IS NOT NULL")
                .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
                .await?;
        if done >= expected || Instant::now() > deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads the scenario's numbers back from `job_runs`: fires due in
/// `[from, to]`, `expected` of them.
async fn measure(
    env: &TestEnv,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    expected: i64,
) -> anyhow::Result<Measured> {
    let row: LatencyRow = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), \
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms), max(dispatched_at), count(*) \
         FROM (SELECT (extract(epoch FROM dispatched_at - scheduled_at) * 1000)::float8 AS ms, dispatched_at \
               FROM job_runs WHERE scheduled_at BETWEEN $1 AND $2 AND dispatched_at IS NOT NULL) t",
    )
    .bind(from)
    .bind(to)
    .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
    .await?;
    let duplicates: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT job_name, scheduled_at FROM job_runs \
         WHERE scheduled_at BETWEEN $1 AND $2 GROUP BY 1, 2 HAVING count(*) > 1) d",
    )
    .bind(from)
    .bind(to)
    .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
    .await?;
    let (p50, p99, max, last, dispatched) = row;
    let span = last
        .map(|l| (l - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6)
        .unwrap_or(f64::INFINITY);
    Ok(Measured {
        rate: dispatched as f64 / span.max(1e-3),
        p50_ms: p50.unwrap_or(f64::NAN),
        p99_ms: p99.unwrap_or(f64::NAN),
        max_ms: max.unwrap_or(f64::NAN),
        duplicates,
        lost: expected - dispatched,
        cpu_ms: 0.0,
    })
}

impl Measured {
    fn print(&self, scenario: &str, replicas: usize, fires: usize) {
        println!(
            "{:<22} {:>8} {:>8} {:>10.0} {:>9.0} {:>9.0} {:>9.0} {:>5} {:>5}",
            scenario,
            replicas,
            fires,
            self.rate,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            self.duplicates,
            self.lost
        );
    }
}

/// `n` validated schedules from `spec(i)`.
pub(crate) fn many(
    n: usize,
    spec: impl Fn(usize) -> ScheduleSpec,
) -> anyhow::Result<Vec<Arc<Schedule>>> {
    (0..n)
        .map(|i| Ok(Arc::new(Schedule::from_spec(&spec(i))?)))
        .collect()
}

/// `burst` one-shot fires due at the same second, `replicas` replicas
/// whose ledger takes `route`.
pub(crate) async fn belfry_burst(
    replicas: usize,
    burst: usize,
    route: LedgerRoute,
    sharding: Option<ShardSettings>,
) -> anyhow::Result<Measured> {
    let env = TestEnv::new().await;
    env.broker.declare_group("bench", &["noop"]).await?;
    // Far enough ahead for every replica to be up and its timer armed
    // (a second more per 20,000 fires, for building their schedules).
    let lead = 4 + i64::try_from(burst / 20_000)?;
    let at = Utc::now().trunc_subsecs(0) + chrono::Duration::seconds(lead);
    let schedules = many(burst, |i| ScheduleSpec {
        name: format!("burst-{i}"),
        at: Some(at.to_rfc3339()),
        job_type: "noop".into(),
        ..Default::default()
    })?;
    let cancel = CancellationToken::new();
    let tasks = start_replicas(&env, replicas, &schedules, &cancel, route, sharding).await?;
    anyhow::ensure!(Utc::now() < at, "set-up took longer than the lead time");
    let before = (at - chrono::Duration::milliseconds(200) - Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(before).await;
    let cpu = crate::fire_cost::cpu_seconds()?;
    wait_dispatched(&env, burst as i64, Duration::from_secs(120)).await?;
    let cpu = crate::fire_cost::cpu_seconds()? - cpu;
    let mut measured = measure(&env, at, at, burst as i64).await?;
    measured.cpu_ms = cpu * 1000.0 / burst as f64;
    cancel.cancel();
    for t in tasks {
        t.await.context("replica task")?;
    }
    env.teardown(&["bench"]).await;
    Ok(measured)
}

/// `per_second` schedules every second for `seconds`, `replicas` replicas.
async fn belfry_steady(
    replicas: usize,
    per_second: usize,
    seconds: u64,
) -> anyhow::Result<Measured> {
    let env = TestEnv::new().await;
    env.broker.declare_group("bench", &["noop"]).await?;
    let schedules = many(per_second, |i| ScheduleSpec {
        name: format!("steady-{i}"),
        every: Some("1s".into()),
        job_type: "noop".into(),
        ..Default::default()
    })?;
    let cancel = CancellationToken::new();
    let tasks = start_replicas(
        &env,
        replicas,
        &schedules,
        &cancel,
        LedgerRoute::Direct,
        None,
    )
    .await?;
    // Measure whole seconds well after start-up.
    let from = Utc::now().trunc_subsecs(0) + chrono::Duration::seconds(2);
    let to = from + chrono::Duration::seconds(i64::try_from(seconds)? - 1);
    tokio::time::sleep_until(
        tokio::time::Instant::now()
            + (to - Utc::now()).to_std().unwrap_or_default()
            + Duration::from_millis(500),
    )
    .await;
    let expected = i64::try_from(per_second)? * i64::try_from(seconds)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM job_runs WHERE scheduled_at BETWEEN $1 AND $2 \
             AND dispatched_at IS NOT NULL",
        )
        .bind(from)
        .bind(to)
        .fetch_one(env.ledger.pg_pool().expect("a Postgres ledger"))
        .await?;
        if done >= expected || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cancel.cancel();
    for t in tasks {
        t.await.context("replica task")?;
    }
    let mut measured = measure(&env, from, to, expected).await?;
    // Steady: the rate is what was sustained over the window.
    measured.rate = (expected - measured.lost) as f64 / seconds as f64;
    env.teardown(&["bench"]).await;
    Ok(measured)
}
