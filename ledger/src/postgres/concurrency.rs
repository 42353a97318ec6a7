//! Concurrency limits on Postgres (`crate::concurrency`): one transaction
//! per limited start, serialised per limit key by a transaction-scoped
//! advisory lock.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::runs::startable;
use super::PgStore;
use crate::attempt_batch::BeginRequest;
use crate::concurrency::ConcurrencyLimit;
use crate::runs::AttemptStart;
use crate::store::LimitStore;
use crate::LedgerError;

/// The lock serialising the starts of one limit key: the two-key form of
/// the advisory locks (class 22), apart from the claim path's one-key
/// locks and the lease passes' class 21. Two keys sharing a hash only
/// wait for each other; each still counts its own slots.
const KEY_LOCK: &str = "SELECT pg_advisory_xact_lock(22, hashtext($1))";

/// The run of `$1`/`$2` (its partition named by the key), if no attempt is
/// running it (the batched start's guard).
macro_rules! this_run_if_startable {
    () => {
        concat!(
            "j.job_name = $1 AND j.run_key = $2 AND j.key_instant = belfry_key_instant($1, $2) AND ",
            startable!()
        )
    };
}

#[async_trait]
impl LimitStore for PgStore {
    async fn begin_limited(
        &self,
        request: &BeginRequest,
        limit: &ConcurrencyLimit,
    ) -> Result<Option<AttemptStart>, LedgerError> {
        let mut tx = self.route.begin().await?;
        // Held to the commit: the count below and the start that follows
        // are one step for every other start of this key, so two workers
        // never both take the last slot.
        sqlx::query(KEY_LOCK)
            .bind(&limit.key)
            .execute(self.route.on(&mut tx))
            .await?;
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM job_runs \
             WHERE limit_key = $1 AND status = 'running' AND limit_key IS NOT NULL \
               AND lease_until > now()",
        )
        .bind(&limit.key)
        .fetch_one(self.route.on(&mut tx))
        .await?;
        if running >= i64::from(limit.max) {
            // No attempt used: the run goes back to the outbox, which
            // publishes it again after the wait.
            let waiting: Option<Uuid> = sqlx::query_scalar(concat!(
                "UPDATE job_runs j SET status = 'retrying', \
                     next_dispatch_at = now() + make_interval(secs => $3), last_error = $4, \
                     updated_at = now() \
                 WHERE ",
                this_run_if_startable!(),
                " RETURNING j.id"
            ))
            .bind(&request.job_name)
            .bind(&request.run_key)
            .bind(limit.wait.as_secs_f64())
            .bind(limit.waiting_reason(running))
            .fetch_optional(self.route.on(&mut tx))
            .await?;
            tx.commit().await?;
            return Ok(waiting.map(|id| AttemptStart::Waiting { id, running }));
        }
        let started: Option<(Uuid, i32, DateTime<Utc>)> = sqlx::query_as(concat!(
            "UPDATE job_runs j SET status = 'running', attempts = j.attempts + 1, \
                 started_at = COALESCE(j.started_at, now()), worker = $3, next_dispatch_at = NULL, \
                 lease_until = now() + make_interval(secs => $4), updated_at = now(), limit_key = $5 \
             WHERE ",
            this_run_if_startable!(),
            " RETURNING j.id, j.attempts, j.key_instant"
        ))
        .bind(&request.job_name)
        .bind(&request.run_key)
        .bind(&request.worker)
        .bind(request.lease.as_secs_f64())
        .bind(&limit.key)
        .fetch_optional(self.route.on(&mut tx))
        .await?;
        tx.commit().await?;
        // Its outcome is written to its partition, as a batched start's.
        self.hints
            .remember(started.iter().map(|(id, _, at)| (*id, *at)));
        Ok(started.map(|(id, attempt, _)| AttemptStart::Started { id, attempt }))
    }
}
