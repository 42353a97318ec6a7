//! Retention: finished runs older than a configured age are deleted, in
//! small batches, so `job_runs` does not grow forever.
//!
//! Each batch is one short statement (`LIMIT` rows, `FOR UPDATE SKIP
//! LOCKED`): no long table lock, and two replicas pruning at once take
//! different rows instead of waiting on each other. Unfinished runs are
//! never touched, and the newest scheduled fire of every schedule is kept
//! whatever its age: misfire recovery after downtime counts from it.

use chrono::{DateTime, Utc};

use crate::{Ledger, LedgerError};

impl Ledger {
    /// Deletes up to `batch` finished runs that finished before `cutoff`
    /// (keeping each schedule's newest scheduled fire); returns how many.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn prune_finished_runs(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        self.store.prune_finished_runs(cutoff, batch).await
    }

    /// Deletes up to `batch` records of skipped fires made before `cutoff`;
    /// returns how many.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn prune_skipped_fires(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        self.store.prune_skipped_fires(cutoff, batch).await
    }
}

/// Deletes up to `batch` rows of `table` (a record of skips, with a
/// `recorded_at` column) recorded before `cutoff`, oldest first; rows
/// another pruner holds are skipped, not waited for. Returns how many.
pub(crate) async fn prune_recorded(
    pool: &sqlx::PgPool,
    table: &'static str,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, LedgerError> {
    let done = sqlx::query(&format!(
        "DELETE FROM {table} WHERE ctid IN ( \
             SELECT ctid FROM {table} WHERE recorded_at < $1 \
             ORDER BY recorded_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
    ))
    .bind(cutoff)
    .bind(batch)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
