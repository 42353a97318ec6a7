//! The Postgres backend: the ledger of the distributed mode, shared by
//! every scheduler replica and worker.
//!
//! One module per part of the seam ([`crate::store`]), mirroring
//! `sqlite/`: runs and attempts, fire history, the outbox, schedules and
//! the views. What Postgres gives that the statements rely on: the unique
//! index `(job_name, run_key)` decides every race for a fire;
//! transaction-scoped advisory locks serialise the decisions of one
//! schedule (overlap, misfire); `FOR UPDATE SKIP LOCKED` lets replicas
//! share the outbox and the stuck-run scan without taking the same rows;
//! `now()` is the one clock every replica agrees on for leases and grace
//! periods.

mod fire_history;
mod outbox;
pub(crate) mod runs;
mod schedules;
mod views;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::PgPool;

use crate::schedule_listener::ScheduleListener;
use crate::sqlite::SqliteLedger;
use crate::store::{ClockReading, Lifecycle, LocalClock};
use crate::LedgerError;

/// The embedded migrations of `migrations/`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// The Postgres ledger: a connection pool.
#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    pub(crate) pool: PgPool,
}

/// A statement of the Postgres ledger, its values bound.
pub(crate) type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, PgArguments>;

impl PgStore {
    /// Runs `statement`, a guarded write of one row (its `WHERE` says
    /// whether the row may move): whether the row moved.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the statement fails.
    pub(crate) async fn moved(&self, statement: PgQuery<'_>) -> Result<bool, LedgerError> {
        Ok(statement.execute(&self.pool).await?.rows_affected() == 1)
    }
}

#[async_trait]
impl Lifecycle for PgStore {
    /// Safe when several replicas start at once: sqlx takes a Postgres
    /// advisory lock for the duration of the migration run, so one replica
    /// migrates while the others wait and then find nothing to do.
    async fn migrate(&self) -> Result<(), LedgerError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    async fn clock_probe(&self, local: &LocalClock<'_>) -> Result<ClockReading, LedgerError> {
        // Hold a connection first, so waiting for the pool is not timed:
        // only the query's round trip is.
        let mut conn = self.pool.acquire().await?;
        let before = local();
        let db: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *conn)
            .await?;
        let after = local();
        Ok((before, db, after))
    }

    async fn listen_schedules(&self, channel: &str) -> Result<ScheduleListener, LedgerError> {
        ScheduleListener::postgres(&self.pool, channel).await
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    fn pg_pool(&self) -> Option<&PgPool> {
        Some(&self.pool)
    }

    fn embedded(&self) -> Option<&SqliteLedger> {
        None
    }
}
