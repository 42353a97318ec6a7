//! Runs on Postgres: the claim (`INSERT ... ON CONFLICT DO NOTHING` on
//! `UNIQUE(job_name, run_key)`, one statement for a batch), dispatch,
//! attempts under leases (guarded `UPDATE`s, so a duplicate delivery never
//! moves a finished run back) and lookups.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use belfry_protocol::JobMessage;
use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use super::PgStore;
use crate::attempt_batch::{BeginRequest, EndRequest};
use crate::runs::AttemptEntry;
use crate::runs::NewRun;
use crate::runs::{options_json, OnRunConflict, RunRecord, RunState, RUN_COLUMNS};
use crate::status::waiting_statuses;
use crate::status::WAITING;
use crate::store::RunStore;
use crate::LedgerError;
use crate::RunStatus;

#[async_trait]
impl RunStore for PgStore {
    async fn mark_dispatched(&self, id: Uuid) -> Result<bool, LedgerError> {
        let pool = &self.pool;
        let done = sqlx::query(
            "UPDATE job_runs SET status = 'dispatched', dispatched_at = now(), \
                 next_dispatch_at = NULL, updated_at = now() \
             WHERE id = $1 AND status = 'claimed'",
        )
        .bind(id)
        .execute(pool)
        .await?;
        // dispatched_at is also worth having when the worker was faster.
        if done.rows_affected() == 0 {
            sqlx::query(
                "UPDATE job_runs SET dispatched_at = now() WHERE id = $1 AND dispatched_at IS NULL",
            )
            .bind(id)
            .execute(pool)
            .await?;
        }
        Ok(done.rows_affected() == 1)
    }

    async fn mark_dead(&self, id: Uuid, reason: &str) -> Result<bool, LedgerError> {
        let pool = &self.pool;
        let done = sqlx::query(&format!(
            "UPDATE job_runs SET status = 'dead', last_error = $2, finished_at = now(), \
                 updated_at = now() \
             WHERE id = $1 AND status IN {WAITING}"
        ))
        .bind(id)
        .bind(reason)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn hand_back(&self, id: Uuid, attempt: i32, reason: &str) -> Result<bool, LedgerError> {
        let pool = &self.pool;
        let done = sqlx::query(
            "UPDATE job_runs SET status = 'retrying', last_error = $2, lease_until = NULL, \
                 updated_at = now() \
             WHERE id = $1 AND status = 'running' AND attempts = $3",
        )
        .bind(id)
        .bind(reason)
        .bind(attempt)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn run(&self, id: Uuid) -> Result<Option<RunRecord>, LedgerError> {
        let pool = &self.pool;
        Ok(
            sqlx::query_as(&format!("SELECT {RUN_COLUMNS} FROM job_runs WHERE id = $1"))
                .bind(id)
                .fetch_optional(pool)
                .await?,
        )
    }

    async fn run_by_key(
        &self,
        job_name: &str,
        run_key: &str,
    ) -> Result<Option<RunRecord>, LedgerError> {
        let pool = &self.pool;
        Ok(sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE job_name = $1 AND run_key = $2"
        ))
        .bind(job_name)
        .bind(run_key)
        .fetch_optional(pool)
        .await?)
    }

