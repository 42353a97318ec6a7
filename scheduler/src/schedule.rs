//! A validated schedule and its fire instants.
//!
//! Fire instants are a pure function of the definition: cron expressions are
//! evaluated in the schedule's time zone by `croner`; intervals are anchored
//! at the Unix epoch (`every = "30s"` fires at every instant whose Unix time
//! is a multiple of 30), so every replica, and every restart, computes the
//! same instants and therefore the same run keys.

use chrono::{DateTime, Duration, SubsecRound, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use thiserror::Error;

use belfry_ledger::ScheduleRow;
use belfry_protocol::{validate_name, ScheduleSpec};

/// An invalid schedule definition: which schedule, which field, and what is
/// allowed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("schedule {schedule:?}: field `{field}`: {message}")]
pub struct ScheduleError {
    /// The schedule's name (as given, possibly invalid itself).
    pub schedule: String,
    /// The offending field.
    pub field: &'static str,
    /// What was wrong and what is allowed.
    pub message: String,
}

/// How a schedule produces fire instants.
#[derive(Debug, Clone)]
pub enum ScheduleKind {
    /// A cron expression in a time zone.
    Cron {
        /// The expression as written.
        expr: String,
        /// The parsed expression.
        cron: Box<Cron>,
        /// The time zone it is read in.
        tz: Tz,
    },
    /// A fixed interval anchored at the Unix epoch.
    Every {
        /// The period, a whole number of seconds.
        period: Duration,
    },
}

/// A validated schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Unique name; the job name of its runs.
    pub name: String,
    /// Job type of its runs.
    pub job_type: String,
    /// Payload of its runs.
    pub payload: serde_json::Value,
    /// How it fires.
    pub kind: ScheduleKind,
}

impl Schedule {
    /// Validates a definition.
    ///
    /// # Errors
    ///
    /// [`ScheduleError`] naming the field when the name or job type breaks
    /// the naming rule, neither or both of `cron` and `every` are given, the
    /// cron expression does not parse, the time zone is not an IANA name, or
    /// the interval is not a positive whole number of seconds.
    pub fn from_spec(spec: &ScheduleSpec) -> Result<Self, ScheduleError> {
        let err = |field: &'static str, message: String| ScheduleError {
            schedule: spec.name.clone(),
            field,
            message,
        };
        validate_name("schedule name", &spec.name).map_err(|e| err("name", e.to_string()))?;
        validate_name("job type", &spec.job_type).map_err(|e| err("job_type", e.to_string()))?;
        let tz_name = spec.timezone.as_deref().unwrap_or("UTC");
        let kind =
            match (&spec.cron, &spec.every) {
                (Some(expr), None) => {
                    let tz: Tz = tz_name.parse().map_err(|_| {
                        err(
                            "timezone",
                            format!(
                                "unknown time zone {tz_name:?}; use an IANA name such as \
                             \"UTC\", \"Europe/London\" or \"Asia/Shanghai\""
                            ),
                        )
                    })?;
                    let cron = Cron::new(expr)
                        .with_seconds_optional()
                        .parse()
                        .map_err(|e| {
                            err(
                                "cron",
                                format!(
                                    "invalid cron expression {expr:?}: {e}; expected 6 fields \
                                 (sec min hour day-of-month month day-of-week) or 5 \
                                 (seconds = 0), e.g. \"0 */5 * * * *\""
                                ),
                            )
                        })?;
                    ScheduleKind::Cron {
                        expr: expr.clone(),
                        cron: Box::new(cron),
                        tz,
                    }
                }
                (None, Some(every)) => {
                    if spec.timezone.is_some() {
                        return Err(err(
                        "timezone",
                        "interval schedules live in absolute time; remove `timezone` or use `cron`"
                            .into(),
                    ));
                    }
                    ScheduleKind::Every {
                        period: parse_period(every).map_err(|m| err("every", m))?,
                    }
                }
                (None, None) => return Err(err(
                    "cron",
                    "give exactly one of `cron` (e.g. \"0 0 3 * * *\") or `every` (e.g. \"30s\")"
                        .into(),
                )),
                (Some(_), Some(_)) => {
                    return Err(err(
                        "every",
                        "`cron` and `every` are exclusive; keep one of them".into(),
                    ))
                }
            };
        Ok(Self {
            name: spec.name.clone(),
            job_type: spec.job_type.clone(),
            payload: spec.payload.clone().unwrap_or(serde_json::Value::Null),
            kind,
        })
    }

    /// The first fire instant strictly after `after`, or `None` when the
    /// schedule never fires again (a cron expression for a date that does
    /// not come, such as 30 February).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Fire instants are whole seconds; start from the second `after` is
        // in, so "strictly after" means "from the next whole second".
        let after = after.trunc_subsecs(0);
        match &self.kind {
            ScheduleKind::Cron { cron, tz, .. } => {
                let local = after.with_timezone(tz);
                cron.find_next_occurrence(&local, false)
                    .ok()
                    .map(|t| t.with_timezone(&Utc))
            }
            ScheduleKind::Every { period } => {
                let period_s = period.num_seconds();
                let now_s = after.timestamp();
                let next = (now_s.div_euclid(period_s) + 1).checked_mul(period_s)?;
                Utc.timestamp_opt(next, 0).single()
            }
        }
    }

    /// The row this schedule is stored as in `schedules`.
    pub fn to_row(&self) -> ScheduleRow {
        let (cron, every_ms, timezone) = match &self.kind {
            ScheduleKind::Cron { expr, tz, .. } => (Some(expr.clone()), None, tz.name().to_owned()),
            ScheduleKind::Every { period } => (None, Some(period.num_milliseconds()), "UTC".into()),
        };
        ScheduleRow {
            name: self.name.clone(),
            cron,
            every_ms,
            timezone,
            job_type: self.job_type.clone(),
            payload: self.payload.clone(),
            paused: false,
        }
    }
}

