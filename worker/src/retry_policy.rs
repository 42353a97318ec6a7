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
use belfry_protocol::RetryOverride;

/// Longest delay an override may ask for: one week. Values past it (from a
/// hand-written message, say) are clamped, never trusted into arithmetic
/// that could overflow.
const MAX_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

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
    /// This policy with the fields `o` sets replaced, each clamped to a
    /// sane range (attempts 1–1000, multiplier 1–100, delays ≤ 7 days).
    pub fn with_override(&self, o: &RetryOverride) -> Self {
        let ms = |v: Option<u64>, d: Duration| {
            v.map_or(d, |ms| Duration::from_millis(ms).min(MAX_DELAY))
        };
        Self {
            max_attempts: o
                .max_attempts
                .map_or(self.max_attempts, |n| n.clamp(1, 1000)),
            initial_delay: ms(o.initial_delay_ms, self.initial_delay),
            multiplier: o
                .multiplier
                .filter(|m| m.is_finite())
                .map_or(self.multiplier, |m| m.clamp(1.0, 100.0)),
            max_delay: ms(o.max_delay_ms, self.max_delay),
            jitter: o.jitter.unwrap_or(self.jitter),
        }
    }

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
    fn overrides_replace_only_what_they_set_and_are_clamped() {
        let p = policy(false).with_override(&RetryOverride {
            max_attempts: Some(0),
            multiplier: Some(f32::INFINITY),
            max_delay_ms: Some(u64::MAX),
            ..Default::default()
        });
        assert_eq!(p.max_attempts, 1);
        assert_eq!(p.multiplier, 3.0);
        assert_eq!(p.max_delay, MAX_DELAY);
        assert_eq!(p.initial_delay, Duration::from_millis(100));
        let p = policy(false).with_override(&RetryOverride {
            multiplier: Some(1000.0),
            ..Default::default()
        });
        assert_eq!(p.multiplier, 100.0);
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
