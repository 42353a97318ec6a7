//! The outbox: runs waiting to be published, and taking them safely.
//!
//! A run waits in the outbox (`next_dispatch_at` set) while it is `claimed`
//! and not yet confirmed by the broker, or `retrying` with its back-off
//! handed to the ledger. Whoever publishes it (the claiming replica, or any
//! replica's reconciler once `next_dispatch_at` has passed) takes it with
//! [`Ledger::take_due`], which locks the rows with `FOR UPDATE SKIP LOCKED`
//! and pushes their `next_dispatch_at` one lease ahead in the same
//! transaction: two replicas never publish the same row at once, and a
//! replica that dies while publishing only delays the row by one lease.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::runs::RunRecord;
use crate::{Ledger, LedgerError};

impl Ledger {
    /// Takes up to `limit` runs whose `next_dispatch_at` has passed, oldest
    /// first, leasing each for `lease` (their `next_dispatch_at` moves to
    /// `now() + lease`).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn take_due(
        &self,
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<RunRecord>, LedgerError> {
        self.store.take_due(limit, lease).await
    }

    /// Records that a run taken from the outbox (with lease `lease`, its
    /// `next_dispatch_at` as [`Ledger::take_due`] returned it) was confirmed
    /// by the broker:
    /// a `claimed` run becomes `dispatched`; a `retrying` run leaves the
    /// outbox and waits for its worker. Returns whether the row moved.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn mark_republished(
        &self,
        id: Uuid,
        lease: DateTime<Utc>,
    ) -> Result<bool, LedgerError> {
        self.store.mark_republished(id, lease).await
    }

    /// Moves a run's next publish to `at` (a failed publish is tried again
    /// later), if it still holds `lease`. Returns whether the row moved.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn postpone_dispatch(
        &self,
        id: Uuid,
        lease: DateTime<Utc>,
        at: DateTime<Utc>,
    ) -> Result<bool, LedgerError> {
        self.store.postpone_dispatch(id, lease, at).await
    }
}
