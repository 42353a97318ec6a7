//! Retention at volume (issue 21): removing one day of runs from a ledger
//! of `--rows` finished runs (10,000,000 by default, 40 days of 1,000
//! schedules), two ways, in one run:
//!
//! * **before partitioning** (the baseline): the migrations up to the one
//!   that partitions `job_runs`, and the batched `DELETE` retention ran
//!   then (1,000 rows a statement, `SKIP LOCKED`, 50 ms between batches:
//!   the statement of `ledger/src/postgres/views.rs` before issue 21);
//! * **partitioned**: every migration, the days created ahead the way the
//!   schedulers do, and `Ledger::drop_expired_run_partitions` (what the
//!   retention pass now does first).
//!
//! For each removal: wall time, WAL written (`pg_current_wal_lsn`, minus
//! what the latency probe wrote, from its rate in the quiet window), and
//! the latency of claims made meanwhile (one claim every 20 ms, the real
//! claim statement of each layout) next to the same probe's latency over a
//! quiet window just before. The rounds alternate which layout goes first.
//! Last, the unpartitioned ledger is upgraded in place by the partitioning
//! migration: its time per million rows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Days, Utc};
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

use belfry_ledger::{Ledger, NewRun};

use crate::sample::median;

/// Days of history.
const DAYS: u64 = 40;
/// Schedules the history belongs to.
const SCHEDULES: u64 = 1_000;
/// The probe's pause between claims.
const PROBE_EVERY: Duration = Duration::from_millis(20);
/// The quiet window before each removal.
const QUIET: Duration = Duration::from_secs(5);
/// Rows per batched delete, and the pause between batches (as retention
/// ran them).
const BATCH: i64 = 1_000;
const BATCH_PAUSE: Duration = Duration::from_millis(50);

/// One database of the benchmark (dropped at the end).
struct Db {
    name: String,
    url: String,
    pool: PgPool,
}

async fn create_db(tag: &str) -> anyhow::Result<Db> {
    let admin = belfry_testkit::admin_database_url();
    let name = format!("belfry_ret_{tag}_{}", Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(&admin).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    let url = belfry_testkit::with_database(&admin, &name);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await?;
    Ok(Db { name, url, pool })
}

async fn drop_db(db: Db) {
    db.pool.close().await;
    if let Ok(mut conn) = PgConnection::connect(&belfry_testkit::admin_database_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", db.name))
            .execute(&mut conn)
            .await;
    }
}

/// The first instant of the history: midnight (UTC) `DAYS` days ago.
fn history_start(now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    now.date_naive()
        .checked_sub_days(Days::new(DAYS))
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc())
        .ok_or_else(|| anyhow::anyhow!("no date {DAYS} days before {now}"))
}

/// Fills `job_runs` with `rows` finished fires spread evenly over the
/// `DAYS` days from `start`, in chunks of a million.
async fn fill(db: &Db, rows: u64, start: DateTime<Utc>, partitioned: bool) -> anyhow::Result<f64> {
    let step = (DAYS * 86_400) as f64 / rows as f64;
    let (column, value) = if partitioned {
        (", key_instant", ", belfry_key_instant(n, k)")
    } else {
        ("", "")
    };
    let sql = format!(
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, attempts, \
             claimed_by, claimed_at, dispatched_at, started_at, finished_at, worker{column}) \
         SELECT gen_random_uuid(), n, k, 'noop', 'succeeded', '{{\"n\": 1}}', t, 1, 'sched-a', t, t, t, \
                t + interval '1 second', 'w-1'{value} \
         FROM (SELECT n, t, n || '@' || to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS k \
               FROM (SELECT 'sched-' || (g % {SCHEDULES}) AS n, \
                            date_trunc('second', $1 + g * $2 * interval '1 second') AS t \
                     FROM generate_series($3::bigint, $4::bigint) g) a) b"
    );
    let began = Instant::now();
    let chunk = 1_000_000u64;
    let mut lo = 0u64;
    while lo < rows {
        let hi = (lo + chunk).min(rows) - 1;
        let mut conn = db.pool.acquire().await?;
        sqlx::query("SET synchronous_commit = off")
            .execute(&mut *conn)
            .await?;
        sqlx::query(&sql)
            .bind(start)
            .bind(step)
            .bind(i64::try_from(lo)?)
            .bind(i64::try_from(hi)?)
            .execute(&mut *conn)
            .await?;
        lo = hi + 1;
    }
    sqlx::query("VACUUM ANALYZE job_runs")
        .execute(&db.pool)
        .await?;
    Ok(began.elapsed().as_secs_f64())
}

