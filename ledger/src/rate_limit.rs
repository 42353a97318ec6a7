//! Cluster-wide rate limits (issue 22): at most `starts` runs with the same
//! rate key start in any window of `per`, across every worker of every
//! host.
//!
//! The window is a sliding log, not an estimate: each start under the
//! limit is a row of `rate_limit_starts` (key, instant), and a start is
//! allowed only while fewer than `starts` rows of its key are younger than
//! `per`. Rows that left the window are deleted by the next check of their
//! key, so a key holds at most `starts` rows. The count and the start are
//! one transaction, serialised per key like a concurrency limit's (an
//! advisory lock of its own class on Postgres, the writer's turn on
//! SQLite), with instants from the database's clock at the moment the
//! lock is held — so "at most `starts` in any window" holds exactly, not
//! only on average.
//!
//! A run that finds the window full uses no attempt: like a run waiting
//! for a concurrency slot it goes back to the ledger (`retrying`,
//! `next_dispatch_at`, the reason in `last_error`) and is published again.
//! When it comes back is chosen so the waiting runs do not all return at
//! once: each gets the next *turn* of its key (`rate_limit_turns`: turns
//! are `per / starts` apart, the first when the window frees a start), so
//! a backlog drains at the limit's pace instead of every waiting run
//! asking again at every outbox pass. A turn is a hint, not a reservation:
//! the returning run is checked again, and one that finds the window full
//! (a new run took the start) takes the next free turn.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::{Ledger, LedgerError};

/// A rate limit a run is started under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRate {
    /// What the limit counts by: the job type, or the job type and a value
    /// from the payload (`export:partner-7`).
    pub key: String,
    /// Starts allowed in any window.
    pub starts: u32,
    /// The window.
    pub per: Duration,
}

impl StartRate {
    /// How far apart the turns of waiting runs are: the window shared
    /// evenly by its starts.
    pub(crate) fn spacing(&self) -> Duration {
        self.per / self.starts.max(1)
    }

    /// The reason a waiting run carries in `last_error`.
    pub(crate) fn waiting_reason(&self, started: i64) -> String {
        format!(
            "waiting for the rate limit: {started} of {} starts in the last {} ms for rate key {:?}",
            self.starts,
            self.per.as_millis(),
            self.key
        )
    }
}

impl Ledger {
    /// Deletes up to `limit` starts logged before `before` and every turn
    /// before it; how many starts. A key's own check deletes the starts
    /// that left its window, so what is left for this is the log of keys
    /// no run asks for any more (a tenant gone, a limit changed). Pass an
    /// instant at least the longest window ago
    /// ([`belfry_protocol::rate_limit::MAX_RATE_WINDOW`]): no window
    /// reaches further back.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails.
    pub async fn prune_rate_limits(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, LedgerError> {
        self.store.prune_rate_limits(before, limit).await
    }
}
