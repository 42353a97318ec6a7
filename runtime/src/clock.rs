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
