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
use crate::attempt_batch::{BeginRequest, EndRequest, LeaseRenewal};
use crate::cancel::{CancelOutcome, CancelRequest};
use crate::run_rows::{options_json, FromMessage, RunLookup};
use crate::runs::{NewRun, RunRecord, RunState};
use crate::status::waiting_statuses;
use crate::store::RunStore;
use crate::{LedgerError, RunStatus};

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

/// The run `?1`/`?2` if no attempt is running it: waiting, or running
/// under a lease that expired before `?4` (now), and not being cancelled.
/// Shared by the start and the limited start (`super::concurrency`).
macro_rules! this_run_if_startable {
    () => {
        concat!(
            "job_name = ?1 AND run_key = ?2 AND (status IN ",
            $crate::status::waiting_statuses!(),
            " OR (status = 'running' AND (lease_until IS NULL OR lease_until < ?4) \
                  AND cancel_requested_at IS NULL))"
        )
    };
}
pub(crate) use this_run_if_startable;

/// Starts an attempt of a startable run (waiting, or running under an
/// expired lease); see `Ledger::begin_attempt`.
const BEGIN: &str = concat!(
    "UPDATE job_runs SET status = 'running', attempts = attempts + 1, \
         started_at = COALESCE(started_at, ?4), worker = ?3, next_dispatch_at = NULL, \
         lease_until = ?5, updated_at = ?4 \
     WHERE ",
    this_run_if_startable!(),
    " RETURNING id, attempts"
);

/// Ends the attempt that holds the run (see `Ledger::end_attempt`); a run
/// with a cancel request ends `cancelled` instead of retrying (see
/// `crate::cancel`).
const END: &str = "UPDATE job_runs SET \
         status = CASE WHEN NOT ?4 AND cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE ?2 END, \
         last_error = CASE WHEN ?2 = 'cancelled' OR (NOT ?4 AND cancel_requested_at IS NOT NULL) \
             THEN COALESCE(cancel_reason, ?3) ELSE ?3 END, \
         finished_at = CASE WHEN ?4 OR cancel_requested_at IS NOT NULL THEN ?8 ELSE NULL END, \
         attempt_log = json_insert(attempt_log, '$[#]', json(?5)), \
         next_dispatch_at = CASE WHEN cancel_requested_at IS NULL THEN ?6 END, \
         lease_until = NULL, updated_at = ?8 \
     WHERE id = ?1 AND status = 'running' AND attempts = ?7 \
     RETURNING job_name";

/// Most runs [`claim_in`] inserts in one statement: 13 parameters each, far
/// below SQLite's limit.
pub(super) const CLAIM_CHUNK: usize = 256;

