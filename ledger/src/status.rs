//! The lifecycle of a run.
//!
//! `claimed → dispatched → running ⇄ retrying → succeeded | failed | dead |
//! cancelled`; a fire an overlap policy holds back starts as `buffered`
//! (then `claimed` once the schedule's previous run has ended).
//!
//! - `failed`: the handler reported a permanent error; the job ran and its
//!   outcome is a failure.
//! - `dead`: the message can never be processed: unknown job type, a payload
//!   the handler cannot decode, retries exhausted, or no worker group bound to
//!   the job type. Dead runs are also dead-lettered on the broker.
//! - `cancelled`: an operator (or an overlap policy) cancelled the run: a
//!   waiting run never executes; a running one was stopped on its worker.
//!   Never retried, never dead-lettered; `last_error` says who cancelled it.

use std::fmt;
use std::str::FromStr;

/// The status of a run in `job_runs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunStatus {
    /// A replica won the fire, and the schedule's overlap policy holds it
    /// until the previous run ends (`buffer_one`, `buffer_all`,
    /// `cancel_other`); then it becomes `claimed`.
    Buffered,
    /// A scheduler replica won the fire; not yet confirmed by the broker.
    Claimed,
    /// The broker confirmed the message.
    Dispatched,
    /// A worker is running an attempt.
    Running,
    /// An attempt failed with a retryable error; another will follow.
    Retrying,
    /// An attempt succeeded.
    Succeeded,
    /// The handler reported a permanent error.
    Failed,
    /// The run can never complete; see the module docs.
    Dead,
    /// The run was cancelled; see the module docs.
    Cancelled,
}

impl RunStatus {
    /// All statuses, in lifecycle order.
    pub const ALL: [RunStatus; 9] = [
        Self::Buffered,
        Self::Claimed,
        Self::Dispatched,
        Self::Running,
        Self::Retrying,
        Self::Succeeded,
        Self::Failed,
        Self::Dead,
        Self::Cancelled,
    ];

    /// The value stored in `job_runs.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Buffered => "buffered",
            Self::Claimed => "claimed",
            Self::Dispatched => "dispatched",
            Self::Running => "running",
            Self::Retrying => "retrying",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Dead => "dead",
            Self::Cancelled => "cancelled",
        }
    }

    /// True for `succeeded`, `failed`, `dead` and `cancelled`: nothing more
    /// will happen.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::Dead | Self::Cancelled
        )
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown run status {s:?}"))
    }
}

/// The statuses of a run that waits for a worker (`claimed`, `dispatched`,
/// `retrying`) as an SQL list, written once for both backends' statements.
/// A macro, so `concat!` builds each statement at compile time.
macro_rules! waiting_statuses {
    () => {
        "('claimed', 'dispatched', 'retrying')"
    };
}
pub(crate) use waiting_statuses;

/// Statuses of a run no worker is executing right now, as an SQL list.
pub(crate) const WAITING: &str = waiting_statuses!();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_terminality() {
        for st in RunStatus::ALL {
            assert_eq!(st.as_str().parse::<RunStatus>().unwrap(), st);
        }
        let terminal: Vec<_> = RunStatus::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [
                RunStatus::Succeeded,
                RunStatus::Failed,
                RunStatus::Dead,
                RunStatus::Cancelled
            ]
        );
        assert!("bogus".parse::<RunStatus>().is_err());
    }
}
