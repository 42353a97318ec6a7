//! The run key: the identity of one fire of one job.
//!
//! `run_key = {job_name}@{fire instant in UTC, RFC 3339, whole seconds}`, for
//! example `nightly-report@2026-07-26T03:00:00Z`. It is a pure function of
//! the schedule's name and the nominal fire instant, never of the wall clock
//! at the moment a timer woke up: two replicas whose clocks differ, or whose
//! timers wake late, compute the same key, and `UNIQUE(job_name, run_key)` in
//! the ledger turns that into "exactly one winner".

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use thiserror::Error;

use crate::name::{validate_name, NameError};

/// Why a run key could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RunKeyError {
    /// The job name breaks the naming rule.
    #[error(transparent)]
    Name(#[from] NameError),
}

/// Builds the run key for `job_name` firing at `fire_at`.
///
/// Sub-second parts of `fire_at` are truncated: fire instants are whole
/// seconds, and truncation (not rounding) keeps `run_key(n, t)` stable for
/// every `t` inside the same second.
///
/// # Errors
///
/// [`RunKeyError::Name`] when `job_name` breaks the naming rule of
/// [`crate::name`].
pub fn run_key(job_name: &str, fire_at: DateTime<Utc>) -> Result<String, RunKeyError> {
    validate_name("job name", job_name)?;
    Ok(format!("{job_name}@{}", format_instant(fire_at)))
}

/// Formats an instant the way run keys do: RFC 3339, UTC, `Z`, whole seconds.
pub fn format_instant(at: DateTime<Utc>) -> String {
    at.trunc_subsecs(0)
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn matches_the_documented_example() {
        let at = Utc.with_ymd_and_hms(2026, 7, 26, 3, 0, 0).single().unwrap();
        assert_eq!(
            run_key("nightly-report", at).unwrap(),
            "nightly-report@2026-07-26T03:00:00Z"
        );
    }

    #[test]
    fn truncates_sub_seconds() {
        let at = Utc.with_ymd_and_hms(2026, 7, 26, 3, 0, 0).single().unwrap()
            + chrono::Duration::milliseconds(999);
        assert_eq!(run_key("a", at).unwrap(), "a@2026-07-26T03:00:00Z");
    }

    #[test]
    fn refuses_bad_names() {
        assert!(run_key("a@b", Utc::now()).is_err());
    }
}
