//! The pace of recent work: a decaying maximum of how long it took.
//!
//! Two of a replica's safety bounds are judged against the database's own
//! speed rather than a fixed number: the timer loop's stall bound
//! ([`crate::timer_progress`], by the slowest recent batch of claims) and
//! the shard lease lifetime ([`crate::shard_lease`], by the slowest recent
//! lease pass). Both read the same figure: one slow run raises it at once,
//! and every run after it lowers it by an eighth, so a spell of saturation
//! stretches the bounds while it lasts and they come back down within a few
//! dozen runs once it passes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The slowest recent duration, decaying by an eighth per run recorded.
#[derive(Debug, Default)]
pub struct Pace {
    slowest_ms: AtomicU64,
}

impl Pace {
    /// A run took `took`.
    pub fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        // Relaxed: runs finish on several tasks; each update is one atomic
        // read-modify-write, and readers only need a recent value.
        let _ = self
            .slowest_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |slow| {
                Some(took.max(slow - slow / 8))
            });
    }

    /// `bound`, stretched to `factor` times the slowest recent run, at most
    /// `max_stretch` times `bound`.
    pub fn stretch(&self, bound: Duration, factor: u32, max_stretch: u32) -> Duration {
        let slow = Duration::from_millis(self.slowest_ms.load(Ordering::Relaxed));
        bound
            .max(slow.saturating_mul(factor))
            .min(bound.saturating_mul(max_stretch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_slow_run_stretches_at_once_and_the_stretch_fades() {
        let pace = Pace::default();
        let bound = Duration::from_secs(5);
        pace.record(Duration::from_millis(40));
        assert_eq!(pace.stretch(bound, 4, 4), bound);
        pace.record(Duration::from_secs(3));
        assert_eq!(pace.stretch(bound, 4, 4), Duration::from_secs(12));
        pace.record(Duration::from_secs(3600));
        assert_eq!(pace.stretch(bound, 4, 4), Duration::from_secs(20));
        for _ in 0..200 {
            pace.record(Duration::from_millis(40));
        }
        assert_eq!(pace.stretch(bound, 4, 4), bound);
    }
}
