//! The injected clock.
//!
//! Time-dependent logic (which fires are due, how late a fire is) reads the
//! time through [`Clock`] so tests can run a replica on a skewed clock, and
//! drive loops with explicit instants, without sleeping.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};

/// A source of the current UTC time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// A shareable clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// The system clock shifted by a fixed offset: a replica whose clock is
/// wrong, for tests of clock-skew behaviour.
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    /// Added to the system time.
    pub offset: Duration,
}

impl Clock for SkewedClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.offset
    }
}

/// The environment variable that skews [`process_clock`] in fault builds:
/// a signed offset in milliseconds (`5000`, `-3000`).
pub const FAULT_SKEW_ENV: &str = "BELFRY_FAULT_CLOCK_SKEW_MS";

/// The clock a binary runs on: the system clock. In `failpoints` builds
/// (fault tests only), [`FAULT_SKEW_ENV`] shifts it, so a real process can
/// be run with a wrong clock; an unparsable value is ignored with a warning.
pub fn process_clock() -> SharedClock {
    #[cfg(feature = "failpoints")]
    if let Ok(raw) = std::env::var(FAULT_SKEW_ENV) {
        match raw.trim().parse::<i64>() {
            Ok(ms) => {
                tracing::warn!(
                    skew_ms = ms,
                    "fault injection: this process's clock is skewed"
                );
                return Arc::new(SkewedClock {
                    offset: Duration::milliseconds(ms),
                });
            }
            Err(e) => {
                tracing::warn!(value = %raw, error = %e, "{FAULT_SKEW_ENV} ignored: not a whole number of milliseconds")
            }
        }
    }
    Arc::new(SystemClock)
}
