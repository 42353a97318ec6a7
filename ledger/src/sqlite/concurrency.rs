//! Concurrency limits on the embedded ledger (`crate::concurrency`): the
//! count and the start in one write transaction (`BEGIN IMMEDIATE`: the
//! file's writers take turns, so the count cannot go stale before the
//! start).

use async_trait::async_trait;
use uuid::Uuid;

use super::runs::this_run_if_startable;
use super::{now, now_plus, SqliteLedger};
use crate::attempt_batch::BeginRequest;
use crate::concurrency::ConcurrencyLimit;
use crate::runs::AttemptStart;
use crate::store::LimitStore;
use crate::LedgerError;

#[async_trait]
impl LimitStore for SqliteLedger {
    async fn begin_limited(
        &self,
        request: &BeginRequest,
        limit: &ConcurrencyLimit,
    ) -> Result<Option<AttemptStart>, LedgerError> {
        let at = now();
        let mut tx = self.write_tx().await?;
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM job_runs \
             WHERE limit_key = ?1 AND status = 'running' AND limit_key IS NOT NULL \
               AND lease_until > ?2",
        )
        .bind(&limit.key)
        .bind(&at)
        .fetch_one(&mut *tx)
        .await?;
        if running >= i64::from(limit.max) {
            let waiting: Option<Uuid> = sqlx::query_scalar(concat!(
                "UPDATE job_runs SET status = 'retrying', next_dispatch_at = ?3, last_error = ?5, \
                     updated_at = ?4 \
                 WHERE ",
                this_run_if_startable!(),
                " RETURNING id"
            ))
            .bind(&request.job_name)
            .bind(&request.run_key)
            .bind(now_plus(limit.wait))
            .bind(&at)
            .bind(limit.waiting_reason(running))
            .fetch_optional(&mut *tx)
            .await?;
            tx.commit().await?;
            return Ok(waiting.map(|id| AttemptStart::Waiting { id, running }));
        }
        let started: Option<(Uuid, i32)> = sqlx::query_as(concat!(
            "UPDATE job_runs SET status = 'running', attempts = attempts + 1, \
                 started_at = COALESCE(started_at, ?4), worker = ?3, next_dispatch_at = NULL, \
                 lease_until = ?5, updated_at = ?4, limit_key = ?6 \
             WHERE ",
            this_run_if_startable!(),
            " RETURNING id, attempts"
        ))
        .bind(&request.job_name)
        .bind(&request.run_key)
        .bind(&request.worker)
        .bind(&at)
        .bind(now_plus(request.lease))
        .bind(&limit.key)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(started.map(|(id, attempt)| AttemptStart::Started { id, attempt }))
    }
}
