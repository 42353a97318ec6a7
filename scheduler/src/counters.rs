//! Counters of what happened to fires on this replica.
//!
//! Plain atomics: cheap on the hot path, readable by tests and (in a later
//! issue) exported as Prometheus metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Per-replica fire counters. All counts only grow.
#[derive(Debug, Default)]
pub struct FireCounters {
    /// Fires handed to claiming.
    pub fires: AtomicU64,
    /// Fires this replica won (row inserted).
    pub claims_won: AtomicU64,
    /// Fires lost at the Redis lock (another replica holds it).
    pub claims_lost_lock: AtomicU64,
    /// Fires lost at the ledger insert (row already there).
    pub claims_lost_ledger: AtomicU64,
    /// Lock errors that fell back to database-only claiming.
    pub lock_fallbacks: AtomicU64,
    /// Fires that could not be claimed at all (ledger unreachable).
    pub claim_errors: AtomicU64,
    /// Publishes the broker confirmed.
    pub published: AtomicU64,
    /// Publishes returned as unroutable (no group serves the type).
    pub unroutable: AtomicU64,
    /// Publishes that failed or were nacked; the run stays `claimed`.
    pub publish_errors: AtomicU64,
    /// Missed fires skipped by misfire policies.
    pub misfires_skipped: AtomicU64,
    /// Missed fires fired late by misfire policies (recovery).
    pub misfires_recovered: AtomicU64,
    /// Fires skipped because the previous run was unfinished (overlap =
    /// forbid).
    pub skipped_overlap: AtomicU64,
    /// Fires not claimed because this replica's clock is skewed.
    pub skipped_clock_skew: AtomicU64,
    /// Runs reported stuck (no progress past the deadline).
    pub stuck_runs: AtomicU64,
}

impl FireCounters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads one counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
