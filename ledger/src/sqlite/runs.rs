//! `job_runs` transitions on the embedded ledger: the statements of
//! [`crate::runs`] and [`crate::claim_batch`] in SQLite's dialect, with the
//! same guards (each `WHERE` names the statuses a transition may leave).
//! Batches run as one transaction of single-row statements: SQLite has no
//! network round trip to save, and one transaction is one commit.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use belfry_protocol::JobMessage;

use async_trait::async_trait;

use super::{now, now_plus, ts, SqliteLedger};
use crate::attempt_batch::{BeginRequest, EndRequest};
use crate::runs::{
    options_json, AttemptEntry, NewRun, OnRunConflict, RunRecord, RunState, RUN_COLUMNS,
};
use crate::status::waiting_statuses;
use crate::store::RunStore;
use crate::{LedgerError, RunStatus};

/// The insert of a claim; one row.
const CLAIM: &str = "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, \
         scheduled_at, claimed_by, claimed_at, trace_id, traceparent, options, next_dispatch_at, \
         updated_at) \
     VALUES (?1, ?2, ?3, ?4, 'claimed', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?8) \
     ON CONFLICT (job_name, run_key) DO NOTHING \
     RETURNING id";

/// `claimed` → `dispatched`, or only `dispatched_at` for a run a fast worker
/// already moved; every expression reads the row as it was (the batched
/// form, one statement per run).
const MARK_DISPATCHED: &str = "UPDATE job_runs SET \
         status = CASE WHEN status = 'claimed' THEN 'dispatched' ELSE status END, \
         next_dispatch_at = CASE WHEN status = 'claimed' THEN NULL ELSE next_dispatch_at END, \
         updated_at = CASE WHEN status = 'claimed' THEN ?2 ELSE updated_at END, \
         dispatched_at = COALESCE(dispatched_at, ?2) \
     WHERE id = ?1 AND (status = 'claimed' OR dispatched_at IS NULL) \
     RETURNING status";

/// Starts an attempt of a startable run (see `Ledger::try_begin`).
const BEGIN: &str = concat!(
    "UPDATE job_runs SET status = 'running', attempts = attempts + 1, \
         started_at = COALESCE(started_at, ?4), worker = ?3, next_dispatch_at = NULL, \
         lease_until = ?5, updated_at = ?4 \
     WHERE job_name = ?1 AND run_key = ?2 \
       AND (status IN ",
    waiting_statuses!(),
    " \
            OR (status = 'running' AND (lease_until IS NULL OR lease_until < ?4))) \
     RETURNING id, attempts"
);

/// Ends the attempt that holds the run (see `Ledger::end_attempt`).
const END: &str = "UPDATE job_runs SET status = ?2, last_error = ?3, \
         finished_at = CASE WHEN ?4 THEN ?8 ELSE NULL END, \
         attempt_log = json_insert(attempt_log, '$[#]', json(?5)), \
         next_dispatch_at = ?6, lease_until = NULL, updated_at = ?8 \
     WHERE id = ?1 AND status = 'running' AND attempts = ?7";

pub(super) async fn claim_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    run: &NewRun,
) -> Result<bool, LedgerError> {
    let inserted: Option<Uuid> = sqlx::query_scalar(CLAIM)
        .bind(run.id)
        .bind(&run.job_name)
        .bind(&run.run_key)
        .bind(&run.job_type)
        .bind(&run.payload)
        .bind(ts(run.scheduled_at))
        .bind(&run.claimed_by)
        .bind(now())
        .bind(&run.trace_id)
        .bind(&run.traceparent)
        .bind(options_json(&run.options)?)
        .bind(ts(run.next_dispatch_at))
        .fetch_optional(&mut **tx)
        .await?;
    Ok(inserted.is_some())
}

