//! Counters of what this worker did with deliveries.

use std::sync::atomic::{AtomicU64, Ordering};

/// Per-worker counters. All counts only grow.
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Deliveries taken from the queue.
    pub deliveries: AtomicU64,
    /// Handler attempts started.
    pub attempts: AtomicU64,
    /// Runs finished `succeeded`.
    pub succeeded: AtomicU64,
    /// Runs finished `failed`.
    pub failed: AtomicU64,
    /// Runs finished `dead`.
    pub dead: AtomicU64,
    /// Messages published to the dead-letter queue.
    pub dead_lettered: AtomicU64,
    /// Deliveries of already finished runs, acked and dropped.
    pub duplicates: AtomicU64,
    /// Deliveries handed back to the broker (shutdown, ledger down, run
    /// held by another attempt).
    pub handed_back: AtomicU64,
    /// Retries whose back-off was handed to the ledger.
    pub deferred: AtomicU64,
    /// Attempts that lost their lease before recording.
    pub superseded: AtomicU64,
}

impl WorkerCounters {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads one counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
