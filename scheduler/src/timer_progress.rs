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
//!
//! A slow database is not a stuck loop. When every claim takes long (a
//! million fires on one instant saturating Postgres and the broker), the
//! loop waits for permits as long as a batch takes, and a fixed bound
//! would let every replica drop its shards to the others, just as slow,
//! which then spend the database's time loading and recovering them. So
//! the bound stretches with the claims' own pace: it is the larger of the
//! configured bound and [`SLOW_BATCH_FACTOR`] times the slowest recent
//! batch (a decaying maximum, [`crate::pace`], so one slow batch stretches it at once and
//! the stretch fades over the batches after it), up to
//! [`MAX_STRETCH`] times the configured bound. A claim that never finishes
//! reports no duration and stretches nothing: the loop waiting on it is a
//! stall within the bound the finished batches set.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::pace::Pace;

/// The value of an idle loop.
const IDLE: i64 = i64::MIN;

/// How many times the slowest recent batch the loop may wait for permits
/// before it counts as stalled: it waits for the oldest batch in flight,
/// which may have started just before it began waiting.
pub const SLOW_BATCH_FACTOR: u32 = 3;

/// The bound never stretches beyond this many times the configured one.
pub const MAX_STRETCH: u32 = 8;

/// When the timer loop last became busy, if it is busy now, and how long
/// recent batches took.
#[derive(Debug)]
pub struct TimerProgress {
    busy_since_ms: AtomicI64,
    /// The slowest recent batch, decaying by an eighth per batch.
    batches: Pace,
}

impl Default for TimerProgress {
    fn default() -> Self {
        Self {
            busy_since_ms: AtomicI64::new(IDLE),
            batches: Pace::default(),
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

    /// A batch handed off at `started` finished (claimed and published, or
    /// failed) at `now`.
    pub fn batch_done(&self, started: DateTime<Utc>, now: DateTime<Utc>) {
        self.batches
            .record((now - started).to_std().unwrap_or_default());
    }

    /// The bound the loop is judged by: `bound`, stretched to the pace of
    /// recent batches (see the module header).
    pub fn bound(&self, bound: Duration) -> Duration {
        self.batches.stretch(bound, SLOW_BATCH_FACTOR, MAX_STRETCH)
    }

    /// How long the loop has been busy at `now`, if it has been for more
    /// than `bound` stretched to the pace of recent batches.
    pub fn stalled(&self, now: DateTime<Utc>, bound: Duration) -> Option<Duration> {
        let since = self.busy_since_ms.load(Ordering::Relaxed);
        if since == IDLE {
            return None;
        }
        let busy = u64::try_from(now.timestamp_millis().saturating_sub(since)).unwrap_or(0);
        let busy = Duration::from_millis(busy);
        (busy > self.bound(bound)).then_some(busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap()
    }

    #[test]
    fn waiting_is_never_a_stall_and_long_busy_is() {
        let progress = TimerProgress::default();
        let t = t();
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

    #[test]
    fn slow_batches_stretch_the_bound_and_the_stretch_fades() {
        let progress = TimerProgress::default();
        let t = t();
        let bound = Duration::from_secs(15);
        // Fast batches leave the bound as configured.
        progress.batch_done(t, t + chrono::Duration::milliseconds(40));
        assert_eq!(progress.bound(bound), bound);
        // A batch of 20 s: the loop may wait 60 s for permits.
        progress.batch_done(t, t + chrono::Duration::seconds(20));
        assert_eq!(progress.bound(bound), Duration::from_secs(60));
        progress.busy(t);
        assert_eq!(
            progress.stalled(t + chrono::Duration::seconds(59), bound),
            None
        );
        assert_eq!(
            progress.stalled(t + chrono::Duration::seconds(61), bound),
            Some(Duration::from_secs(61))
        );
        // Never beyond eight times the bound, however slow.
        progress.batch_done(t, t + chrono::Duration::hours(1));
        assert_eq!(progress.bound(bound), Duration::from_secs(120));
        // Fast batches after it bring the bound back down.
        for _ in 0..200 {
            progress.batch_done(t, t + chrono::Duration::milliseconds(40));
        }
        assert_eq!(progress.bound(bound), bound);
    }
}
