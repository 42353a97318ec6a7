//! The outbox on the embedded ledger: the statements of [`crate::outbox`]
//! in SQLite's dialect. Taking due runs is one `UPDATE ... RETURNING` over a
//! sub-select: SQLite runs it under the database's write lock, so two takers
//! never get the same row (what `FOR UPDATE SKIP LOCKED` gives on Postgres).

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use async_trait::async_trait;

use super::{now, now_plus, ts, SqliteLedger};
use crate::runs::{RunRecord, RUN_COLUMNS};
use crate::store::OutboxStore;
use crate::LedgerError;

#[async_trait]
impl OutboxStore for SqliteLedger {
    async fn take_due(&self, limit: i64, lease: Duration) -> Result<Vec<RunRecord>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "UPDATE job_runs SET next_dispatch_at = ?3 \
             WHERE id IN (SELECT id FROM job_runs \
                          WHERE next_dispatch_at <= ?2 AND status IN ('claimed', 'retrying') \
                          ORDER BY next_dispatch_at LIMIT ?1) \
             RETURNING {RUN_COLUMNS}"
        ))
        .bind(limit)
        .bind(now())
        .bind(now_plus(lease))
        .fetch_all(&self.writer)
        .await?)
    }

    async fn mark_republished(&self, id: Uuid, lease: DateTime<Utc>) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE job_runs SET \
                 status = CASE WHEN status = 'claimed' THEN 'dispatched' ELSE status END, \
                 dispatched_at = ?3, next_dispatch_at = NULL, updated_at = ?3 \
             WHERE id = ?1 AND status IN ('claimed', 'retrying') AND next_dispatch_at = ?2",
        );
        self.moved(update.bind(id).bind(ts(lease)).bind(now()))
            .await
    }

    async fn postpone_dispatch(
        &self,
        id: Uuid,
        lease: DateTime<Utc>,
        at: DateTime<Utc>,
    ) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE job_runs SET next_dispatch_at = ?2 \
             WHERE id = ?1 AND status IN ('claimed', 'retrying') AND next_dispatch_at = ?3",
        );
        self.moved(update.bind(id).bind(ts(at)).bind(ts(lease)))
            .await
    }
}
