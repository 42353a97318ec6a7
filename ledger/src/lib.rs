//! belfry's ledger: the `job_runs` and `schedules` tables in Postgres.
//!
//! `job_runs` is the source of truth for every run. Its
//! `UNIQUE(job_name, run_key)` constraint decides which scheduler replica
//! owns a fire ([`Ledger::claim`]), and every later state change of the run
//! (dispatched, each attempt, the outcome) is a guarded `UPDATE` here, so a
//! duplicate delivery can never move a finished run backwards.
//!
//! The ledger is one narrow seam: the scheduler's claim and dispatch and the
//! worker's outcome recording only talk to Postgres through it.

mod attempt_batch;
mod claim_batch;
mod dashboard;
mod error;
mod fire_history;
mod outbox;
mod retention;
mod run_query;
mod runs;
mod schedules;
mod status;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

pub use attempt_batch::{AttemptBatcher, BeginRequest, EndRequest};
pub use dashboard::{MinuteCount, Overview, RecentFire};
pub use error::LedgerError;
pub use fire_history::{ExclusiveClaim, LateClaim};
pub use run_query::{RunCursor, RunFilter};
pub use runs::{AttemptEntry, AttemptStart, NewRun, RunRecord, RUN_COLUMNS};
pub use schedules::ScheduleRow;
pub use status::RunStatus;

/// The embedded migrations of `migrations/`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// A handle on the ledger database (cheap to clone: a pool).
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: PgPool,
}

impl Ledger {
    /// Connects to Postgres at `url` with at most `max_connections`.
    ///
    /// Fails fast (5 s) so that a wrong URL or a stopped server gives one
    /// clear error at start instead of a hang.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Connect`] naming the URL (password masked) when the URL
    /// is invalid or the server does not answer.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, LedgerError> {
        let connect_err = |source| LedgerError::Connect {
            url: belfry_runtime::masked(url),
            source,
        };
        let options: PgConnectOptions = url.parse().map_err(connect_err)?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(connect_err)?;
        Ok(Self { pool })
    }

    /// Wraps an existing pool (tests, embedding applications).
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The underlying pool, for callers that need their own queries.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending migrations.
    ///
    /// Safe when several replicas start at once: sqlx takes a Postgres
    /// advisory lock for the duration of the migration run, so one replica
    /// migrates while the others wait and then find nothing to do.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Migrate`] when a migration fails or the database holds
    /// a migration this build does not know (a newer version ran here).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// Whether the database answers a trivial query.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }
}
