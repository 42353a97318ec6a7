//! The scans every replica makes of `schedules` on a timer, at a million
//! rows (issue 21): the 30-second resync, which compares the stored
//! versions with the timer's, and the deadline watch's ask for the
//! schedules with a `deadline`, every few seconds.
//!
//! `--schedules` rows (1,000,000 by default) are written straight into
//! `schedules`, each with a stored definition (`spec`) of the size the
//! scheduler writes, `--deadlines` of them (30) with a deadline; then
//! `ANALYZE`. Each round times, in a rotating order:
//!
//! * the resync as it is: the versions of one replica's share of the
//!   shards (86 of 256, three replicas) — and its baseline, the read of
//!   every row's version that each replica made before;
//! * the deadline ask as it is (the partial index `schedules_with_deadline`)
//!   — and its baseline, the same statement with index scans turned off in
//!   its transaction, which is the plan it had before the index.
//!
//! Reported: the median of the rounds of each, and each one's ratio to its
//! baseline. The database is otherwise idle here: these are the scans'
//! own costs, not their costs beside a burst.

use std::time::Instant;

use belfry_testkit::TestEnv;

use crate::sample::median;

/// Shards a replica holds of the default 256 with three replicas.
const SHARE: u32 = 86;
/// The default shard count.
const SHARDS: u32 = 256;

/// Runs the benchmark.
///
/// # Errors
///
/// When a service or a statement fails.
pub async fn run(schedules: usize, deadlines: usize, rounds: usize) -> anyhow::Result<()> {
    let env = TestEnv::new().await;
    let pool = env
        .ledger
        .pg_pool()
        .ok_or_else(|| anyhow::anyhow!("a Postgres ledger"))?
        .clone();
    let every = (schedules / deadlines.max(1)).max(1);
    let written = Instant::now();
    // A stored definition as the scheduler writes one; every `every`-th
    // schedule has a deadline.
    sqlx::query(
        "INSERT INTO schedules (name, cron, job_type, spec) \
         SELECT 'scan-' || g, '0 0 * * * *', 'noop', \
                jsonb_build_object('name', 'scan-' || g, 'cron', '0 0 * * * *', 'job_type', 'noop', \
                                   'timezone', 'UTC', 'misfire', 'fire_once', 'overlap', 'allow_all') \
                || CASE WHEN g % $2 = 0 THEN jsonb_build_object('deadline', '5m') ELSE '{}'::jsonb END \
         FROM generate_series(1, $1::bigint) g",
    )
    .bind(i64::try_from(schedules)?)
    .bind(i64::try_from(every)?)
    .execute(&pool)
    .await?;
    sqlx::query("ANALYZE schedules").execute(&pool).await?;
    println!(
        "{schedules} schedules written in {:.1} s ({} with a deadline)",
        written.elapsed().as_secs_f64(),
        schedules / every
    );
    let share: Vec<u32> = (0..SHARE).collect();
    let mut times: [Vec<f64>; 4] = Default::default();
    let mut rows = [0_usize; 4];
    for round in 0..rounds.max(1) {
        for k in 0..4 {
            let which = (k + round) % 4;
            let started = Instant::now();
            rows[which] = match which {
                0 => env.ledger.schedule_versions().await?.len(),
                1 => env
                    .ledger
                    .schedule_versions_in_shards(SHARDS, &share)
                    .await?
                    .len(),
                2 => {
                    let mut tx = pool.begin().await?;
                    // The plan before the partial index: every row's spec
                    // read and filtered.
                    for off in [
                        "SET LOCAL enable_indexscan = off",
                        "SET LOCAL enable_bitmapscan = off",
                        "SET LOCAL enable_indexonlyscan = off",
                    ] {
                        sqlx::query(off).execute(&mut *tx).await?;
                    }
                    let found: Vec<(String, String)> = sqlx::query_as(
                        "SELECT name, spec ->> 'deadline' FROM schedules \
                         WHERE spec ->> 'deadline' IS NOT NULL ORDER BY name",
                    )
                    .fetch_all(&mut *tx)
                    .await?;
                    tx.rollback().await?;
                    found.len()
                }
                _ => env.ledger.schedule_deadlines().await?.len(),
            };
            times[which].push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let [all, own, seq, indexed] = times.map(median);
    println!("| scan ({schedules} schedules, {rounds} rounds, median) | rows | ms | ratio to its baseline |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| resync baseline: every row's version | {} | {all:.1} | 1.00 × |",
        rows[0]
    );
    println!(
        "| resync: one replica's {SHARE} of {SHARDS} shards | {} | {own:.1} | {:.2} × |",
        rows[1],
        own / all
    );
    println!(
        "| deadline ask baseline: every row's spec (no index scan) | {} | {seq:.1} | 1.00 × |",
        rows[2]
    );
    println!(
        "| deadline ask: partial index | {} | {indexed:.2} | {:.4} × |",
        rows[3],
        indexed / seq
    );
    env.teardown(&[]).await;
    Ok(())
}
