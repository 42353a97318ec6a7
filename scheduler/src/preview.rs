//! `belfry-scheduler preview`: the next fire instants of a schedule
//! expression, computed by the same code the timer uses.
//!
//! ```text
//! belfry-scheduler preview --cron "0 30 1 * * *" --tz America/New_York --from 2026-10-31T12:00:00Z --count 3
//! 2026-11-01T05:30:00Z
//! 2026-11-02T06:30:00Z
//! 2026-11-03T06:30:00Z
//! ```
//!
//! One instant per line, RFC 3339 UTC with a `Z` suffix, strictly after
//! `--from` (default: now). `--every 30s` previews an interval instead.

use chrono::{DateTime, SecondsFormat, Utc};
use thiserror::Error;

use belfry_protocol::ScheduleSpec;

use crate::schedule::{Schedule, ScheduleError};

/// Most instants one preview prints.
pub const MAX_COUNT: usize = 10_000;

/// A preview request.
#[derive(Debug, Clone, PartialEq)]
pub struct PreviewRequest {
    /// Cron expression (exclusive with `every`).
    pub cron: Option<String>,
    /// Interval (exclusive with `cron`).
    pub every: Option<String>,
    /// IANA time zone for `cron`.
    pub tz: Option<String>,
    /// Instants strictly after this; default now.
    pub from: Option<DateTime<Utc>>,
    /// How many instants.
    pub count: usize,
    /// No instant before this (RFC 3339, as `start_at`).
    pub start_at: Option<String>,
    /// No instant after this (RFC 3339, as `end_at`).
    pub end_at: Option<String>,
    /// At most this many instants (as `remaining_runs`).
    pub remaining_runs: Option<u64>,
}

/// Why a preview could not be computed.
#[derive(Debug, Error)]
pub enum PreviewError {
    /// The command line is wrong.
    #[error("{0}\nusage: belfry-scheduler preview (--cron \"<expr>\" [--tz <zone>] | --every <duration>) [--from <RFC 3339>] [--count N] [--start-at <RFC 3339>] [--end-at <RFC 3339>] [--remaining-runs N]")]
    Usage(String),
    /// The expression, zone or interval is invalid.
    #[error("{0}")]
    Schedule(#[from] ScheduleError),
}

/// Parses the arguments after `preview`.
///
/// # Errors
///
/// [`PreviewError::Usage`] for an unknown flag, a flag without value, an
/// unparsable `--from` or a `--count` outside 1 to 10 000.
pub fn parse_args(args: &[String]) -> Result<PreviewRequest, PreviewError> {
    let mut request = PreviewRequest {
        cron: None,
        every: None,
        tz: None,
        from: None,
        count: 10,
        start_at: None,
        end_at: None,
        remaining_runs: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| PreviewError::Usage(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--cron" => request.cron = Some(value()?),
            "--every" => request.every = Some(value()?),
            "--tz" => request.tz = Some(value()?),
            "--from" => {
                let raw = value()?;
                let from = DateTime::parse_from_rfc3339(&raw).map_err(|e| {
                    PreviewError::Usage(format!("--from {raw:?} is not an RFC 3339 instant ({e}); e.g. 2026-07-26T03:00:00Z"))
                })?;
                request.from = Some(from.with_timezone(&Utc));
            }
            "--count" => {
                let raw = value()?;
                request.count = raw
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_COUNT).contains(n))
                    .ok_or_else(|| {
                        PreviewError::Usage(format!(
                            "--count {raw:?}: expected a whole number from 1 to {MAX_COUNT}"
                        ))
                    })?;
            }
            "--start-at" => request.start_at = Some(value()?),
            "--end-at" => request.end_at = Some(value()?),
            "--remaining-runs" => {
                let raw = value()?;
                request.remaining_runs = Some(raw.parse().map_err(|_| {
                    PreviewError::Usage(format!(
                        "--remaining-runs {raw:?}: expected a whole number"
                    ))
                })?);
            }
            other => return Err(PreviewError::Usage(format!("unknown argument {other:?}"))),
        }
    }
    if request.cron.is_some() == request.every.is_some() {
        return Err(PreviewError::Usage(
            "give exactly one of --cron and --every".into(),
        ));
    }
    Ok(request)
}

/// The next instants of `request`, formatted one per line; `now` is the
/// default `--from`.
///
/// # Errors
///
/// [`PreviewError::Schedule`] naming the field that is invalid.
pub fn preview(request: &PreviewRequest, now: DateTime<Utc>) -> Result<Vec<String>, PreviewError> {
    let schedule = Schedule::from_spec(&ScheduleSpec {
        name: "preview".into(),
        cron: request.cron.clone(),
        every: request.every.clone(),
        timezone: request.tz.clone(),
        job_type: "preview".into(),
        start_at: request.start_at.clone(),
        end_at: request.end_at.clone(),
        remaining_runs: request.remaining_runs,
        ..ScheduleSpec::default()
    })?;
    let count = match request.remaining_runs {
        Some(left) => request
            .count
            .min(usize::try_from(left).unwrap_or(usize::MAX)),
        None => request.count,
    };
    Ok(schedule
        .upcoming(request.from.unwrap_or(now), count)
        .into_iter()
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn prints_instants_after_from() {
        let r = parse_args(&args(&[
            "--cron",
            "0 30 1 * * *",
            "--tz",
            "America/New_York",
            "--from",
            "2026-10-31T12:00:00Z",
            "--count",
            "3",
        ]))
        .unwrap();
        assert_eq!(
            preview(&r, Utc::now()).unwrap(),
            [
                "2026-11-01T05:30:00Z",
                "2026-11-02T06:30:00Z",
                "2026-11-03T06:30:00Z"
            ]
        );
        let r = parse_args(&args(&[
            "--every",
            "90s",
            "--from",
            "2026-07-26T03:00:00+02:00",
            "--count",
            "2",
        ]))
        .unwrap();
        assert_eq!(
            preview(&r, Utc::now()).unwrap(),
            ["2026-07-26T01:01:30Z", "2026-07-26T01:03:00Z"]
        );
    }

    #[test]
    fn bad_input_says_what_is_wrong() {
        for (a, needle) in [
            (vec!["--cron"], "--cron needs a value"),
            (
                vec!["--cron", "* * * * * *", "--count", "0"],
                "--count \"0\"",
            ),
            (
                vec!["--cron", "* * * * * *", "--from", "yesterday"],
                "--from \"yesterday\"",
            ),
            (vec!["--bogus"], "unknown argument"),
            (vec![], "exactly one of --cron and --every"),
        ] {
            let e = parse_args(&args(&a)).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("usage:"), "{a:?}: {e}");
        }
        let r = parse_args(&args(&["--cron", "0 0 * * * *", "--tz", "Mars/Olympus"])).unwrap();
        let e = preview(&r, Utc::now()).unwrap_err().to_string();
        assert!(e.contains("field `timezone`"), "{e}");
    }
}