    async fn runs_of(&self, job_name: &str, limit: i64) -> Result<Vec<RunRecord>, LedgerError> {
        let pool = &self.pool;
        Ok(sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE job_name = $1 \
             ORDER BY scheduled_at ASC LIMIT $2"
        ))
        .bind(job_name)
        .bind(limit)
        .fetch_all(pool)
        .await?)
    }

    async fn claim_many(&self, runs: &[NewRun]) -> Result<HashSet<Uuid>, LedgerError> {
        claim_rows(&self.pool, runs).await
    }

    async fn mark_dispatched_many(&self, ids: &[Uuid]) -> Result<u64, LedgerError> {
        let pool = &self.pool;
        if ids.is_empty() {
            return Ok(0);
        }
        // Every expression reads the row as it was, so `status = 'claimed'`
        // decides the whole update of a row at once. The rows are locked in
        // id order first: the workers' batched attempt statements lock in
        // the same order, so the two wait for each other instead of
        // deadlocking.
        let done = sqlx::query(
            "WITH locked AS ( \
                 SELECT id FROM job_runs \
                 WHERE id = ANY($1) AND (status = 'claimed' OR dispatched_at IS NULL) \
                 ORDER BY id FOR UPDATE) \
             UPDATE job_runs j SET \
                 status = CASE WHEN j.status = 'claimed' THEN 'dispatched' ELSE j.status END, \
                 next_dispatch_at = CASE WHEN j.status = 'claimed' THEN NULL ELSE j.next_dispatch_at END, \
                 updated_at = CASE WHEN j.status = 'claimed' THEN now() ELSE j.updated_at END, \
                 dispatched_at = COALESCE(j.dispatched_at, now()) \
             FROM locked WHERE j.id = locked.id \
               AND (j.status = 'claimed' OR j.dispatched_at IS NULL)",
        )
        .bind(ids)
        .execute(pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn begin_batch(
        &self,
        batch: &[BeginRequest],
    ) -> Result<Vec<Option<(Uuid, i32)>>, LedgerError> {
        let pool = &self.pool;
        let names: Vec<&str> = batch.iter().map(|r| r.job_name.as_str()).collect();
        let keys: Vec<&str> = batch.iter().map(|r| r.run_key.as_str()).collect();
        let workers: Vec<&str> = batch.iter().map(|r| r.worker.as_str()).collect();
        let leases: Vec<f64> = batch.iter().map(|r| r.lease.as_secs_f64()).collect();
        // Same guard as `try_begin`, row by row. A run named twice in one
        // batch is updated once; the other request gets no row and takes
        // the slow path, which sees the run held. Rows are locked in id
        // order first (as the schedulers' batched `dispatched` update and
        // `end_batch` do), so concurrent batches wait instead of
        // deadlocking.
        let rows = sqlx::query(
            concat!("WITH b AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[]) \
                        AS b(job_name, run_key, worker, lease)), \
                  locked AS ( \
                 SELECT j.id FROM job_runs j JOIN b ON j.job_name = b.job_name AND j.run_key = b.run_key \
                 WHERE j.status IN ", waiting_statuses!(), " \
                    OR (j.status = 'running' AND (j.lease_until IS NULL OR j.lease_until < now())) \
                 ORDER BY j.id FOR UPDATE OF j) \
             UPDATE job_runs j SET status = 'running', attempts = j.attempts + 1, \
                 started_at = COALESCE(j.started_at, now()), worker = b.worker, next_dispatch_at = NULL, \
                 lease_until = now() + make_interval(secs => b.lease), updated_at = now() \
             FROM b, locked \
             WHERE j.id = locked.id AND j.job_name = b.job_name AND j.run_key = b.run_key \
               AND (j.status IN ", waiting_statuses!(), " \
                    OR (j.status = 'running' AND (j.lease_until IS NULL OR j.lease_until < now()))) \
             RETURNING j.job_name, j.run_key, j.id, j.attempts"),
        )
        .bind(&names)
        .bind(&keys)
        .bind(&workers)
        .bind(&leases)
        .fetch_all(pool)
        .await?;
        let mut started = std::collections::HashMap::with_capacity(rows.len());
        for r in rows {
            let name: String = r.try_get("job_name")?;
            let key: String = r.try_get("run_key")?;
            started.insert((name, key), (r.try_get("id")?, r.try_get("attempts")?));
        }
        Ok(batch
            .iter()
            .map(|r| started.remove(&(r.job_name.clone(), r.run_key.clone())))
            .collect())
    }

    async fn end_batch(&self, batch: &[EndRequest]) -> Result<Vec<bool>, LedgerError> {
        let pool = &self.pool;
        let ids: Vec<Uuid> = batch.iter().map(|r| r.id).collect();
        let statuses: Vec<&str> = batch.iter().map(|r| r.status.as_str()).collect();
        let errors: Vec<Option<&str>> = batch.iter().map(|r| r.last_error.as_deref()).collect();
        let terminal: Vec<bool> = batch.iter().map(|r| r.status.is_terminal()).collect();
        let entries = batch
            .iter()
            .map(|r| serde_json::to_value(&r.entry))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LedgerError::Corrupt(format!("attempt entry: {e}")))?;
        let redispatch: Vec<Option<DateTime<Utc>>> =
            batch.iter().map(|r| r.redispatch_at).collect();
        let attempts: Vec<i32> = batch.iter().map(|r| r.entry.attempt).collect();
        // Same guard as `end_attempt`: only the attempt that holds the run
        // writes its outcome. Rows are locked in id order first (see
        // `begin_batch`).
        let rows = sqlx::query(
            "WITH b AS (SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bool[], $5::jsonb[], \
                        $6::timestamptz[], $7::int[]) \
                        AS b(id, status, last_error, terminal, entry, redispatch_at, attempt)), \
                  locked AS ( \
                 SELECT j.id FROM job_runs j JOIN b ON j.id = b.id \
                 WHERE j.status = 'running' AND j.attempts = b.attempt \
                 ORDER BY j.id FOR UPDATE OF j) \
             UPDATE job_runs j SET status = b.status, last_error = b.last_error, \
                 finished_at = CASE WHEN b.terminal THEN now() ELSE NULL END, \
                 attempt_log = j.attempt_log || jsonb_build_array(b.entry), \
                 next_dispatch_at = b.redispatch_at, lease_until = NULL, updated_at = now() \
             FROM b, locked \
             WHERE j.id = locked.id AND j.id = b.id AND j.status = 'running' AND j.attempts = b.attempt \
             RETURNING j.id, j.attempts",
        )
        .bind(&ids)
        .bind(&statuses)
        .bind(&errors)
        .bind(&terminal)
        .bind(&entries)
        .bind(&redispatch)
        .bind(&attempts)
        .fetch_all(pool)
        .await?;
        let mut written = std::collections::HashSet::with_capacity(rows.len());
        for r in rows {
            written.insert((
                r.try_get::<Uuid, _>("id")?,
                r.try_get::<i32, _>("attempts")?,
            ));
        }
        Ok(batch
            .iter()
            .map(|r| written.contains(&(r.id, r.entry.attempt)))
            .collect())
    }

    async fn renew_leases(
        &self,
        held: &[(Uuid, i32)],
        lease: Duration,
    ) -> Result<std::collections::HashSet<(Uuid, i32)>, LedgerError> {
        let pool = &self.pool;
        let ids: Vec<Uuid> = held.iter().map(|(id, _)| *id).collect();
        let attempts: Vec<i32> = held.iter().map(|(_, a)| *a).collect();
        // Rows are locked in id order first, as the other batched
        // statements do, so a heartbeat never deadlocks with them.
        // `updated_at` is left alone: a heartbeat is not progress.
        let rows = sqlx::query(
            "WITH b AS (SELECT * FROM unnest($1::uuid[], $2::int[]) AS b(id, attempt)), \
                  locked AS ( \
                 SELECT j.id FROM job_runs j JOIN b ON j.id = b.id \
                 WHERE j.status = 'running' AND j.attempts = b.attempt \
                 ORDER BY j.id FOR UPDATE OF j) \
             UPDATE job_runs j SET lease_until = now() + make_interval(secs => $3) \
             FROM b, locked \
             WHERE j.id = locked.id AND j.id = b.id AND j.status = 'running' AND j.attempts = b.attempt \
             RETURNING j.id, j.attempts",
        )
        .bind(&ids)
        .bind(&attempts)
        .bind(lease.as_secs_f64())
        .fetch_all(pool)
        .await?;
        rows.into_iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("attempts")?)))
            .collect()
    }

    async fn try_begin(
        &self,
        job_name: &str,
        run_key: &str,
        worker: &str,
        lease: std::time::Duration,
    ) -> Result<Option<(Uuid, i32)>, LedgerError> {
        let pool = &self.pool;
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        Ok(sqlx::query_as(concat!(
            "UPDATE job_runs SET status = 'running', attempts = attempts + 1, \
                 started_at = COALESCE(started_at, now()), worker = $3, next_dispatch_at = NULL, \
                 lease_until = now() + make_interval(secs => $4::double precision / 1000), \
                 updated_at = now() \
             WHERE job_name = $1 AND run_key = $2 \
               AND (status IN ",
            waiting_statuses!(),
            " \
                    OR (status = 'running' AND (lease_until IS NULL OR lease_until < now()))) \
             RETURNING id, attempts"
        ))
        .bind(job_name)
        .bind(run_key)
        .bind(worker)
        .bind(lease_ms)
        .fetch_optional(pool)
        .await?)
    }

    async fn state_by_key(
        &self,
        job_name: &str,
        run_key: &str,
    ) -> Result<Option<RunState>, LedgerError> {
        let pool = &self.pool;
        let row = sqlx::query(
            "SELECT id, status, lease_until, now() AS now FROM job_runs \
             WHERE job_name = $1 AND run_key = $2",
        )
        .bind(job_name)
        .bind(run_key)
        .fetch_optional(pool)
        .await?;
        row.map(|r| {
            let status: String = r.try_get("status")?;
            Ok(RunState {
                id: r.try_get("id")?,
                status: status.parse().map_err(LedgerError::Corrupt)?,
                lease_until: r.try_get("lease_until")?,
                now: r.try_get("now")?,
            })
        })
        .transpose()
    }

    async fn insert_from_message(
        &self,
        message: &JobMessage,
        status: RunStatus,
        last_error: Option<&str>,
        on_conflict: OnRunConflict,
    ) -> Result<u64, sqlx::Error> {
        let pool = &self.pool;
        let on_conflict = match on_conflict {
            OnRunConflict::Nothing => "DO NOTHING".to_owned(),
            OnRunConflict::MarkDead => format!(
                "DO UPDATE SET status = 'dead', last_error = EXCLUDED.last_error, \
                 finished_at = now(), updated_at = now() WHERE job_runs.status IN {WAITING}"
            ),
        };
        let options =
            options_json(&message.options).map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        let trace = message.trace.as_ref();
        let done = sqlx::query(&format!(
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
                 dispatched_at, last_error, finished_at, trace_id, traceparent, options) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, CASE WHEN $10 THEN now() END, $11, $12, $13) \
             ON CONFLICT (job_name, run_key) {on_conflict}"
        ))
        .bind(message.message_id)
        .bind(&message.job_name)
        .bind(&message.run_key)
        .bind(&message.job_type)
        .bind(status.as_str())
        .bind(&message.payload)
        .bind(message.scheduled_at)
        .bind(message.published_at)
        .bind(last_error)
        .bind(status.is_terminal())
        .bind(trace.and_then(|t| t.trace_id()))
        .bind(trace.map(|t| t.traceparent.as_str()))
        .bind(options)
        .execute(pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn end_attempt(
        &self,
        id: Uuid,
        status: RunStatus,
        entry: &AttemptEntry,
        last_error: Option<&str>,
        redispatch_at: Option<DateTime<Utc>>,
    ) -> Result<bool, LedgerError> {
        let pool = &self.pool;
        let entry_json = serde_json::to_value(entry)
            .map_err(|e| LedgerError::Corrupt(format!("attempt entry: {e}")))?;
        let done = sqlx::query(
            "UPDATE job_runs SET status = $2, last_error = $3, \
                 finished_at = CASE WHEN $4 THEN now() ELSE NULL END, \
                 attempt_log = attempt_log || jsonb_build_array($5::jsonb), \
                 next_dispatch_at = $6, lease_until = NULL, updated_at = now() \
             WHERE id = $1 AND status = 'running' AND attempts = $7",
        )
        .bind(id)
        .bind(status.as_str())
        .bind(last_error)
        .bind(status.is_terminal())
        .bind(entry_json)
        .bind(redispatch_at)
        .bind(entry.attempt)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}

/// Claims `runs` on `executor` (the pool, or an open transaction): one
/// multi-row `INSERT ... ON CONFLICT (job_name, run_key) DO NOTHING`, each
/// row decided by the unique constraint on its own; the ids inserted.
pub(crate) async fn claim_rows<'e, E>(
    executor: E,
    runs: &[NewRun],
) -> Result<HashSet<Uuid>, LedgerError>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    if runs.is_empty() {
        return Ok(HashSet::new());
    }
    let mut ids = Vec::with_capacity(runs.len());
    let mut names = Vec::with_capacity(runs.len());
    let mut keys = Vec::with_capacity(runs.len());
    let mut types = Vec::with_capacity(runs.len());
    let mut payloads = Vec::with_capacity(runs.len());
    let mut instants: Vec<DateTime<Utc>> = Vec::with_capacity(runs.len());
    let mut claimers = Vec::with_capacity(runs.len());
    let mut trace_ids = Vec::with_capacity(runs.len());
    let mut traceparents = Vec::with_capacity(runs.len());
    let mut options = Vec::with_capacity(runs.len());
    let mut next_dispatch: Vec<DateTime<Utc>> = Vec::with_capacity(runs.len());
    for r in runs {
        ids.push(r.id);
        names.push(r.job_name.as_str());
        keys.push(r.run_key.as_str());
        types.push(r.job_type.as_str());
        payloads.push(r.payload.clone());
        instants.push(r.scheduled_at);
        claimers.push(r.claimed_by.as_str());
        trace_ids.push(r.trace_id.as_deref());
        traceparents.push(r.traceparent.as_deref());
        options.push(
            serde_json::to_value(&r.options)
                .map_err(|e| LedgerError::Corrupt(format!("job options: {e}")))?,
        );
        next_dispatch.push(r.next_dispatch_at);
    }
    // Rows of the batch are inserted in its order; each conflict is
    // decided per row, exactly as the single-row claim.
    let won: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
             claimed_by, claimed_at, trace_id, traceparent, options, next_dispatch_at) \
         SELECT id, job_name, run_key, job_type, 'claimed', payload, scheduled_at, \
             claimed_by, now(), trace_id, traceparent, options, next_dispatch_at \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], \
                     $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::jsonb[], \
                     $11::timestamptz[]) \
              AS b(id, job_name, run_key, job_type, payload, scheduled_at, claimed_by, \
                   trace_id, traceparent, options, next_dispatch_at) \
         ON CONFLICT (job_name, run_key) DO NOTHING \
         RETURNING id",
    )
    .bind(&ids)
    .bind(&names)
    .bind(&keys)
    .bind(&types)
    .bind(&payloads)
    .bind(&instants)
    .bind(&claimers)
    .bind(&trace_ids)
    .bind(&traceparents)
    .bind(&options)
    .bind(&next_dispatch)
    .fetch_all(executor)
    .await?;
    Ok(won.into_iter().collect())
}
