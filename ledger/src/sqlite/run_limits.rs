//! Run limits on the embedded ledger (`crate::run_limits`): the counts and
//! the start in one write transaction (`BEGIN IMMEDIATE`: the file's
//! writers take turns, so no count can go stale before the start). Every
//! instant is this process's clock, read with the write lock held.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

use super::runs::this_run_if_startable;
use super::{now, ts, SqliteLedger};
use crate::attempt_batch::BeginRequest;
use crate::run_limits::{LimitKind, RunLimits};
use crate::runs::AttemptStart;
use crate::store::LimitStore;
use crate::LedgerError;

/// `at + d`, saturating (a window or a wait is at most a day).
fn plus(at: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(at)
}

/// An instant as [`ts`] wrote it.
fn parse(text: &str) -> Result<DateTime<Utc>, LedgerError> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| LedgerError::Corrupt(format!("rate limit instant {text:?}: {e}")))
}

/// Puts the run back to wait until `until` without using an attempt; the
/// outbox publishes it again then.
async fn wait(
    tx: &mut Transaction<'static, Sqlite>,
    request: &BeginRequest,
    until: DateTime<Utc>,
    reason: String,
    limit: LimitKind,
    running: i64,
) -> Result<Option<AttemptStart>, LedgerError> {
    let waiting: Option<Uuid> = sqlx::query_scalar(concat!(
        "UPDATE job_runs SET status = 'retrying', next_dispatch_at = ?3, last_error = ?5, \
             updated_at = ?4 \
         WHERE ",
        this_run_if_startable!(),
        " RETURNING id"
    ))
    .bind(&request.job_name)
    .bind(&request.run_key)
    .bind(ts(until))
    .bind(now())
    .bind(reason)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(waiting.map(|id| AttemptStart::Waiting { id, limit, running }))
}

#[async_trait]
impl LimitStore for SqliteLedger {
    async fn begin_limited(
        &self,
        request: &BeginRequest,
        limits: &RunLimits,
    ) -> Result<Option<AttemptStart>, LedgerError> {
        let mut tx = self.write_tx().await?;
        // Read with the writer's lock held: every start of every key
        // after this one sees a later instant.
        let at = Utc::now();
        if let Some(limit) = &limits.concurrency {
            let running: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM job_runs \
                 WHERE limit_key = ?1 AND status = 'running' AND limit_key IS NOT NULL \
                   AND lease_until > ?2",
            )
            .bind(&limit.key)
            .bind(ts(at))
            .fetch_one(&mut *tx)
            .await?;
            if running >= i64::from(limit.max) {
                let until = plus(at, limit.wait);
                let reason = limit.waiting_reason(running);
                let waiting = wait(
                    &mut tx,
                    request,
                    until,
                    reason,
                    LimitKind::Concurrency,
                    running,
                )
                .await?;
                return crate::run_limits::settle(tx, waiting).await;
            }
        }
        // As on Postgres: after an empty window, the key's turns start
        // again from the window.
        let mut idle = false;
        if let Some(rate) = &limits.rate {
            let window_start =
                at - chrono::Duration::from_std(rate.per).unwrap_or(chrono::Duration::zero());
            sqlx::query("DELETE FROM rate_limit_starts WHERE limit_key = ?1 AND started_at <= ?2")
                .bind(&rate.key)
                .bind(ts(window_start))
                .execute(&mut *tx)
                .await?;
            let (started, oldest): (i64, Option<String>) = sqlx::query_as(
                "SELECT count(*), min(started_at) FROM rate_limit_starts WHERE limit_key = ?1",
            )
            .bind(&rate.key)
            .fetch_one(&mut *tx)
            .await?;
            if started >= i64::from(rate.starts) {
                // The next turn of the key (see `crate::rate_limit`): not
                // before the oldest start leaves the window, `spacing`
                // after the previous waiting run's.
                let free = match oldest {
                    Some(o) => plus(parse(&o)?, rate.per).max(at),
                    None => at,
                };
                let queued: Option<String> = sqlx::query_scalar(
                    "SELECT next_turn FROM rate_limit_turns WHERE limit_key = ?1",
                )
                .bind(&rate.key)
                .fetch_optional(&mut *tx)
                .await?;
                let turn = match queued {
                    Some(q) => parse(&q)?.max(free),
                    None => free,
                };
                sqlx::query(
                    "INSERT INTO rate_limit_turns (limit_key, next_turn) VALUES (?1, ?2) \
                     ON CONFLICT (limit_key) DO UPDATE SET next_turn = excluded.next_turn",
                )
                .bind(&rate.key)
                .bind(ts(plus(turn, rate.spacing())))
                .execute(&mut *tx)
                .await?;
                let reason = rate.waiting_reason(started);
                let waiting =
                    wait(&mut tx, request, turn, reason, LimitKind::Rate, started).await?;
                return crate::run_limits::settle(tx, waiting).await;
            }
            idle = started == 0;
        }
        let limit_key = limits.concurrency.as_ref().map(|l| l.key.as_str());
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
        .bind(ts(at))
        .bind(ts(plus(at, request.lease)))
        .bind(limit_key)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((id, attempt)) = started else {
            // Not startable: nothing was written; the caller's full path
            // says why.
            tx.rollback().await?;
            return Ok(None);
        };
        if let Some(rate) = &limits.rate {
            sqlx::query("INSERT INTO rate_limit_starts (limit_key, started_at) VALUES (?1, ?2)")
                .bind(&rate.key)
                .bind(ts(at))
                .execute(&mut *tx)
                .await?;
            if idle {
                sqlx::query("DELETE FROM rate_limit_turns WHERE limit_key = ?1")
                    .bind(&rate.key)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(Some(AttemptStart::Started { id, attempt }))
    }

    async fn prune_rate_limits(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, LedgerError> {
        let mut tx = self.write_tx().await?;
        let starts = sqlx::query(
            "DELETE FROM rate_limit_starts WHERE rowid IN \
               (SELECT rowid FROM rate_limit_starts WHERE started_at < ?1 LIMIT ?2)",
        )
        .bind(ts(before))
        .bind(limit)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM rate_limit_turns WHERE next_turn < ?1")
            .bind(ts(before))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(starts)
    }
}
