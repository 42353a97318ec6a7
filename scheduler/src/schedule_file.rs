//! The schedule file (`BELFRY_SCHEDULES`): TOML with one `[[schedule]]`
//! table per schedule; see [`belfry_protocol::schedule_spec`] and
//! `examples/schedules.toml`.
//!
//! The whole file is validated before anything is used: one bad schedule or
//! a duplicate name refuses the file, so a typo never leaves a replica
//! running half of its schedules.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use belfry_protocol::ScheduleSpec;

use crate::schedule::{Schedule, ScheduleError};

/// Why a schedule file was refused.
#[derive(Debug, Error)]
pub enum ScheduleFileError {
    /// The file could not be read.
    #[error("cannot read schedule file {path}: {source}")]
    Read {
        /// The path tried.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown or mistyped fields.
    #[error("schedule file {path} is not valid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A schedule in the file is invalid.
    #[error("schedule file {path}: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The first invalid schedule.
        #[source]
        source: ScheduleError,
    },
    /// Two schedules share a name.
    #[error(
        "schedule file {path}: schedule name {name:?} is used more than once; names must be unique"
    )]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// The repeated name.
        name: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleFile {
    #[serde(default)]
    schedule: Vec<ScheduleSpec>,
}

/// Reads and validates the schedule file at `path`.
///
/// # Errors
///
/// [`ScheduleFileError`] when the file cannot be read, is not valid TOML,
/// holds an invalid schedule, or repeats a name.
pub fn load(path: &Path) -> Result<Vec<ScheduleSpec>, ScheduleFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScheduleFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &text)
}

/// Validates schedule-file text; `path` is only used in error messages.
///
/// # Errors
///
/// As [`load`], except for reading.
pub fn parse(path: &Path, text: &str) -> Result<Vec<ScheduleSpec>, ScheduleFileError> {
    let file: ScheduleFile = toml::from_str(text).map_err(|e| ScheduleFileError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let mut seen = HashSet::new();
    let mut cache = crate::zoned_cron::CronCache::default();
    for spec in &file.schedule {
        if !seen.insert(spec.name.clone()) {
            return Err(ScheduleFileError::Duplicate {
                path: path.to_owned(),
                name: spec.name.clone(),
            });
        }
        Schedule::from_spec_cached(spec, &mut cache).map_err(|source| {
            ScheduleFileError::Invalid {
                path: path.to_owned(),
                source,
            }
        })?;
    }
    Ok(file.schedule)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "schedules.toml";

    #[test]
    fn reads_cron_interval_and_payload() {
        let text = r#"
            [[schedule]]
            name = "nightly-report"
            cron = "0 0 3 * * *"
            timezone = "Asia/Shanghai"
            job_type = "http"
            payload = { url = "http://127.0.0.1:9/report", retries = 2 }

            [[schedule]]
            name = "heartbeat"
            every = "30s"
            job_type = "noop"
        "#;
        let s = parse(Path::new(P), text).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].payload.as_ref().unwrap()["retries"], 2);
        assert_eq!(s[1].payload, None);
    }

    #[test]
    fn refuses_duplicates_unknown_fields_and_bad_schedules() {
        let dup = "[[schedule]]\nname='a'\nevery='1s'\njob_type='noop'\n\
                   [[schedule]]\nname='a'\nevery='2s'\njob_type='noop'\n";
        assert!(matches!(
            parse(Path::new(P), dup),
            Err(ScheduleFileError::Duplicate { name, .. }) if name == "a"
        ));
        let unknown = "[[schedule]]\nname='a'\nevry='1s'\njob_type='noop'\n";
        let e = parse(Path::new(P), unknown).unwrap_err().to_string();
        assert!(e.contains("evry"), "{e}");
        let bad = "[[schedule]]\nname='a'\ncron='61 * * * * *'\njob_type='noop'\n";
        let e = parse(Path::new(P), bad).unwrap_err().to_string();
        assert!(e.contains("schedule \"a\": field `cron`"), "{e}");
        let missing = load(Path::new("/nonexistent/belfry.toml"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("/nonexistent/belfry.toml"), "{missing}");
    }
}