/// Claims `runs` (at most [`CLAIM_CHUNK`]) in `tx` with one multi-row
/// insert, each row decided on its own by the unique constraint; the ids
/// inserted. With `buffered` the rows are held for an overlap policy
/// (`buffered`, nothing due) instead of `claimed`.
///
/// # Errors
///
/// [`LedgerError::Query`] when the insert fails; [`LedgerError::Corrupt`]
/// when a run's options cannot be encoded.
pub(super) async fn claim_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    runs: &[NewRun],
    at: &str,
    buffered: bool,
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
            .push(if buffered { "'buffered'" } else { "'claimed'" })
            .push_bind(run.payload.clone())
            .push_bind(ts(run.scheduled_at))
            .push_bind(run.claimed_by.clone())
            .push_bind(at.to_owned())
            .push_bind(run.trace_id.clone())
            .push_bind(run.traceparent.clone())
            .push_bind(options)
            .push_bind((!buffered).then(|| ts(run.next_dispatch_at)))
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
            won.extend(claim_in(&mut tx, chunk, &at, false).await?);
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
        let row: Option<(Uuid, String, Option<DateTime<Utc>>, bool)> = sqlx::query_as(
            "SELECT id, status, lease_until, cancel_requested_at IS NOT NULL \
             FROM job_runs WHERE job_name = ?1 AND run_key = ?2",
        )
        .bind(&message.job_name)
        .bind(&message.run_key)
        .fetch_optional(&self.pool)
        .await?;
        // There is no other clock than this process's.
        row.map(|row| RunState::parse(row, Utc::now())).transpose()
    }

    async fn insert_from_message(&self, run: FromMessage<'_>) -> Result<u64, LedgerError> {
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
            .await
            .map_err(|e| crate::run_rows::from_message_error(&run, e))?;
        Ok(done.rows_affected())
    }

    async fn hand_back(&self, id: Uuid, attempt: i32, reason: &str) -> Result<bool, LedgerError> {
        // A run with a cancel request is not handed back: it ends.
        let update = sqlx::query(
            "UPDATE job_runs SET \
                 status = CASE WHEN cancel_requested_at IS NULL THEN 'retrying' ELSE 'cancelled' END, \
                 last_error = COALESCE(cancel_reason, ?2), \
                 finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE ?4 END, \
                 lease_until = NULL, updated_at = ?4 \
             WHERE id = ?1 AND status = 'running' AND attempts = ?3",
        );
        self.moved(update.bind(id).bind(reason).bind(attempt).bind(now()))
            .await
    }

    async fn cancel_run(&self, request: &CancelRequest<'_>) -> Result<CancelOutcome, LedgerError> {
        // One writer: the decision and its update are one transaction no
        // other write can interleave with.
        let mut tx = self.write_tx().await?;
        let outcome = cancel_in(&mut tx, request).await?;
        tx.commit().await?;
        if outcome == CancelOutcome::Requested {
            self.announce_cancel(request);
        }
        Ok(outcome)
    }

    async fn finish_cancelled(&self, id: Uuid) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE job_runs SET status = 'cancelled', last_error = cancel_reason, \
                 finished_at = ?2, lease_until = NULL, updated_at = ?2 \
             WHERE id = ?1 AND status = 'running' AND cancel_requested_at IS NOT NULL \
               AND (lease_until IS NULL OR lease_until < ?2)",
        );
        self.moved(update.bind(id).bind(now())).await
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
    ) -> Result<LeaseRenewal, LedgerError> {
        let until = now_plus(lease);
        let mut rows = Vec::with_capacity(held.len());
        let mut tx = self.write_tx().await?;
        for (id, attempt) in held {
            let row: Option<(Uuid, i32, bool, bool)> = sqlx::query_as(
                "UPDATE job_runs SET lease_until = ?3 \
                 WHERE id = ?1 AND attempts = ?2 AND status = 'running' \
                 RETURNING id, attempts, cancel_requested_at IS NOT NULL, cancel_immediate",
            )
            .bind(id)
            .bind(attempt)
            .bind(&until)
            .fetch_optional(&mut *tx)
            .await?;
            rows.extend(row);
        }
        tx.commit().await?;
        Ok(LeaseRenewal::from_rows(rows))
    }

    async fn end_batch(&self, batch: &[EndRequest]) -> Result<Vec<bool>, LedgerError> {
        let mut out = Vec::with_capacity(batch.len());
        let mut failed_schedules = Vec::new();
        let mut tx = self.write_tx().await?;
        for r in batch {
            let entry = serde_json::to_string(&r.entry)
                .map_err(|e| LedgerError::Corrupt(format!("attempt entry: {e}")))?;
            let done: Option<String> = sqlx::query_scalar(END)
                .bind(r.id)
                .bind(r.status.as_str())
                .bind(r.last_error.as_deref())
                .bind(r.status.is_terminal())
                .bind(entry)
                .bind(r.redispatch_at.map(ts))
                .bind(r.entry.attempt)
                .bind(now())
                .fetch_optional(&mut *tx)
                .await?;
            out.push(done.is_some());
            if matches!(r.status, RunStatus::Failed | RunStatus::Dead) {
                failed_schedules.extend(done);
            }
        }
        tx.commit().await?;
        // A failure may have paused its schedule (the pause_after_failures
        // trigger): the replicas of this process look at it again now,
        // not at their next resync.
        failed_schedules.dedup();
        for name in &failed_schedules {
            self.announce(name);
        }
        Ok(out)
    }
}

/// Cancels a run inside the write transaction `tx` (see `crate::cancel`).
/// A request for a running run is announced by the caller after the
/// commit ([`SqliteLedger::announce_cancel`]), as `NOTIFY` is delivered at
/// commit. Used by the API's cancel and by the overlap policies that
/// cancel the previous run, in the transaction of their decision.
///
/// # Errors
///
/// [`LedgerError::Query`] when a statement fails.
pub(super) async fn cancel_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    request: &CancelRequest<'_>,
) -> Result<CancelOutcome, LedgerError> {
    let at = now();
    let row: Option<(String, Option<String>)> =
        sqlx::query_as("SELECT status, lease_until FROM job_runs WHERE id = ?1")
            .bind(request.id)
            .fetch_optional(&mut **tx)
            .await?;
    let Some((status, lease_until)) = row else {
        return Ok(CancelOutcome::NotFound);
    };
    let status: RunStatus = status.parse().map_err(LedgerError::Corrupt)?;
    // Instants are fixed-width text: comparing the text compares them.
    let lease_expired = lease_until.is_some_and(|until| until < at);
    Ok(match status {
        s if s.is_terminal() => CancelOutcome::Finished(s),
        RunStatus::Running if !lease_expired => {
            sqlx::query(
                "UPDATE job_runs SET cancel_requested_at = COALESCE(cancel_requested_at, ?4), \
                     cancel_reason = COALESCE(cancel_reason, ?2), \
                     cancel_immediate = (cancel_immediate OR ?3), updated_at = ?4 \
                 WHERE id = ?1",
            )
            .bind(request.id)
            .bind(request.reason)
            .bind(request.immediate)
            .bind(&at)
            .execute(&mut **tx)
            .await?;
            CancelOutcome::Requested
        }
        was => {
            sqlx::query(
                "UPDATE job_runs SET status = 'cancelled', last_error = ?2, finished_at = ?3, \
                     next_dispatch_at = NULL, lease_until = NULL, \
                     cancel_requested_at = COALESCE(cancel_requested_at, ?3), \
                     cancel_reason = COALESCE(cancel_reason, ?2), updated_at = ?3 \
                 WHERE id = ?1",
            )
            .bind(request.id)
            .bind(request.reason)
            .bind(&at)
            .execute(&mut **tx)
            .await?;
            CancelOutcome::Cancelled { was }
        }
    })
}
