//! The outbox: runs waiting to be published, and taking them safely.
//!
//! A run waits in the outbox (`next_dispatch_at` set) while it is `claimed`
//! and not yet confirmed by the broker, or `retrying` with its back-off
//! handed to the ledger. Whoever publishes it (the claiming replica, or any
//! replica's reconciler once `next_dispatch_at` has passed) takes it with
//! [`Ledger::take_due`], which locks the rows with `FOR UPDATE SKIP LOCKED`
//! and pushes their `next_dispatch_at` one lease ahead in the same
//! transaction: two replicas never publish the same row at once, and a
//! replica that dies while publishing only delays the row by one lease.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::runs::{RunRecord, RUN_COLUMNS};
use crate::{Ledger, LedgerError};

impl Ledger {
    /// Takes up to `limit` runs whose `next_dispatch_at` has passed, oldest
    /// first, leasing each for `lease` (their `next_dispatch_at` moves to
    /// `now() + lease`).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn take_due(
        &self,
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<RunRecord>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.take_due(limit, lease).await,
        };
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        // One statement: the CTE locks due rows (skipping rows another
        // replica holds), the UPDATE leases them; the lock is held until the
        // statement commits, so no two replicas take the same row.
        let rows = sqlx::query_as(&format!(
            "WITH due AS ( \
                 SELECT id FROM job_runs \
                 WHERE next_dispatch_at <= now() AND status IN ('claimed', 'retrying') \
                 ORDER BY next_dispatch_at \
                 LIMIT $1 \
                 FOR UPDATE SKIP LOCKED) \
             UPDATE job_runs j SET next_dispatch_at = now() + make_interval(secs => $2::double precision / 1000) \
             FROM due WHERE j.id = due.id \
             RETURNING {}",
            RUN_COLUMNS
                .split(", ")
                .map(|c| format!("j.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .bind(limit)
        .bind(lease_ms)
        .fetch_all(pool)
        .await?;
        Ok(rows)
    }

    /// Records that a run taken from the outbox (with lease `lease`, its
    /// `next_dispatch_at` as [`Ledger::take_due`] returned it) was confirmed
    /// by the broker:
    /// a `claimed` run becomes `dispatched`; a `retrying` run leaves the
    /// outbox and waits for its worker. Returns whether the row moved.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn mark_republished(
        &self,
        id: Uuid,
        lease: DateTime<Utc>,
    ) -> Result<bool, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.mark_republished(id, lease).await,
        };
        let done = sqlx::query(
            "UPDATE job_runs SET \
                 status = CASE WHEN status = 'claimed' THEN 'dispatched' ELSE status END, \
                 dispatched_at = now(), next_dispatch_at = NULL, updated_at = now() \
             WHERE id = $1 AND status IN ('claimed', 'retrying') AND next_dispatch_at = $2",
        )
        .bind(id)
        .bind(lease)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Moves a run's next publish to `at` (a failed publish is tried again
    /// later), if it still holds `lease`. Returns whether the row moved.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn postpone_dispatch(
        &self,
        id: Uuid,
        lease: DateTime<Utc>,
        at: DateTime<Utc>,
    ) -> Result<bool, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.postpone_dispatch(id, lease, at).await,
        };
        let done = sqlx::query(
            "UPDATE job_runs SET next_dispatch_at = $2 \
             WHERE id = $1 AND status IN ('claimed', 'retrying') AND next_dispatch_at = $3",
        )
        .bind(id)
        .bind(at)
        .bind(lease)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}
