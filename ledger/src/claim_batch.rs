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
        self.store.claim_many(runs).await
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
        self.store.mark_dispatched_many(ids).await
    }
}