/// Latencies (ms) of the probe's claims.
struct Probe {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<Vec<f64>>>,
}

/// How the probe claims: the statement of the layout.
#[derive(Clone)]
enum Claimer {
    /// The claim of the unpartitioned ledger (before issue 21).
    Old(PgPool),
    /// The ledger's own claim.
    Ledger(Ledger),
}

impl Claimer {
    async fn claim(&self, name: String, at: DateTime<Utc>) -> anyhow::Result<()> {
        let key = belfry_protocol::run_key(&name, at)?;
        match self {
            Self::Old(pool) => {
                sqlx::query(
                    "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
                         claimed_by, claimed_at, next_dispatch_at) \
                     VALUES ($1, $2, $3, 'noop', 'claimed', 'null', $4, 'probe', now(), $4) \
                     ON CONFLICT (job_name, run_key) DO NOTHING",
                )
                .bind(Uuid::now_v7())
                .bind(&name)
                .bind(&key)
                .bind(at)
                .execute(pool)
                .await?;
            }
            Self::Ledger(ledger) => {
                ledger
                    .claim(&NewRun {
                        id: Uuid::now_v7(),
                        job_name: name,
                        run_key: key,
                        job_type: "noop".into(),
                        payload: serde_json::Value::Null,
                        scheduled_at: at,
                        claimed_by: "probe".into(),
                        trace_id: None,
                        traceparent: None,
                        options: Default::default(),
                        next_dispatch_at: at,
                    })
                    .await?;
            }
        }
        Ok(())
    }
}

/// Claims one fire every `PROBE_EVERY` until stopped: 100 schedules
/// `probe-{tag}-{n}` firing every second up to now, so the claims go to
/// today's partition as real ones do.
fn probe(claimer: Claimer, tag: String) -> Probe {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let mut latencies = Vec::new();
        let base = Utc::now();
        let mut i = 0i64;
        while !flag.load(Ordering::Relaxed) {
            let at = base - chrono::Duration::seconds(i / 100);
            let name = format!("probe-{tag}-{}", i % 100);
            let began = Instant::now();
            claimer.claim(name, at).await?;
            latencies.push(began.elapsed().as_secs_f64() * 1e3);
            i += 1;
            tokio::time::sleep(PROBE_EVERY).await;
        }
        Ok(latencies)
    });
    Probe { stop, task }
}

impl Probe {
    async fn finish(self) -> anyhow::Result<Vec<f64>> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn wal(pool: &PgPool) -> anyhow::Result<String> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?)
}

async fn wal_since(pool: &PgPool, from: &str) -> anyhow::Result<f64> {
    let bytes: f64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
            .bind(from)
            .fetch_one(pool)
            .await?;
    Ok(bytes / 1e6)
}

/// One removal's numbers.
struct Removal {
    seconds: f64,
    wal_mb: f64,
    quiet_p50: f64,
    quiet_p99: f64,
    during_p50: f64,
    during_p99: f64,
    during_max: f64,
    rows: u64,
}

