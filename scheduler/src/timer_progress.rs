//! Whether a replica's timer loop is moving: what a shard lease is renewed
//! on.
//!
//! The loop marks itself busy when it wakes and again after each batch of
//! fires it hands off, and idle when it waits again. Waiting is healthy
//! however long it lasts (nothing is due), and so is handing off a long
//! burst batch after batch; going long without handing anything off is
//! not — the loop is stuck (every in-flight permit taken by claims that do
//! not finish, a blocked task). A replica
//! whose loop has been busy longer than the stall bound stops renewing its
//! shard leases, so the other replicas take its shards when the leases
//! expire and fire their schedules: the safety net that does not depend on
//! the lease table being right about who is alive.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// The value of an idle loop.
const IDLE: i64 = i64::MIN;

/// When the timer loop last became busy, if it is busy now.
#[derive(Debug)]
pub struct TimerProgress {
    busy_since_ms: AtomicI64,
}

impl Default for TimerProgress {
    fn default() -> Self {
        Self {
            busy_since_ms: AtomicI64::new(IDLE),
        }
    }
}

impl TimerProgress {
    /// The loop woke, or handed off a batch, at `now`: it is busy from
    /// there.
    pub fn busy(&self, now: DateTime<Utc>) {
        // Relaxed: one writer (the loop), readers only compare instants; a
        // reading a moment old is as good as a fresh one.
        self.busy_since_ms
            .store(now.timestamp_millis(), Ordering::Relaxed);
    }

    /// The loop is waiting for the next wake-up.
    pub fn idle(&self) {
        self.busy_since_ms.store(IDLE, Ordering::Relaxed);
    }

    /// How long the loop has been busy at `now`, if it has been for more
    /// than `bound`.
    pub fn stalled(&self, now: DateTime<Utc>, bound: Duration) -> Option<Duration> {
        let since = self.busy_since_ms.load(Ordering::Relaxed);
        if since == IDLE {
            return None;
        }
        let busy = u64::try_from(now.timestamp_millis().saturating_sub(since)).unwrap_or(0);
        let busy = Duration::from_millis(busy);
        (busy > bound).then_some(busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_is_never_a_stall_and_long_busy_is() {
        let progress = TimerProgress::default();
        let t = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let bound = Duration::from_secs(15);
        assert_eq!(
            progress.stalled(t + chrono::Duration::hours(1), bound),
            None
        );
        progress.busy(t);
        assert_eq!(
            progress.stalled(t + chrono::Duration::seconds(15), bound),
            None
        );
        assert_eq!(
            progress.stalled(t + chrono::Duration::seconds(16), bound),
            Some(Duration::from_secs(16))
        );
        progress.idle();
        assert_eq!(
            progress.stalled(t + chrono::Duration::seconds(60), bound),
            None
        );
    }
}
