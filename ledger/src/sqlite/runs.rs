//! `job_runs` transitions on the embedded ledger: the statements of
//! [`crate::runs`] and [`crate::claim_batch`] in SQLite's dialect, with the
//! same guards (each `WHERE` names the statuses a transition may leave).
//! Batches run as one transaction of single-row statements: SQLite has no
//! network round trip to save, and one transaction is one commit.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use belfry_protocol::JobMessage;

use async_trait::async_trait;

use super::{now, now_plus, ts, SqliteLedger};
use crate::attempt_batch::{BeginRequest, EndRequest};
use crate::run_rows::{options_json, FromMessage, RunLookup};
use crate::runs::{NewRun, RunRecord, RunState};
use crate::status::waiting_statuses;
use crate::store::RunStore;
use crate::LedgerError;

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

/// Starts an attempt of a startable run (waiting, or running under an
/// expired lease); see `Ledger::begin_attempt`.
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

/// Most runs [`claim_in`] inserts in one statement: 13 parameters each, far
/// below SQLite's limit.
const CLAIM_CHUNK: usize = 256;

/// Claims `runs` (at most [`CLAIM_CHUNK`]) in `tx` with one multi-row
/// insert, each row decided on its own by the unique constraint; the ids
/// inserted.
///
/// # Errors
///
/// [`LedgerError::Query`] when the insert fails; [`LedgerError::Corrupt`]
/// when a run's options cannot be encoded.
pub(super) async fn claim_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    runs: &[NewRun],
    at: &str,
) -> Result<Vec<Uuid>, LedgerError> {
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, \
             scheduled_at, claimed_by, claimed_at, trace_id, traceparent, options, \
             next_dispatch_at, updated_at) ",
    );
    let mut rows = Vec::with_capacity(runs.len());
    for run in runs {
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
            .push_bind(at.to_owned())
            .push_bind(run.trace_id.clone())
            .push_bind(run.traceparent.clone())
            .push_bind(options)
            .push_bind(ts(run.next_dispatch_at))
            .push_bind(at.to_owned());
    });
    q.push(" ON CONFLICT (job_name, run_key) DO NOTHING RETURNING id");
    Ok(q.build_query_scalar().fetch_all(&mut **tx).await?)
}

#[async_trait]
impl RunStore for SqliteLedger {
    async fn claim_many(&self, runs: &[NewRun]) -> Result<HashSet<Uuid>, LedgerError> {
        let mut won = HashSet::with_capacity(runs.len());
        let at = now();
        // Multi-row inserts, all in one transaction: all of the batch or
        // none of it, as the single Postgres statement.
        let mut tx = self.write_tx().await?;
        for chunk in runs.chunks(CLAIM_CHUNK) {
            won.extend(claim_in(&mut tx, chunk, &at).await?);
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
        let update = sqlx::query(concat!(
            "UPDATE job_runs SET status = 'dead', last_error = ?2, finished_at = ?3, \
                 updated_at = ?3 \
             WHERE id = ?1 AND status IN ",
            waiting_statuses!()
        ));
        self.moved(update.bind(id).bind(reason).bind(now())).await
    }

    async fn state_of(&self, message: &JobMessage) -> Result<Option<RunState>, LedgerError> {
        let row: Option<(Uuid, String, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT id, status, lease_until FROM job_runs WHERE job_name = ?1 AND run_key = ?2",
        )
        .bind(&message.job_name)
        .bind(&message.run_key)
        .fetch_optional(&self.pool)
        .await?;
        // There is no other clock than this process's.
        row.map(|row| RunState::parse(row, Utc::now())).transpose()
    }

    async fn insert_from_message(&self, run: FromMessage<'_>) -> Result<u64, sqlx::Error> {
        let action = match run {
            FromMessage::Dispatched(_) => "DO NOTHING",
            FromMessage::Dead(..) => concat!(
                "DO UPDATE SET status = 'dead', last_error = excluded.last_error, \
                 finished_at = excluded.updated_at, updated_at = excluded.updated_at \
                 WHERE job_runs.status IN ",
                waiting_statuses!()
            ),
        };
        let insert = format!(
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
                 dispatched_at, last_error, finished_at, trace_id, traceparent, options, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, CASE WHEN ?10 THEN ?14 END, ?11, ?12, ?13, ?14) \
             ON CONFLICT (job_name, run_key) {action}"
        );
        // `?1` to `?13` in the order of the columns above; `?14` is now.
        let done = run
            .bind(sqlx::query(&insert), ts)?
            .bind(now())
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected())
    }

    async fn hand_back(&self, id: Uuid, attempt: i32, reason: &str) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE job_runs SET status = 'retrying', last_error = ?2, lease_until = NULL, \
                 updated_at = ?4 \
             WHERE id = ?1 AND status = 'running' AND attempts = ?3",
        );
        self.moved(update.bind(id).bind(reason).bind(attempt).bind(now()))
            .await
    }

    async fn runs(&self, lookup: RunLookup<'_>) -> Result<Vec<RunRecord>, LedgerError> {
        let sql = lookup.sql();
        Ok(lookup.query(&sql).fetch_all(&self.pool).await?)
    }

    async fn begin_batch(
        &self,
        batch: &[BeginRequest],
    ) -> Result<Vec<Option<(Uuid, i32)>>, LedgerError> {
        let at = now();
        let mut out = Vec::with_capacity(batch.len());
        let mut tx = self.write_tx().await?;
        for r in batch {
            // Row by row, one guard: a run named twice in one batch starts
            // once; the second request gets `None` and the slow path sees
            // the run held.
            let started = sqlx::query_as(BEGIN)
                .bind(&r.job_name)
                .bind(&r.run_key)
                .bind(&r.worker)
                .bind(&at)
                .bind(now_plus(r.lease))
                .fetch_optional(&mut *tx)
                .await?;
            out.push(started);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn renew_leases(
        &self,
        held: &[(Uuid, i32)],
        lease: Duration,
    ) -> Result<HashSet<(Uuid, i32)>, LedgerError> {
        let until = now_plus(lease);
        let mut renewed = HashSet::with_capacity(held.len());
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
            let entry = serde_json::to_string(&r.entry)
                .map_err(|e| LedgerError::Corrupt(format!("attempt entry: {e}")))?;
            let done = sqlx::query(END)
                .bind(r.id)
                .bind(r.status.as_str())
                .bind(r.last_error.as_deref())
                .bind(r.status.is_terminal())
                .bind(entry)
                .bind(r.redispatch_at.map(ts))
                .bind(r.entry.attempt)
                .bind(now())
                .execute(&mut *tx)
                .await?;
            out.push(done.rows_affected() == 1);
        }
        tx.commit().await?;
        Ok(out)
    }
}