/// Runs `remove` with the probe on, after a quiet window with it on.
async fn measured<F, Fut>(
    pool: &PgPool,
    claimer: Claimer,
    tag: &str,
    remove: F,
) -> anyhow::Result<Removal>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<u64>>,
{
    let quiet_wal = wal(pool).await?;
    let p = probe(claimer.clone(), format!("{tag}q"));
    tokio::time::sleep(QUIET).await;
    let quiet = p.finish().await?;
    let probe_mb_per_s = wal_since(pool, &quiet_wal).await? / QUIET.as_secs_f64();
    let from = wal(pool).await?;
    let p = probe(claimer, format!("{tag}d"));
    let began = Instant::now();
    let rows = remove().await?;
    let seconds = began.elapsed().as_secs_f64();
    let during = p.finish().await?;
    let wal_mb = (wal_since(pool, &from).await? - probe_mb_per_s * seconds).max(0.0);
    Ok(Removal {
        seconds,
        wal_mb,
        quiet_p50: percentile(quiet.clone(), 0.5),
        quiet_p99: percentile(quiet, 0.99),
        during_p50: percentile(during.clone(), 0.5),
        during_p99: percentile(during.clone(), 0.99),
        during_max: percentile(during, 1.0),
        rows,
    })
}

/// Today's batched delete of every finished run before `cutoff`, as the
/// retention loop ran it before partitioning.
async fn batched_delete(pool: &PgPool, cutoff: DateTime<Utc>) -> anyhow::Result<u64> {
    let live = |a: &str| {
        format!(
            "({a}.claimed_by NOT LIKE 'client:%' AND {a}.claimed_by NOT LIKE 'manual:%' \
              AND {a}.claimed_by NOT LIKE 'backfill:%')"
        )
    };
    let sql = format!(
        "WITH doomed AS ( \
             SELECT r.id FROM job_runs r WHERE r.finished_at < $1 \
               AND (NOT COALESCE({}, FALSE) \
                    OR EXISTS (SELECT 1 FROM job_runs n \
                               WHERE n.job_name = r.job_name AND n.scheduled_at > r.scheduled_at AND {})) \
             ORDER BY r.finished_at LIMIT $2 \
             FOR UPDATE SKIP LOCKED) \
         DELETE FROM job_runs WHERE id IN (SELECT id FROM doomed)",
        live("r"),
        live("n")
    );
    let mut total = 0;
    loop {
        let n = sqlx::query(&sql)
            .bind(cutoff)
            .bind(BATCH)
            .execute(pool)
            .await?
            .rows_affected();
        total += n;
        if n < BATCH as u64 {
            return Ok(total);
        }
        tokio::time::sleep(BATCH_PAUSE).await;
    }
}

fn day_end(start: DateTime<Utc>, day: u64) -> DateTime<Utc> {
    start + chrono::Duration::days(i64::try_from(day + 1).unwrap_or(i64::MAX))
}

