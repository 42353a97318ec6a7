//! Run limits on Postgres (`crate::run_limits`): one transaction per
//! limited start, serialised per key by transaction-scoped advisory locks
//! (class 22 for a concurrency key, 24 for a rate key; taken in that order
//! by every start, so two starts never wait for each other in a cycle).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::runs::startable;
use super::PgStore;
use crate::attempt_batch::BeginRequest;
use crate::run_limits::{LimitKind, RunLimits};
use crate::runs::AttemptStart;
use crate::store::LimitStore;
use crate::LedgerError;

/// The lock serialising the starts of one concurrency key: the two-key
/// form of the advisory locks (class 22), apart from the claim path's
/// one-key locks and the lease passes' class 21. Two keys sharing a hash
/// only wait for each other; each still counts its own slots.
const KEY_LOCK: &str = "SELECT pg_advisory_xact_lock(22, hashtext($1))";

/// The lock serialising the starts of one rate key (class 24; 23 is the
/// message-id lock of a hand-published message's first start, taken
/// before any row lock too).
const RATE_LOCK: &str = "SELECT pg_advisory_xact_lock(24, hashtext($1))";

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

/// Puts the run back to wait until `until` (an instant of the database's
/// clock) without using an attempt; the outbox publishes it again then.
async fn wait(
    tx: &mut Transaction<'static, Postgres>,
    store: &PgStore,
    request: &BeginRequest,
    until: DateTime<Utc>,
    reason: String,
    limit: LimitKind,
    running: i64,
) -> Result<Option<AttemptStart>, LedgerError> {
    let waiting: Option<Uuid> = sqlx::query_scalar(concat!(
        "UPDATE job_runs j SET status = 'retrying', \
             next_dispatch_at = $3, last_error = $4, \
             updated_at = now() \
         WHERE ",
        this_run_if_startable!(),
        " RETURNING j.id"
    ))
    .bind(&request.job_name)
    .bind(&request.run_key)
    .bind(until)
    .bind(reason)
    .fetch_optional(store.route.on(tx))
    .await?;
    Ok(waiting.map(|id| AttemptStart::Waiting { id, limit, running }))
}

