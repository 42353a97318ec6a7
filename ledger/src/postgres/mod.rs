//! The Postgres backend: the ledger of the distributed mode, shared by
//! every scheduler replica and worker.
//!
//! One module per part of the seam ([`crate::store`]), mirroring
//! `sqlite/`: runs and attempts, fire history, the outbox, schedules and
//! the views. What Postgres gives that the statements rely on: the unique
//! index `(job_name, run_key, key_instant)` decides every race for a fire
//! (`key_instant`, the partition key of the time-partitioned `job_runs`, is
//! a function of the run key: [`run_partitions`]);
//! transaction-scoped advisory locks serialise the decisions of one
//! schedule (overlap, misfire); `FOR UPDATE SKIP LOCKED` lets replicas
//! share the outbox and the stuck-run scan without taking the same rows;
//! `now()` is the one clock every replica agrees on for leases and grace
//! periods. [`pooler`] routes statements through a transaction pooler;
//! [`primary`] follows the primary among several hosts.

mod alerts;
mod fire_history;
mod follow_ups;
mod outbox;
mod partition_hints;
mod partition_map;
pub(crate) mod pooler;
pub(crate) mod primary;
mod run_limits;
mod run_logs;
mod run_partitions;
pub(crate) mod runs;
mod schedules;
mod shards;
mod views;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::PgPool;
use std::sync::Arc;

use pooler::PgRoute;

use crate::change_listener::ChangeListener;
use crate::sqlite::SqliteLedger;
use crate::store::{ClockReading, Lifecycle, LocalClock};
use crate::LedgerError;

/// The embedded migrations of `migrations/`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// The Postgres ledger: a connection pool and the route its statements
/// take ([`pooler`]), and the direct connection for what needs a session.
#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    pub(crate) route: PgRoute,
    /// Straight to Postgres, bypassing a transaction pooler: `LISTEN` and
    /// the migrations' session advisory lock. `None`: the route is direct
    /// and serves these too.
    pub(crate) direct: Option<PgPool>,
    /// With several hosts in the URL, the tasks keeping the pools on the
    /// primary ([`primary`]); dropping these senders stops them (held,
    /// never read).
    #[allow(dead_code)]
    pub(crate) followers: Arc<Vec<tokio::sync::oneshot::Sender<()>>>,
    /// The partitions of runs this process claimed or started, so finding
    /// them again by id plans one partition ([`partition_hints`]).
    pub(crate) hints: Arc<partition_hints::PartitionHints>,
    /// The day partitions, so the worker's batched statements can write
    /// one day's table instead of the parent ([`partition_map`]).
    pub(crate) tables: Arc<partition_map::PartitionMap>,
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
        Ok(statement.execute(&self.route).await?.rows_affected() == 1)
    }

    /// The pool for what needs a session of its own.
    fn session_pool(&self) -> &PgPool {
        self.direct.as_ref().unwrap_or(self.route.pool())
    }
}

#[async_trait]
impl Lifecycle for PgStore {
    /// Safe when several replicas start at once: sqlx takes a Postgres
    /// advisory lock for the duration of the migration run, so one replica
    /// migrates while the others wait and then find nothing to do. The
    /// lock is a session's, so the migrations run over the direct
    /// connection when there is one (behind a transaction pooler the
    /// unlock could reach another server connection than the lock).
    ///
    /// Then today's day partition of `job_runs` and the next days' are
    /// created (see [`run_partitions`]), so the first fires after a start
    /// or an upgrade find their day; a failure there is only logged (the
    /// runs land in the default partition and move when the schedulers'
    /// keeper creates the day).
    async fn migrate(&self) -> Result<(), LedgerError> {
        MIGRATOR.run(self.session_pool()).await?;
        let days = crate::run_partitions::days_ahead(
            Utc::now().date_naive(),
            crate::run_partitions::PARTITION_DAYS_AHEAD,
        );
        if let Err(e) = crate::store::RunPartitionStore::prepare_run_partitions(self, &days).await {
            tracing::warn!(error = %e, "creating today's run partitions failed; the schedulers retry");
        }
        Ok(())
    }

    async fn ping(&self) -> bool {
        // A simple query: no prepared statement, fine behind a pooler.
        sqlx::Executor::execute(self.route.pool(), "SELECT 1")
            .await
            .is_ok()
    }

    async fn clock_probe(&self, local: &LocalClock<'_>) -> Result<ClockReading, LedgerError> {
        // Hold a connection first, so waiting for the pool is not timed:
        // only the query's round trip is. A simple query is one round trip
        // on either route (no prepared statement).
        let mut conn = self.route.pool().acquire().await?;
        let before = local();
        let row = sqlx::Executor::fetch_one(&mut *conn, "SELECT now()").await?;
        let after = local();
        let db: DateTime<Utc> = sqlx::Row::try_get(&row, 0)?;
        Ok((before, db, after))
    }

    async fn listen_schedules(&self, channel: &str) -> Result<ChangeListener, LedgerError> {
        // LISTEN belongs to a session: over the direct connection when
        // the route is a pooler's.
        ChangeListener::postgres(self.session_pool(), channel).await
    }

    /// `LISTEN` needs a session: on the direct pool behind a pooler.
    async fn listen_cancels(&self) -> Result<ChangeListener, LedgerError> {
        ChangeListener::postgres(self.session_pool(), crate::cancel::CANCEL_CHANNEL).await
    }

    async fn close(&self) {
        self.route.pool().close().await;
        if let Some(direct) = &self.direct {
            direct.close().await;
        }
    }

    fn pg_pool(&self) -> Option<&PgPool> {
        Some(self.route.pool())
    }

    fn embedded(&self) -> Option<&SqliteLedger> {
        None
    }
}