/// Runs the benchmark.
///
/// # Errors
///
/// When a service fails or a statement does.
pub async fn run(rows: usize, rounds: usize) -> anyhow::Result<()> {
    let rows = u64::try_from(rows)?;
    let now = Utc::now();
    let start = history_start(now)?;
    println!(
        "retention at volume: {rows} finished runs over {DAYS} days ({} a day), {SCHEDULES} schedules; \
         {rounds} rounds of removing the oldest remaining day",
        rows / DAYS
    );

    // Before partitioning: the migrations up to the partitioning one.
    let old = create_db("old").await?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    let mut before = sqlx::migrate::Migrator::new(dir.as_path()).await?;
    let n = before
        .migrations
        .iter()
        .position(|m| m.description.contains("partitioned runs"))
        .ok_or_else(|| anyhow::anyhow!("no partitioning migration in {}", dir.display()))?;
    before.migrations = std::borrow::Cow::Owned(before.migrations[..n].to_vec());
    before.run(&old.pool).await?;
    let filled_old = fill(&old, rows, start, false).await?;

    // Partitioned: every migration, the days created ahead.
    let new = create_db("new").await?;
    let ledger = Ledger::connect(&new.url, 4).await?;
    ledger.migrate().await?;
    let days: Vec<_> = (0..=DAYS + 3)
        .filter_map(|d| start.date_naive().checked_add_days(Days::new(d)))
        .collect();
    ledger.prepare_run_partitions(&days).await?;
    let filled_new = fill(&new, rows, start, true).await?;
    println!("filled in {filled_old:.0} s (unpartitioned) and {filled_new:.0} s (partitioned)");

    let mut deletes = Vec::new();
    let mut drops = Vec::new();
    for round in 0..rounds {
        let day = u64::try_from(round)?;
        // A minute past the day's end: its last runs finish a second
        // after their instant.
        let cutoff = day_end(start, day) + chrono::Duration::minutes(1);
        let tag = format!("r{round}");
        // Counted before, not inside the timed removal.
        let in_day: i64 =
            sqlx::query_scalar("SELECT count(*) FROM job_runs WHERE key_instant < $1")
                .bind(day_end(start, day))
                .fetch_one(&new.pool)
                .await?;
        let in_day = u64::try_from(in_day)?;
        let delete = || async {
            measured(&old.pool, Claimer::Old(old.pool.clone()), &tag, || {
                batched_delete(&old.pool, cutoff)
            })
            .await
        };
        let drop = || async {
            measured(&new.pool, Claimer::Ledger(ledger.clone()), &tag, || async {
                let d = ledger.drop_expired_run_partitions(cutoff).await?;
                anyhow::ensure!(d.dropped.len() == 1, "expected one day dropped: {:?}", d);
                Ok(in_day)
            })
            .await
        };
        if round % 2 == 0 {
            deletes.push(delete().await?);
            drops.push(drop().await?);
        } else {
            drops.push(drop().await?);
            deletes.push(delete().await?);
        }
        let (a, b) = (&deletes[round], &drops[round]);
        println!(
            "round {round}: batched delete {} rows in {:.1} s, {:.0} MB WAL, claim p99 {:.1} -> {:.1} ms (max {:.0}); \
             partition drop {} rows in {:.2} s, {:.2} MB WAL, claim p99 {:.1} -> {:.1} ms (max {:.0})",
            a.rows, a.seconds, a.wal_mb, a.quiet_p99, a.during_p99, a.during_max,
            b.rows, b.seconds, b.wal_mb, b.quiet_p99, b.during_p99, b.during_max
        );
    }
    let m = |v: &[Removal], f: fn(&Removal) -> f64| median(v.iter().map(f).collect());
    println!();
    println!(
        "| removing one day ({} runs) | batched delete (before) | partition drop | ratio |",
        rows / DAYS
    );
    println!("|---|---:|---:|---:|");
    let time_d = m(&deletes, |r| r.seconds);
    let time_p = m(&drops, |r| r.seconds);
    println!(
        "| wall time | {time_d:.1} s | {time_p:.2} s | {:.0}x faster |",
        time_d / time_p
    );
    let wal_d = m(&deletes, |r| r.wal_mb);
    let wal_p = m(&drops, |r| r.wal_mb);
    println!(
        "| WAL written | {wal_d:.0} MB | {wal_p:.2} MB | {:.0}x less |",
        wal_d / wal_p.max(0.01)
    );
    println!(
        "| claim p50, quiet -> during | {:.2} -> {:.2} ms | {:.2} -> {:.2} ms | |",
        m(&deletes, |r| r.quiet_p50),
        m(&deletes, |r| r.during_p50),
        m(&drops, |r| r.quiet_p50),
        m(&drops, |r| r.during_p50)
    );
    println!(
        "| claim p99, quiet -> during | {:.1} -> {:.1} ms | {:.1} -> {:.1} ms | |",
        m(&deletes, |r| r.quiet_p99),
        m(&deletes, |r| r.during_p99),
        m(&drops, |r| r.quiet_p99),
        m(&drops, |r| r.during_p99)
    );
    println!(
        "| claim max during | {:.0} ms | {:.0} ms | |",
        m(&deletes, |r| r.during_max),
        m(&drops, |r| r.during_max)
    );

    // The upgrade: the partitioning migration over what is left.
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM job_runs")
        .fetch_one(&old.pool)
        .await?;
    let upgrade = Ledger::connect(&old.url, 2).await?;
    let began = Instant::now();
    upgrade.migrate().await?;
    let took = began.elapsed().as_secs_f64();
    println!(
        "\nupgrade in place (the partitioning migration) of {left} runs: {took:.0} s, {:.1} s per million",
        took / (left as f64 / 1e6)
    );
    upgrade.close().await;
    ledger.close().await;
    drop_db(old).await;
    drop_db(new).await;
    Ok(())
}
