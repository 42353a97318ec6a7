//! How failed attempts are retried: a value, not code.
//!
//! Delays grow exponentially: attempt 1 fails → wait `initial`; attempt 2
//! fails → `initial × multiplier`; … capped at `max_delay`. With `jitter`,
//! each delay is stretched by a random factor in `[1, 2)` so that many runs
//! failing together do not retry in lockstep. The delay sequence comes from
//! the `backon` crate (the `backoff` crate of early plans is unmaintained,
//! RUSTSEC-2025-0012); the attempt count itself is durable in `job_runs`, so
//! a restarted worker continues the sequence instead of starting over.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// A retry policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (1 = never retry).
    pub max_attempts: u32,
    /// Delay after the first failed attempt.
    pub initial_delay: Duration,
    /// Growth factor per failed attempt (≥ 1).
    pub multiplier: f32,
    /// Upper bound of a delay (before jitter).
    pub max_delay: Duration,
    /// Whether delays are randomly stretched by up to 100 %.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    /// 5 attempts; 1 s, 2 s, 4 s, 8 s between them (capped at 5 min); jitter on.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(300),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// The delay to wait after attempt `failed_attempt` (1-based) failed, or
    /// `None` when no attempt is left.
    pub fn delay_after(&self, failed_attempt: u32) -> Option<Duration> {
        if failed_attempt == 0 || failed_attempt >= self.max_attempts {
            return None;
        }
        let mut builder = ExponentialBuilder::new()
            .with_min_delay(self.initial_delay)
            .with_factor(self.multiplier.max(1.0))
            .with_max_delay(self.max_delay)
            .without_max_times();
        if self.jitter {
            builder = builder.with_jitter();
        }
        let index = usize::try_from(failed_attempt - 1).unwrap_or(usize::MAX);
        builder.build().nth(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(jitter: bool) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 6,
            initial_delay: Duration::from_millis(100),
            multiplier: 3.0,
            max_delay: Duration::from_secs(2),
            jitter,
        }
    }

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let p = policy(false);
        let delays: Vec<_> = (1..6)
            .map(|a| p.delay_after(a).unwrap().as_millis())
            .collect();
        assert_eq!(delays, [100, 300, 900, 2000, 2000]);
        assert_eq!(p.delay_after(6), None);
        assert_eq!(p.delay_after(0), None);
    }

    #[test]
    fn jitter_stays_within_one_to_two_times() {
        let p = policy(true);
        for a in 1..6 {
            let base = policy(false).delay_after(a).unwrap();
            let d = p.delay_after(a).unwrap();
            assert!(d >= base && d < base * 2, "attempt {a}: {d:?} vs {base:?}");
        }
    }

    #[test]
    fn one_attempt_means_no_retry() {
        let p = RetryPolicy {
            max_attempts: 1,
            ..policy(false)
        };
        assert_eq!(p.delay_after(1), None);
    }
}
