//! The outbox on Postgres: claimed runs due to be published (again),
//! taken with `FOR UPDATE SKIP LOCKED` under a lease so that replicas
//! share the work without publishing a run twice at once.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PgStore;
use crate::runs::{run_columns_of, RunRecord};
use crate::store::OutboxStore;
use crate::LedgerError;

#[async_trait]
impl OutboxStore for PgStore {
    async fn take_due(&self, limit: i64, lease: Duration) -> Result<Vec<RunRecord>, LedgerError> {
        let pool = &self.route;
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
            run_columns_of("j")
        ))
        .bind(limit)
        .bind(lease_ms)
        .fetch_all(pool)
        .await?;
        Ok(rows)
    }

    async fn mark_republished(&self, id: Uuid, lease: DateTime<Utc>) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE job_runs SET \
                 status = CASE WHEN status = 'claimed' THEN 'dispatched' ELSE status END, \
                 dispatched_at = now(), next_dispatch_at = NULL, updated_at = now() \
             WHERE id = $1 AND status IN ('claimed', 'retrying') AND next_dispatch_at = $2",
        );
        self.moved(update.bind(id).bind(lease)).await
    }

    async fn postpone_dispatch(
        &self,
        id: Uuid,
        lease: DateTime<Utc>,
        at: DateTime<Utc>,
    ) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE job_runs SET next_dispatch_at = $2 \
             WHERE id = $1 AND status IN ('claimed', 'retrying') AND next_dispatch_at = $3",
        );
        self.moved(update.bind(id).bind(at).bind(lease)).await
    }
}