async fn end_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    id: Uuid,
    status: RunStatus,
    entry: &AttemptEntry,
    last_error: Option<&str>,
    redispatch_at: Option<DateTime<Utc>>,
) -> Result<bool, LedgerError> {
    let entry_json = serde_json::to_string(entry)
        .map_err(|e| LedgerError::Corrupt(format!("attempt entry: {e}")))?;
    let done = sqlx::query(END)
        .bind(id)
        .bind(status.as_str())
        .bind(last_error)
        .bind(status.is_terminal())
        .bind(entry_json)
        .bind(redispatch_at.map(ts))
        .bind(entry.attempt)
        .bind(now())
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[async_trait]
impl RunStore for SqliteLedger {
    async fn claim_many(&self, runs: &[NewRun]) -> Result<HashSet<Uuid>, LedgerError> {
        let mut won = HashSet::with_capacity(runs.len());
        let at = now();
        // Multi-row inserts of at most 256 rows (13 parameters each, far
        // below SQLite's limit), all in one transaction: all of the batch or
        // none of it, as the single Postgres statement. Each row is still
        // decided on its own by the unique constraint.
        let mut tx = self.write_tx().await?;
        for chunk in runs.chunks(256) {
            let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, \
                     scheduled_at, claimed_by, claimed_at, trace_id, traceparent, options, \
                     next_dispatch_at, updated_at) ",
            );
            let mut rows = Vec::with_capacity(chunk.len());
            for run in chunk {
                rows.push((run, options_json(&run.options)?));
            }
            q.push_values(rows, |mut b, (run, options)| {
                b.push_bind(run.id)
                    .push_bind(run.job_name.clone())
                    .push_bind(run.run_key.clone())
                    .push_bind(run.job_type.clone())
                    .push("'claimed'")
                    .push_bind(run.payload.clone())
                    .push_bind(ts(run.scheduled_at))
                    .push_bind(run.claimed_by.clone())
                    .push_bind(at.clone())
                    .push_bind(run.trace_id.clone())
                    .push_bind(run.traceparent.clone())
                    .push_bind(options)
                    .push_bind(ts(run.next_dispatch_at))
                    .push_bind(at.clone());
            });
            q.push(" ON CONFLICT (job_name, run_key) DO NOTHING RETURNING id");
            let inserted: Vec<Uuid> = q.build_query_scalar().fetch_all(&mut *tx).await?;
            won.extend(inserted);
        }
        tx.commit().await?;
        Ok(won)
    }

    async fn mark_dispatched(&self, id: Uuid) -> Result<bool, LedgerError> {
        let at = now();
        // The two statements of the Postgres version, in one transaction:
        // only a `claimed` row moves (that is the answer); a row a fast
        // worker already took still gets its `dispatched_at`.
        let mut tx = self.write_tx().await?;
        let moved = sqlx::query(
            "UPDATE job_runs SET status = 'dispatched', dispatched_at = ?2, \
                 next_dispatch_at = NULL, updated_at = ?2 \
             WHERE id = ?1 AND status = 'claimed'",
        )
        .bind(id)
        .bind(&at)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !moved {
            sqlx::query(
                "UPDATE job_runs SET dispatched_at = ?2 WHERE id = ?1 AND dispatched_at IS NULL",
            )
            .bind(id)
            .bind(&at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(moved)
    }

    async fn mark_dispatched_many(&self, ids: &[Uuid]) -> Result<u64, LedgerError> {
        let mut touched = 0;
        let at = now();
        let mut tx = self.write_tx().await?;
        for id in ids {
            let done = sqlx::query(MARK_DISPATCHED)
                .bind(id)
                .bind(&at)
                .fetch_optional(&mut *tx)
                .await?;
            touched += u64::from(done.is_some());
        }
        tx.commit().await?;
        Ok(touched)
    }

    async fn mark_dead(&self, id: Uuid, reason: &str) -> Result<bool, LedgerError> {
        let done = sqlx::query(concat!(
            "UPDATE job_runs SET status = 'dead', last_error = ?2, finished_at = ?3, \
                 updated_at = ?3 \
             WHERE id = ?1 AND status IN ",
            waiting_statuses!()
        ))
        .bind(id)
        .bind(reason)
        .bind(now())
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn try_begin(
        &self,
        job_name: &str,
        run_key: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<(Uuid, i32)>, LedgerError> {
        Ok(sqlx::query_as(BEGIN)
            .bind(job_name)
            .bind(run_key)
            .bind(worker)
            .bind(now())
            .bind(now_plus(lease))
            .fetch_optional(&self.writer)
            .await?)
    }

    async fn state_by_key(
        &self,
        job_name: &str,
        run_key: &str,
    ) -> Result<Option<RunState>, LedgerError> {
        let row = sqlx::query(
            "SELECT id, status, lease_until FROM job_runs WHERE job_name = ?1 AND run_key = ?2",
        )
        .bind(job_name)
        .bind(run_key)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let status: String = r.try_get("status")?;
            Ok(RunState {
                id: r.try_get("id")?,
                status: status.parse().map_err(LedgerError::Corrupt)?,
                lease_until: r.try_get("lease_until")?,
                now: Utc::now(),
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
        let action = match on_conflict {
            OnRunConflict::Nothing => "DO NOTHING",
            OnRunConflict::MarkDead => {
                concat!(
                    "DO UPDATE SET status = 'dead', last_error = excluded.last_error, \
                 finished_at = excluded.updated_at, updated_at = excluded.updated_at \
                 WHERE job_runs.status IN ",
                    waiting_statuses!()
                )
            }
        };
        let at = now();
        let trace = message.trace.as_ref();
        let options =
            options_json(&message.options).map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        let done = sqlx::query(&format!(
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
                 dispatched_at, last_error, finished_at, trace_id, traceparent, options, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, CASE WHEN ?10 THEN ?14 END, ?11, ?12, ?13, ?14) \
             ON CONFLICT (job_name, run_key) {action}"
        ))
        .bind(message.message_id)
        .bind(&message.job_name)
        .bind(&message.run_key)
        .bind(&message.job_type)
        .bind(status.as_str())
        .bind(&message.payload)
        .bind(ts(message.scheduled_at))
        .bind(ts(message.published_at))
        .bind(last_error)
        .bind(status.is_terminal())
        .bind(trace.and_then(|t| t.trace_id()))
        .bind(trace.map(|t| t.traceparent.as_str()))
        .bind(options)
        .bind(at)
        .execute(&self.writer)
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
        let mut tx = self.writer.begin().await?;
        let done = end_in(&mut tx, id, status, entry, last_error, redispatch_at).await?;
        tx.commit().await?;
        Ok(done)
    }

    async fn hand_back(&self, id: Uuid, attempt: i32, reason: &str) -> Result<bool, LedgerError> {
        let done = sqlx::query(
            "UPDATE job_runs SET status = 'retrying', last_error = ?2, lease_until = NULL, \
                 updated_at = ?4 \
             WHERE id = ?1 AND status = 'running' AND attempts = ?3",
        )
        .bind(id)
        .bind(reason)
        .bind(attempt)
        .bind(now())
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn run(&self, id: Uuid) -> Result<Option<RunRecord>, LedgerError> {
        Ok(
            sqlx::query_as(&format!("SELECT {RUN_COLUMNS} FROM job_runs WHERE id = ?1"))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn run_by_key(
        &self,
        job_name: &str,
        run_key: &str,
    ) -> Result<Option<RunRecord>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE job_name = ?1 AND run_key = ?2"
        ))
        .bind(job_name)
        .bind(run_key)
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn runs_of(&self, job_name: &str, limit: i64) -> Result<Vec<RunRecord>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE job_name = ?1 \
             ORDER BY scheduled_at ASC LIMIT ?2"
        ))
        .bind(job_name)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn begin_batch(
        &self,
        batch: &[BeginRequest],
    ) -> Result<Vec<Option<(Uuid, i32)>>, LedgerError> {
        let at = now();
        let mut out = Vec::with_capacity(batch.len());
        let mut tx = self.write_tx().await?;
        for r in batch {
            // Row by row, the guard of `try_begin`: a run named twice in one
            // batch starts once; the second request gets `None` and the
            // slow path sees the run held.
            let row = sqlx::query(BEGIN)
                .bind(&r.job_name)
                .bind(&r.run_key)
                .bind(&r.worker)
                .bind(&at)
                .bind(now_plus(r.lease))
                .fetch_optional(&mut *tx)
                .await?;
            out.push(
                row.map(|row| -> Result<_, LedgerError> {
                    Ok((row.try_get("id")?, row.try_get("attempts")?))
                })
                .transpose()?,
            );
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn renew_leases(
        &self,
        held: &[(Uuid, i32)],
        lease: std::time::Duration,
    ) -> Result<std::collections::HashSet<(Uuid, i32)>, LedgerError> {
        let until = now_plus(lease);
        let mut renewed = std::collections::HashSet::with_capacity(held.len());
        let mut tx = self.write_tx().await?;
        for (id, attempt) in held {
            let done = sqlx::query(
                "UPDATE job_runs SET lease_until = ?3 \
                 WHERE id = ?1 AND attempts = ?2 AND status = 'running'",
            )
            .bind(id)
            .bind(attempt)
            .bind(&until)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 1 {
                renewed.insert((*id, *attempt));
            }
        }
        tx.commit().await?;
        Ok(renewed)
    }

    async fn end_batch(&self, batch: &[EndRequest]) -> Result<Vec<bool>, LedgerError> {
        let mut out = Vec::with_capacity(batch.len());
        let mut tx = self.write_tx().await?;
        for r in batch {
            out.push(
                end_in(
                    &mut tx,
                    r.id,
                    r.status,
                    &r.entry,
                    r.last_error.as_deref(),
                    r.redispatch_at,
                )
                .await?,
            );
        }
        tx.commit().await?;
        Ok(out)
    }
}
