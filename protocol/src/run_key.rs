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

/// Longest identity (the part after `{job_name}@`) a run key may carry, in
/// bytes. With a 100-character name the whole key is at most 301 bytes: well
/// inside what the ledger's unique index can hold, so a key is never refused
/// by the database.
pub const MAX_IDENTITY_BYTES: usize = 200;

/// Why a run key could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RunKeyError {
    /// The job name breaks the naming rule.
    #[error(transparent)]
    Name(#[from] NameError),
}

/// A received run key that is not `{job_name}@{identity}` with an
/// acceptable identity.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("run_key {shown} is not acceptable: {reason} (a run key is {{job_name}}@{{identity}}, the identity 1 to 200 printable bytes)")]
pub struct InvalidRunKey {
    /// The key, escaped and shortened for a log line.
    pub shown: String,
    /// What is wrong.
    pub reason: &'static str,
}

/// Checks the identity part of a run key (after `{job_name}@`): 1 to
/// [`MAX_IDENTITY_BYTES`] bytes, no whitespace or control characters (NUL
/// among them, which Postgres text cannot hold). Returns what is wrong.
///
/// # Errors
///
/// A sentence naming the broken rule.
pub fn check_identity(identity: &str) -> Result<(), &'static str> {
    if identity.is_empty() {
        return Err("it is empty; use 1 to 200 printable characters");
    }
    if identity.len() > MAX_IDENTITY_BYTES {
        return Err("it is longer than 200 bytes");
    }
    if identity
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("it contains whitespace or control characters");
    }
    Ok(())
}

/// Checks a run key received from outside (a hand-published message):
/// `{job_name}@{identity}`, the identity as [`check_identity`] requires.
///
/// # Errors
///
/// [`InvalidRunKey`] saying which rule the key breaks.
pub fn validate_run_key(job_name: &str, run_key: &str) -> Result<(), InvalidRunKey> {
    let invalid = |reason| InvalidRunKey {
        shown: shown(run_key),
        reason,
    };
    let identity = run_key
        .strip_prefix(job_name)
        .and_then(|rest| rest.strip_prefix('@'))
        .ok_or_else(|| invalid("it does not start with the job name and '@'"))?;
    check_identity(identity).map_err(invalid)
}

/// A value for an error message: escaped (`\u{0}` for NUL) and cut to 120
/// characters, so a hostile key cannot flood or garble a log line.
fn shown(value: &str) -> String {
    let escaped: String = value.escape_debug().collect();
    match escaped.char_indices().nth(120) {
        Some((cut, _)) => format!("\"{}\"... ({} bytes)", &escaped[..cut], value.len()),
        None => format!("\"{escaped}\""),
    }
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
    fn received_keys_are_checked() {
        assert!(validate_run_key("a", "a@2026-07-26T03:00:00Z").is_ok());
        assert!(validate_run_key("a", &format!("a@{}", "k".repeat(200))).is_ok());
        for bad in ["a@", "b@x", "a@x\u{0}", "a@x y", "a@\u{7}"] {
            assert!(validate_run_key("a", bad).is_err(), "{bad:?}");
        }
        let long = validate_run_key("a", &format!("a@{}", "k".repeat(201))).unwrap_err();
        assert!(long.to_string().contains("longer than 200 bytes"), "{long}");
        let nul = validate_run_key("a", "a@x\u{0}").unwrap_err().to_string();
        assert!(nul.contains("\\0") && !nul.contains('\u{0}'), "{nul}");
    }

    #[test]
    fn refuses_bad_names() {
        assert!(run_key("a@b", Utc::now()).is_err());
    }
}