fn parse_period(raw: &str) -> Result<Duration, String> {
    let std = humantime::parse_duration(raw.trim()).map_err(|e| {
        format!("invalid interval {raw:?}: {e}; expected a duration such as \"30s\", \"5m\" or \"1h 30m\"")
    })?;
    if std.is_zero() {
        return Err(format!("interval {raw:?} is zero; it must be at least 1s"));
    }
    if std.subsec_nanos() != 0 {
        return Err(format!(
            "interval {raw:?} is not a whole number of seconds; fire instants are whole seconds"
        ));
    }
    let secs = i64::try_from(std.as_secs())
        .ok()
        .filter(|s| *s <= 366 * 24 * 3600 * 100)
        .ok_or_else(|| format!("interval {raw:?} is too long; at most 100 years"))?;
    Ok(Duration::seconds(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cron: Option<&str>, every: Option<&str>, tz: Option<&str>) -> ScheduleSpec {
        ScheduleSpec {
            name: "s".into(),
            cron: cron.map(Into::into),
            every: every.map(Into::into),
            timezone: tz.map(Into::into),
            job_type: "noop".into(),
            payload: None,
        }
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn six_and_five_field_cron() {
        let s = Schedule::from_spec(&spec(Some("*/2 * * * * *"), None, None)).unwrap();
        assert_eq!(
            s.next_after(at("2026-07-26T03:00:00.700Z")),
            Some(at("2026-07-26T03:00:02Z"))
        );
        let s = Schedule::from_spec(&spec(Some("0 3 * * *"), None, None)).unwrap();
        assert_eq!(
            s.next_after(at("2026-07-26T03:00:00Z")),
            Some(at("2026-07-27T03:00:00Z"))
        );
    }

    #[test]
    fn cron_in_a_time_zone() {
        let s =
            Schedule::from_spec(&spec(Some("0 0 3 * * *"), None, Some("Asia/Shanghai"))).unwrap();
        assert_eq!(
            s.next_after(at("2026-07-26T00:00:00Z")),
            Some(at("2026-07-26T19:00:00Z"))
        );
    }

    #[test]
    fn intervals_are_epoch_anchored() {
        let s = Schedule::from_spec(&spec(None, Some("30s"), None)).unwrap();
        assert_eq!(
            s.next_after(at("2026-07-26T03:00:10.5Z")),
            Some(at("2026-07-26T03:00:30Z"))
        );
        assert_eq!(
            s.next_after(at("2026-07-26T03:00:30Z")),
            Some(at("2026-07-26T03:01:00Z"))
        );
    }

    #[test]
    fn bad_definitions_name_the_field() {
        let cases = [
            (spec(Some("not cron"), None, None), "cron"),
            (
                spec(Some("* * * * * *"), None, Some("Mars/Base")),
                "timezone",
            ),
            (spec(None, Some("0s"), None), "every"),
            (spec(None, Some("1500ms"), None), "every"),
            (spec(None, Some("-5s"), None), "every"),
            (spec(None, None, None), "cron"),
            (spec(Some("* * * * * *"), Some("1s"), None), "every"),
        ];
        for (s, field) in cases {
            let e = Schedule::from_spec(&s).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().starts_with("schedule \"s\": field"), "{e}");
        }
        let mut bad_name = spec(None, Some("1s"), None);
        bad_name.name = "has space".into();
        assert_eq!(Schedule::from_spec(&bad_name).unwrap_err().field, "name");
    }
}
