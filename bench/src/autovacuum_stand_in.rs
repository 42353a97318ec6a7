//! What autovacuum does on a normally configured server, for benchmarks on
//! one that runs with `autovacuum = off` (this machine's CI configuration,
//! `/etc/postgresql/15/main/conf.d/90-ci.conf`).
//!
//! Without it a table filled in one go (a million schedules, a million
//! runs of one instant in one day's partition) is never analysed: the
//! planner knows nothing of its size, and the worker's batched start, found
//! by run key, took 7–10 s a statement at a million rows (76 jobs/s for two
//! workers; 1,196/s once `ANALYZE` had run, RELIABILITY.md). A production
//! Postgres analyses such a table within a minute; belfry depends on it, so
//! a benchmark measuring belfry at volume runs `VACUUM (ANALYZE)` of its
//! database every minute in autovacuum's place when the server does not,
//! and says so (as the soak does, `BELFRY_SOAK_VACUUM`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The passes a stand-in made: how many, and the longest (ms).
#[derive(Debug, Default)]
pub struct Passes {
    count: AtomicU64,
    longest_ms: AtomicU64,
    failed: AtomicU64,
}

impl Passes {
    /// One line saying what the stand-in did.
    pub fn summary(&self) -> String {
        format!(
            "autovacuum stand-in: {} VACUUM (ANALYZE) passes, the longest {:.1} s, {} failed",
            self.count.load(Ordering::Relaxed),
            self.longest_ms.load(Ordering::Relaxed) as f64 / 1000.0,
            self.failed.load(Ordering::Relaxed)
        )
    }
}

/// The running stand-in: stopped when dropped.
pub struct StandIn {
    task: tokio::task::JoinHandle<()>,
    /// What it did so far.
    pub passes: Arc<Passes>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts `VACUUM (ANALYZE)` of `pool`'s database now and every `every`
/// when the server runs with autovacuum off; `None` when it runs it
/// itself.
///
/// # Errors
///
/// When the server's setting cannot be read.
pub async fn start_if_off(pool: &sqlx::PgPool, every: Duration) -> anyhow::Result<Option<StandIn>> {
    let setting: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(pool)
        .await?;
    if setting == "on" {
        return Ok(None);
    }
    println!(
        "server autovacuum = {setting}: running VACUUM (ANALYZE) of the database every {} s in its place",
        every.as_secs()
    );
    let passes = Arc::new(Passes::default());
    let pool = pool.clone();
    let counted = passes.clone();
    let task = tokio::spawn(async move {
        loop {
            let started = Instant::now();
            match sqlx::query("VACUUM (ANALYZE)").execute(&pool).await {
                Ok(_) => {
                    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    counted.count.fetch_add(1, Ordering::Relaxed);
                    counted.longest_ms.fetch_max(ms, Ordering::Relaxed);
                }
                Err(e) => {
                    counted.failed.fetch_add(1, Ordering::Relaxed);
                    eprintln!("autovacuum stand-in: VACUUM (ANALYZE) failed: {e}");
                }
            }
            tokio::time::sleep(every.saturating_sub(started.elapsed())).await;
        }
    });
    Ok(Some(StandIn { task, passes }))
}
