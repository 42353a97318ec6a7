//! Cluster-wide concurrency limits (issue 22): at most `max` runs with the
//! same limit key run at once, across every worker of every host.
//!
//! A slot is not a separate record: it is a run that is `running` under an
//! attempt lease that has not expired, with the key in
//! `job_runs.limit_key`. So a slot lives exactly as long as the attempt
//! that holds it — freed when the attempt records its outcome, when its
//! run goes into a retry back-off, and when its worker dies and the lease
//! runs out (the lease heartbeat renews slot and attempt together). No
//! slot can be lost for good, and none outlives its run.
//!
//! Starting a limited run counts the key's live slots and starts the run
//! in one transaction, serialised per key (Postgres: a transaction-scoped
//! advisory lock on the key's hash; SQLite: the writer's `BEGIN
//! IMMEDIATE`), so two workers never both take the last slot. A run that
//! finds every slot taken does not start and uses no attempt: it is put
//! back for the outbox to publish again after a short wait (status
//! `retrying`, `next_dispatch_at`, the reason in `last_error`), and its
//! delivery is acked. It waits in the ledger, not in the worker, so a
//! worker consuming several job types keeps running the others (no
//! head-of-line blocking behind a full limit).

use std::time::Duration;

/// A concurrency limit a run is started under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyLimit {
    /// What the limit counts by: the job type, or the job type and a value
    /// from the payload (`report:tenant-7`).
    pub key: String,
    /// Runs with this key that may run at once.
    pub max: u32,
    /// How long a run that finds every slot taken waits before it is
    /// published again.
    pub wait: Duration,
}

impl ConcurrencyLimit {
    /// The reason a waiting run carries in `last_error`.
    pub(crate) fn waiting_reason(&self, running: i64) -> String {
        format!(
            "waiting for a concurrency slot: {running} of {} running for limit key {:?}",
            self.max, self.key
        )
    }
}
