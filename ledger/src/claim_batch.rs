//! Claiming and recording many fires in one statement each: the batched
//! path a replica takes when a burst of fires is due at once.
//!
//! The guarantee is the single-fire one: `INSERT ... ON CONFLICT (job_name,
//! run_key) DO NOTHING RETURNING id`, now over `unnest` of the batch's
//! columns. Each row is decided on its own by the unique constraint: a row
//! another replica inserted first is simply not returned, so a batch can win
//! some fires and lose others. The statement is atomic (all rows it returns
//! were inserted), and what a crash leaves behind is ordinary `claimed`
//! rows, which the outbox reconciler publishes.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::runs::NewRun;
use crate::{Ledger, LedgerError};

impl Ledger {
    /// Inserts every run of `runs` whose `(job_name, run_key)` is free, as
    /// `claimed`; returns the ids this call inserted (the fires this replica
    /// owns).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached (nothing
    /// was inserted); [`LedgerError::Corrupt`] when options cannot be
    /// encoded.
    pub async fn claim_many(&self, runs: &[NewRun]) -> Result<HashSet<Uuid>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.claim_many(runs).await,
        };
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
        .fetch_all(pool)
        .await?;
        Ok(won.into_iter().collect())
    }

    /// Marks every run of `ids` the broker confirmed as `dispatched`, in one
    /// statement; like [`Ledger::mark_dispatched`], only `claimed` rows move
    /// (a fast worker may already have it `running` or finished), and the
    /// others still get their `dispatched_at`. Returns the rows touched.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn mark_dispatched_many(&self, ids: &[Uuid]) -> Result<u64, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.mark_dispatched_many(ids).await,
        };
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
}