#[async_trait]
impl LimitStore for PgStore {
    async fn begin_limited(
        &self,
        request: &BeginRequest,
        limits: &RunLimits,
    ) -> Result<Option<AttemptStart>, LedgerError> {
        let mut tx = self.route.begin().await?;
        if let Some(limit) = &limits.concurrency {
            // Held to the commit: the count below and the start that
            // follows are one step for every other start of this key, so
            // two workers never both take the last slot.
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
                let reason = limit.waiting_reason(running);
                let until: DateTime<Utc> =
                    sqlx::query_scalar("SELECT clock_timestamp() + make_interval(secs => $1)")
                        .bind(limit.wait.as_secs_f64())
                        .fetch_one(self.route.on(&mut tx))
                        .await?;
                let waiting = wait(
                    &mut tx,
                    self,
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
        // Whether the window was empty: then no backlog is being paced
        // (waiting runs coming back at their turns keep the window busy),
        // and the key's turns start again from the window — a cursor left
        // far ahead by a cancelled backlog would otherwise only grow. (Not
        // on every start that leaves room: with a backlog draining at the
        // limit, that restarted the turns mid-drain and new waiters landed
        // on turns already given, measured as dips of the rate.)
        let mut idle = false;
        if let Some(rate) = &limits.rate {
            // Held to the commit, as the concurrency key's lock: the
            // window's count and the start it allows are one step. The
            // instants are `clock_timestamp()` (read with the lock held),
            // not the transaction's `now()`, which may be older by the
            // time spent waiting for the lock.
            sqlx::query(RATE_LOCK)
                .bind(&rate.key)
                .execute(self.route.on(&mut tx))
                .await?;
            let per = rate.per.as_secs_f64();
            sqlx::query(
                "DELETE FROM rate_limit_starts WHERE limit_key = $1 \
                   AND started_at <= clock_timestamp() - make_interval(secs => $2)",
            )
            .bind(&rate.key)
            .bind(per)
            .execute(self.route.on(&mut tx))
            .await?;
            let (started, oldest): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
                "SELECT count(*), min(started_at) FROM rate_limit_starts WHERE limit_key = $1",
            )
            .bind(&rate.key)
            .fetch_one(self.route.on(&mut tx))
            .await?;
            if started >= i64::from(rate.starts) {
                // The next turn of the key: not before the oldest start
                // leaves the window, and `spacing` after the turn given
                // to the previous waiting run.
                // (`next_turn` is the turn after the one returned; the
                // turn is returned as an instant, so it does not drift by
                // the time between this statement and the next.)
                let turn: DateTime<Utc> = sqlx::query_scalar(
                    "INSERT INTO rate_limit_turns AS t (limit_key, next_turn) \
                     VALUES ($1, GREATEST($2::timestamptz + make_interval(secs => $3), \
                                          clock_timestamp()) + make_interval(secs => $4)) \
                     ON CONFLICT (limit_key) DO UPDATE SET next_turn = \
                       GREATEST(t.next_turn + make_interval(secs => $4), EXCLUDED.next_turn) \
                     RETURNING t.next_turn - make_interval(secs => $4)",
                )
                .bind(&rate.key)
                .bind(oldest)
                .bind(per)
                .bind(rate.spacing().as_secs_f64())
                .fetch_one(self.route.on(&mut tx))
                .await?;
                let reason = rate.waiting_reason(started);
                let waiting = wait(
                    &mut tx,
                    self,
                    request,
                    turn,
                    reason,
                    LimitKind::Rate,
                    started,
                )
                .await?;
                return crate::run_limits::settle(tx, waiting).await;
            }
            idle = started == 0;
        }
        let limit_key = limits.concurrency.as_ref().map(|l| l.key.as_str());
        let started: Option<(Uuid, i32, DateTime<Utc>)> = sqlx::query_as(concat!(
            "UPDATE job_runs j SET status = 'running', attempts = j.attempts + 1, \
                 started_at = COALESCE(j.started_at, clock_timestamp()), worker = $3, \
                 next_dispatch_at = NULL, lease_until = now() + make_interval(secs => $4), \
                 updated_at = now(), limit_key = $5 \
             WHERE ",
            this_run_if_startable!(),
            " RETURNING j.id, j.attempts, j.key_instant"
        ))
        .bind(&request.job_name)
        .bind(&request.run_key)
        .bind(&request.worker)
        .bind(request.lease.as_secs_f64())
        .bind(limit_key)
        .fetch_optional(self.route.on(&mut tx))
        .await?;
        let Some((id, attempt, key_instant)) = started else {
            // Not startable: nothing was written (no start is logged for
            // a run that did not start); the caller's full path says why.
            tx.rollback().await?;
            return Ok(None);
        };
        if let Some(rate) = &limits.rate {
            sqlx::query(
                "INSERT INTO rate_limit_starts (limit_key, started_at) \
                 VALUES ($1, clock_timestamp())",
            )
            .bind(&rate.key)
            .execute(self.route.on(&mut tx))
            .await?;
            if idle {
                sqlx::query("DELETE FROM rate_limit_turns WHERE limit_key = $1")
                    .bind(&rate.key)
                    .execute(self.route.on(&mut tx))
                    .await?;
            }
        }
        tx.commit().await?;
        // Its outcome is written to its partition, as a batched start's.
        self.hints.remember([(id, key_instant)]);
        Ok(Some(AttemptStart::Started { id, attempt }))
    }

    async fn prune_rate_limits(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, LedgerError> {
        // A batch, as every pruning statement: a short delete, whatever
        // was left behind.
        let starts = sqlx::query(
            "DELETE FROM rate_limit_starts WHERE ctid IN \
               (SELECT ctid FROM rate_limit_starts WHERE started_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(before)
        .bind(limit)
        .execute(&self.route)
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM rate_limit_turns WHERE next_turn < $1")
            .bind(before)
            .execute(&self.route)
            .await?;
        Ok(starts)
    }
}
