//! belfry's ledger: the `job_runs` and `schedules` tables, in Postgres or,
//! for the embedded single-process mode, in SQLite.
//!
//! `job_runs` is the source of truth for every run. Its
//! `UNIQUE(job_name, run_key)` constraint decides which scheduler replica
//! owns a fire ([`Ledger::claim`]), and every later state change of the run
//! (dispatched, each attempt, the outcome) is a guarded `UPDATE` here, so a
//! duplicate delivery can never move a finished run backwards.
//!
//! The ledger is one narrow seam: the scheduler's claim and dispatch and the
//! worker's outcome recording only talk to the database through it.
//! [`Ledger::connect`] picks the backend from the URL (`postgres://` or
//! `sqlite:`); every method means the same on both (the same states, the
//! same guards, the same unique constraint), and only the SQL differs:
//! Postgres statements live in the modules named after what they do,
//! their SQLite counterparts in `sqlite/` (see its docs for what the
//! embedded database does differently and why it is safe). The embedded
//! database also holds the job queue ([`JobQueue`]) that replaces RabbitMQ
//! in embedded mode.

mod attempt_batch;
mod claim_batch;
mod dashboard;
mod error;
mod fire_history;
mod outbox;
mod retention;
mod run_query;
mod runs;
mod schedule_listener;
mod schedules;
mod skipped_range;
mod sqlite;
mod status;
mod stored_text;

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

pub use attempt_batch::{AttemptBatcher, BeginRequest, EndRequest};
pub use dashboard::{MinuteCount, Overview, RecentFire};
pub use error::LedgerError;
pub use fire_history::{ExclusiveClaim, LateClaim};
pub use run_query::{RunCursor, RunFilter};
pub use runs::{AttemptEntry, AttemptStart, NewRun, RunRecord, RUN_COLUMNS};
pub use schedule_listener::ScheduleListener;
pub use schedules::ScheduleRow;
pub use skipped_range::SkippedRange;
pub use sqlite::{JobQueue, OutgoingMessage, QueuedMessage};
pub use status::RunStatus;
pub use stored_text::storable;

/// The embedded migrations of `migrations/`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// A handle on the ledger database (cheap to clone: a pool).
#[derive(Debug, Clone)]
pub struct Ledger {
    backend: Backend,
}

/// Where the ledger lives.
#[derive(Debug, Clone)]
enum Backend {
    Postgres(PgPool),
    Sqlite(sqlite::SqliteLedger),
}

impl Ledger {
    /// Connects to the database at `url` with at most `max_connections`:
    /// Postgres for `postgres://` / `postgresql://` URLs, the embedded
    /// SQLite ledger for `sqlite:` URLs (the file is created if missing and
    /// owned by this process until the handle is dropped).
    ///
    /// Fails fast (5 s) so that a wrong URL or a stopped server gives one
    /// clear error at start instead of a hang.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Connect`] naming the URL (password masked) when the
    /// URL is invalid or the server does not answer;
    /// [`LedgerError::InUse`] when another process owns the SQLite file.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, LedgerError> {
        if url.starts_with("sqlite:") {
            let store = sqlite::SqliteLedger::open(url, max_connections).await?;
            return Ok(Self {
                backend: Backend::Sqlite(store),
            });
        }
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
        Ok(Self {
            backend: Backend::Postgres(pool),
        })
    }

    /// Wraps an existing Postgres pool (tests, embedding applications).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            backend: Backend::Postgres(pool),
        }
    }

    /// The Postgres pool, for callers that need their own queries; `None`
    /// for the embedded ledger.
    pub fn pg_pool(&self) -> Option<&PgPool> {
        match &self.backend {
            Backend::Postgres(pool) => Some(pool),
            Backend::Sqlite(_) => None,
        }
    }

    /// Whether this is the embedded (SQLite) ledger.
    pub fn is_embedded(&self) -> bool {
        matches!(self.backend, Backend::Sqlite(_))
    }

    /// The job queue held in the embedded database; `None` on Postgres
    /// (the distributed mode queues in RabbitMQ).
    pub fn job_queue(&self) -> Option<JobQueue> {
        match &self.backend {
            Backend::Postgres(_) => None,
            Backend::Sqlite(store) => Some(JobQueue {
                store: store.clone(),
            }),
        }
    }

    /// The Postgres pool, or the embedded ledger to hand the call to.
    fn pg(&self) -> Result<&PgPool, &sqlite::SqliteLedger> {
        match &self.backend {
            Backend::Postgres(pool) => Ok(pool),
            Backend::Sqlite(store) => Err(store),
        }
    }

    /// Applies pending migrations.
    ///
    /// Safe when several replicas start at once: sqlx takes a Postgres
    /// advisory lock for the duration of the migration run, so one replica
    /// migrates while the others wait and then find nothing to do. The
    /// embedded database has its own migrations (`sqlite-migrations/`).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Migrate`] when a migration fails or the database holds
    /// a migration this build does not know (a newer version ran here).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.migrate().await,
        };
        MIGRATOR.run(pool).await?;
        Ok(())
    }

    /// Whether the database answers a trivial query.
    pub async fn ping(&self) -> bool {
        match self.pg() {
            Ok(pool) => sqlx::query("SELECT 1").execute(pool).await.is_ok(),
            Err(lite) => lite.ping().await,
        }
    }

    /// Reads the database's clock, with this process's clock (`local`) read
    /// just before and just after: `(before, database, after)`. The
    /// embedded database has no clock of its own; its answer is the
    /// system clock.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn clock_probe(
        &self,
        local: &(dyn Fn() -> DateTime<Utc> + Send + Sync),
    ) -> Result<(DateTime<Utc>, DateTime<Utc>, DateTime<Utc>), LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(_) => {
                let before = local();
                return Ok((before, Utc::now(), local()));
            }
        };
        // Hold a connection first, so waiting for the pool is not timed:
        // only the query's round trip is.
        let mut conn = pool.acquire().await?;
        let before = local();
        let db: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *conn)
            .await?;
        let after = local();
        Ok((before, db, after))
    }

    /// Follows changes to `schedules`: Postgres `LISTEN` on `channel`, or the
    /// embedded ledger's in-process announcements.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the listener cannot connect.
    pub async fn listen_schedules(&self, channel: &str) -> Result<ScheduleListener, LedgerError> {
        match self.pg() {
            Ok(pool) => ScheduleListener::postgres(pool, channel).await,
            Err(lite) => Ok(ScheduleListener::local(lite.schedule_changes.subscribe())),
        }
    }

    /// Closes the pool (and, for the embedded ledger, gives up the file
    /// once every clone is dropped).
    pub async fn close(&self) {
        match self.pg() {
            Ok(pool) => pool.close().await,
            Err(lite) => lite.close().await,
        }
    }
}
