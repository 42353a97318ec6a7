//! A validated schedule and its fire instants.
//!
//! Fire instants are a pure function of the definition: cron expressions are
//! evaluated in the schedule's time zone by `croner`; intervals are anchored
//! at the Unix epoch (`every = "30s"` fires at every instant whose Unix time
//! is a multiple of 30), so every replica, and every restart, computes the
//! same instants and therefore the same run keys.

use chrono::{DateTime, Duration, SubsecRound, TimeZone, Utc};
use chrono_tz::Tz;

use crate::misfire::MisfirePolicy;
use std::sync::Arc;

use crate::zoned_cron::{CronCache, ZonedCron};
use thiserror::Error;

use belfry_ledger::{OverlapRule, ScheduleRow};
use belfry_protocol::{
    validate_name, FollowUp, FollowUpSpec, FollowUps, JobOptions, RetryOverride, ScheduleSpec,
};

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
    /// A cron expression in a time zone, shared by every schedule with the
    /// same expression and zone (see [`CronCache`]).
    Cron(Arc<ZonedCron>),
    /// A fixed interval counted from an anchor instant (default the Unix
    /// epoch).
    Every {
        /// The period, a whole number of seconds.
        period: Duration,
        /// Unix seconds of the anchor.
        anchor: i64,
    },
    /// One run at one instant.
    Once {
        /// The instant.
        at: DateTime<Utc>,
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
    /// Retry/timeout overrides for its runs.
    pub options: JobOptions,
    /// What happens to missed fires.
    pub misfire: MisfirePolicy,
    /// Whether a fire may start while the previous run is unfinished.
    pub overlap: OverlapPolicy,
    /// Fixed offset after each nominal instant at which it fires (see
    /// [`Schedule::offset_for`]); zero without jitter.
    pub jitter_offset: Duration,
    /// No fire before this instant (`start_at`).
    pub start_at: Option<DateTime<Utc>>,
    /// No fire after this instant (`end_at`).
    pub end_at: Option<DateTime<Utc>>,
    /// Whether its fires count down `remaining_runs` (claimed through the
    /// per-schedule decision, which decrements the stored counter with the
    /// winning claim).
    pub counted: bool,
    /// Pause after this many consecutive `failed`/`dead` runs.
    pub pause_after_failures: Option<u32>,
    /// A run not finished this long after its instant is reported late
    /// (`deadline`; the replicas' late-run pass reads it from the stored
    /// definition).
    pub deadline: Option<std::time::Duration>,
}

/// Most channels a schedule's `alerts` may name.
const MAX_ALERT_CHANNELS: usize = 20;

/// The checked `alerts` of a definition: channel names as the alerts file
/// writes them (whether each is configured is the alert deliverer's to
/// say: a schedule naming an unknown one gets failed deliveries that say
/// so).
fn alert_channels(alerts: Option<&[String]>) -> Result<(), String> {
    let Some(alerts) = alerts else {
        return Ok(());
    };
    if alerts.len() > MAX_ALERT_CHANNELS {
        return Err(format!(
            "{} channels named; at most {MAX_ALERT_CHANNELS}",
            alerts.len()
        ));
    }
    match alerts.iter().find(|a| {
        a.is_empty()
            || a.len() > 64
            || !a
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    }) {
        Some(bad) => Err(format!(
            "{bad:?} is not a channel name (1 to 64 letters, digits, '-', '_' or '.')"
        )),
        None => Ok(()),
    }
}

/// What happens to a fire while the schedule's previous run is unfinished
/// (Temporal's overlap policies; see `belfry_ledger`'s `overlap` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverlapPolicy {
    /// `allow_all` (alias `allow`): every fire runs at once (default).
    #[default]
    Allow,
    /// `skip` (alias `forbid`), `buffer_one`, `buffer_all`, `cancel_other`
    /// or `terminate_other`: decided per fire under the schedule's lock.
    Rule(OverlapRule),
}

impl OverlapPolicy {
    /// Today's `forbid`.
    pub const SKIP: OverlapPolicy = OverlapPolicy::Rule(OverlapRule::Skip);

    /// The rule to decide fires by; `None` for `allow_all`.
    pub fn rule(self) -> Option<OverlapRule> {
        match self {
            OverlapPolicy::Allow => None,
            OverlapPolicy::Rule(r) => Some(r),
        }
    }

    /// The policy a schedule's `overlap` names.
    ///
    /// # Errors
    ///
    /// What is allowed, for an unknown name.
    pub fn parse(name: Option<&str>) -> Result<Self, String> {
        Ok(match name {
            None | Some("allow" | "allow_all") => OverlapPolicy::Allow,
            Some("forbid" | "skip") => OverlapPolicy::SKIP,
            Some("buffer_one") => OverlapPolicy::Rule(OverlapRule::BufferOne),
            Some("buffer_all") => OverlapPolicy::Rule(OverlapRule::BufferAll),
            Some("cancel_other") => OverlapPolicy::Rule(OverlapRule::CancelOther),
            Some("terminate_other") => OverlapPolicy::Rule(OverlapRule::TerminateOther),
            Some(other) => {
                return Err(format!(
                    "unknown policy {other:?}; use \"allow_all\", \"skip\", \"buffer_one\", \
                     \"buffer_all\", \"cancel_other\" or \"terminate_other\" (\"allow\" and \
                     \"forbid\" are aliases of \"allow_all\" and \"skip\")"
                ))
            }
        })
    }
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
        Self::from_spec_cached(spec, &mut CronCache::default())
    }

    /// [`Schedule::from_spec`], sharing parsed cron expressions through
    /// `cache`: a million schedules on a handful of expressions hold a
    /// handful of parsed expressions.
    ///
    /// # Errors
    ///
    /// As [`Schedule::from_spec`].
    // Long on purpose: every field of the spec checked in order, each
    // refusal naming its field through the one `err`.
    pub fn from_spec_cached(
        spec: &ScheduleSpec,
        cache: &mut CronCache,
    ) -> Result<Self, ScheduleError> {
        let err = |field: &'static str, message: String| ScheduleError {
            schedule: spec.name.clone(),
            field,
            message,
        };
        validate_name("schedule name", &spec.name).map_err(|e| err("name", e.to_string()))?;
        validate_name("job type", &spec.job_type).map_err(|e| err("job_type", e.to_string()))?;
        let tz_name = spec.timezone.as_deref().unwrap_or("UTC");
        let kinds = [
            spec.cron.is_some(),
            spec.every.is_some(),
            spec.at.is_some(),
            spec.after.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            let field = match (spec.cron.is_some(), spec.every.is_some()) {
                (false, false) if spec.at.is_none() && spec.after.is_none() => "cron",
                (true, _) if spec.every.is_none() => "at",
                _ => "every",
            };
            return Err(err(
                field,
                "give exactly one of `cron` (e.g. \"0 0 3 * * *\"), `every` (e.g. \"30s\"), \
                 `at` (an RFC 3339 instant) or `after` (a delay such as \"10m\")"
                    .into(),
            ));
        }
        let kind = if let Some(expr) = &spec.cron {
            let tz: Tz = tz_name.parse().map_err(|_| {
                err(
                    "timezone",
                    format!(
                        "unknown time zone {tz_name:?}; use an IANA name such as \
                             \"UTC\", \"Europe/London\" or \"Asia/Shanghai\""
                    ),
                )
            })?;
            let (zoned, fresh) = cache.get_or_parse_fresh(expr, tz).map_err(|e| {
                err(
                    "cron",
                    format!(
                        "invalid cron expression {expr:?}: {e}; expected 6 fields \
                                 (sec min hour day-of-month month day-of-week) or 5 \
                                 (seconds = 0), e.g. \"0 */5 * * * *\""
                    ),
                )
            })?;
            // An expression that parses but never matches (30
            // February) would otherwise sit silently forever.
            if fresh && zoned.next_after(Utc::now()).is_none() {
                return Err(err(
                    "cron",
                    format!("cron expression {expr:?} never fires; check the day and month fields"),
                ));
            }
            ScheduleKind::Cron(zoned)
        } else if let Some(every) = &spec.every {
            if spec.timezone.is_some() {
                return Err(err(
                    "timezone",
                    "interval schedules live in absolute time; remove `timezone` or use `cron`"
                        .into(),
                ));
            }
            let anchor = match &spec.anchor {
                None => 0,
                Some(raw) => DateTime::parse_from_rfc3339(raw)
                    .map_err(|e| {
                        err("anchor", format!("{raw:?} is not an RFC 3339 instant ({e}); e.g. \"2026-01-01T00:00:00Z\""))
                    })?
                    .timestamp(),
            };
            ScheduleKind::Every {
                period: parse_period(every).map_err(|m| err("every", m))?,
                anchor,
            }
        } else {
            if spec.timezone.is_some() {
                return Err(err(
                    "timezone",
                    "one-shot schedules take an absolute instant; remove `timezone`".into(),
                ));
            }
            let at = match (&spec.at, &spec.after) {
                (Some(raw), _) => DateTime::parse_from_rfc3339(raw)
                    .map_err(|e| err("at", format!("{raw:?} is not an RFC 3339 instant ({e}); e.g. \"2026-07-26T03:00:00Z\"")))?
                    .with_timezone(&Utc),
                (None, Some(raw)) => {
                    let delay = humantime::parse_duration(raw.trim())
                        .map_err(|e| err("after", format!("invalid delay {raw:?}: {e}; expected e.g. \"10m\"")))?;
                    Duration::from_std(delay)
                        .ok()
                        .and_then(|d| Utc::now().checked_add_signed(d))
                        .ok_or_else(|| err("after", format!("{raw:?} is too long")))?
                }
                (None, None) => return Err(err("at", "give `at` or `after`".into())),
            };
            ScheduleKind::Once {
                at: at.trunc_subsecs(0),
            }
        };
        if spec.anchor.is_some() && !matches!(kind, ScheduleKind::Every { .. }) {
            return Err(err(
                "anchor",
                "`anchor` only applies to `every` schedules".into(),
            ));
        }
        let jitter_offset = match &spec.jitter {
            None => Duration::zero(),
            Some(raw) => {
                let max_ms = option_ms("jitter", raw, std::time::Duration::from_millis(1))
                    .map_err(|(field, message)| err(field, message))?;
                // FNV-1a of the name: stable across replicas, builds and
                // restarts (std's hasher is not guaranteed to be).
                let hash = spec.name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
                let mut offset =
                    Duration::milliseconds(i64::try_from(hash % max_ms.max(1)).unwrap_or(0));
                // Never as long as the interval: a fire must come
                // before the next one's nominal instant.
                if let ScheduleKind::Every { period, .. } = &kind {
                    offset = offset.min(*period - Duration::milliseconds(1));
                }
                offset
            }
        };
        alert_channels(spec.alerts.as_deref()).map_err(|message| err("alerts", message))?;
        Ok(Self {
            name: spec.name.clone(),
            job_type: spec.job_type.clone(),
            payload: spec.payload.clone().unwrap_or(serde_json::Value::Null),
            kind,
            options: job_options(spec).map_err(|(field, message)| err(field, message))?,
            misfire: misfire_policy(spec).map_err(|(field, message)| err(field, message))?,
            overlap: OverlapPolicy::parse(spec.overlap.as_deref())
                .map_err(|message| err("overlap", message))?,
            jitter_offset,
            start_at: bound(spec.start_at.as_deref()).map_err(|m| err("start_at", m))?,
            end_at: match bound(spec.end_at.as_deref()).map_err(|m| err("end_at", m))? {
                Some(end) if bound(spec.start_at.as_deref()).ok().flatten() >= Some(end) => {
                    return Err(err("end_at", "end_at must be after start_at".into()))
                }
                end => end,
            },
            counted: match spec.remaining_runs {
                None => false,
                Some(1..=1_000_000_000) => true,
                Some(n) => {
                    return Err(err(
                        "remaining_runs",
                        format!("remaining_runs {n} is not from 1 to 1,000,000,000"),
                    ))
                }
            },
            pause_after_failures: match spec.pause_after_failures {
                None => None,
                Some(n @ 1..=1000) => Some(n),
                Some(n) => {
                    return Err(err(
                        "pause_after_failures",
                        format!("pause_after_failures {n} is not from 1 to 1000"),
                    ))
                }
            },
            deadline: match &spec.deadline {
                None => None,
                Some(raw) => Some(std::time::Duration::from_millis(
                    option_ms("deadline", raw, std::time::Duration::from_secs(1))
                        .map_err(|(field, message)| err(field, message))?,
                )),
            },
        })
    }

    /// The first fire instant strictly after `after` inside the schedule's
    /// `start_at`/`end_at` window, or `None` when the schedule never fires
    /// again (past its `end_at`, or a cron expression for a date that does
    /// not come, such as 30 February).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Just before `start_at`: the first instant at or after it.
        let after = match self.start_at {
            Some(start) if after < start => start - Duration::nanoseconds(1),
            _ => after,
        };
        let next = self.next_unbounded(after)?;
        match self.end_at {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// [`Schedule::next_after`] without the window.
    fn next_unbounded(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Fire instants are whole seconds; start from the second `after` is
        // in, so "strictly after" means "from the next whole second".
        let after = after.trunc_subsecs(0);
        match &self.kind {
            ScheduleKind::Cron(cron) => cron.next_after(after),
            ScheduleKind::Every { period, anchor } => {
                let period_s = period.num_seconds();
                let since = after.timestamp().checked_sub(*anchor)?;
                let next = (since.div_euclid(period_s) + 1)
                    .checked_mul(period_s)?
                    .checked_add(*anchor)?;
                Utc.timestamp_opt(next, 0).single()
            }
            ScheduleKind::Once { at } => (*at > after).then_some(*at),
        }
    }

    /// When the fire of nominal instant `at` happens: `at` plus the jitter
    /// offset, kept before the next nominal instant.
    pub fn wake_at(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        if self.jitter_offset.is_zero() {
            return at;
        }
        let limit = self.next_after(at).map_or(self.jitter_offset, |next| {
            (next - at) - Duration::milliseconds(1)
        });
        at + self.jitter_offset.min(limit).max(Duration::zero())
    }

    /// The next `count` fire instants strictly after `from`.
    pub fn upcoming(&self, from: DateTime<Utc>, count: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(count);
        let mut t = from;
        while out.len() < count {
            match self.next_after(t) {
                Some(next) => {
                    out.push(next);
                    t = next;
                }
                None => break,
            }
        }
        out
    }

    /// Checks what only matters for a schedule that is being created: a
    /// one-shot instant must be in the future.
    ///
    /// # Errors
    ///
    /// [`ScheduleError`] naming `at` when the instant has passed.
    pub fn check_new(&self, now: DateTime<Utc>) -> Result<(), ScheduleError> {
        match self.kind {
            ScheduleKind::Once { at } if at <= now => Err(ScheduleError {
                schedule: self.name.clone(),
                field: "at",
                message: format!("{at} is in the past; a one-shot run needs a future instant"),
            }),
            _ => Ok(()),
        }
    }

    /// For a schedule that has never run, the instant recovery starts from:
    /// a one-shot's own instant (its fire is recovered if every replica was
    /// down then); `None` for repeating schedules, which start from their
    /// first definition.
    pub fn first_instant(&self) -> Option<DateTime<Utc>> {
        match self.kind {
            ScheduleKind::Once { at } => Some(at),
            _ => None,
        }
    }

    /// Validates `spec` and returns the row it is stored as, with an
    /// `after` delay turned into the instant `now + after` (stored as `at`,
    /// so every replica and every restart fires it at the same moment).
    /// With `is_new`, a one-shot instant must still be ahead of `now`.
    ///
    /// # Errors
    ///
    /// [`ScheduleError`] naming the field that is invalid.
    pub fn storable_row(
        spec: &ScheduleSpec,
        now: DateTime<Utc>,
        is_new: bool,
    ) -> Result<ScheduleRow, ScheduleError> {
        let schedule = Self::from_spec(spec)?;
        if is_new {
            schedule.check_new(now)?;
        }
        Ok(match (&spec.after, schedule.first_instant()) {
            (Some(_), Some(at)) => schedule.to_stored_row(&ScheduleSpec {
                after: None,
                at: Some(at.to_rfc3339()),
                ..spec.clone()
            }),
            _ => schedule.to_stored_row(spec),
        })
    }

    /// The row `spec` is stored as in `schedules` (validated).
    ///
    /// # Errors
    ///
    /// [`ScheduleError`] when `spec` is invalid.
    pub fn row_for(spec: &ScheduleSpec) -> Result<ScheduleRow, ScheduleError> {
        Ok(Self::from_spec(spec)?.to_stored_row(spec))
    }

    /// The row this schedule, built from `spec`, is stored as.
    pub fn to_stored_row(&self, spec: &ScheduleSpec) -> ScheduleRow {
        let mut row = self.to_row();
        row.spec = serde_json::to_value(spec).ok();
        row
    }

    /// The row this schedule is stored as in `schedules`, without its spec.
    pub fn to_row(&self) -> ScheduleRow {
        let (cron, every_ms, timezone) = match &self.kind {
            ScheduleKind::Cron(cron) => (
                Some(cron.expr().to_owned()),
                None,
                cron.tz().name().to_owned(),
            ),
            ScheduleKind::Every { period, .. } => {
                (None, Some(period.num_milliseconds()), "UTC".into())
            }
            ScheduleKind::Once { .. } => (None, None, "UTC".into()),
        };
        ScheduleRow {
            name: self.name.clone(),
            cron,
            every_ms,
            timezone,
            job_type: self.job_type.clone(),
            payload: self.payload.clone(),
            paused: false,
            options: serde_json::to_value(&self.options).unwrap_or_default(),
            spec: None,
            updated_at: None,
            remaining_runs: None,
            pause_note: None,
        }
    }
}

/// Longest accepted retry delay or timeout: one week.
const MAX_OPTION_DURATION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

fn option_ms(
    field: &'static str,
    raw: &str,
    min: std::time::Duration,
) -> Result<u64, (&'static str, String)> {
    let d = humantime::parse_duration(raw.trim()).map_err(|e| {
        (
            field,
            format!("invalid duration {raw:?}: {e}; expected e.g. \"500ms\", \"30s\", \"5m\""),
        )
    })?;
    if d < min || d > MAX_OPTION_DURATION {
        return Err((
            field,
            format!(
                "{raw:?} is out of range; allowed from {} to 7 days",
                humantime::format_duration(min)
            ),
        ));
    }
    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn misfire_policy(spec: &ScheduleSpec) -> Result<MisfirePolicy, (&'static str, String)> {
    let catch_up_only = |field: &'static str| {
        (
            field,
            format!("`{field}` only applies with misfire = \"catch_up\""),
        )
    };
    match spec.misfire.as_deref() {
        None | Some("fire_once") | Some("skip") => {
            if spec.catch_up_window.is_some() {
                return Err(catch_up_only("catch_up_window"));
            }
            if spec.catch_up_max.is_some() {
                return Err(catch_up_only("catch_up_max"));
            }
            Ok(if spec.misfire.as_deref() == Some("skip") {
                MisfirePolicy::Skip
            } else {
                MisfirePolicy::FireOnce
            })
        }
        Some("catch_up") => {
            let window = match &spec.catch_up_window {
                None => crate::misfire::DEFAULT_CATCH_UP_WINDOW,
                Some(w) => std::time::Duration::from_millis(option_ms(
                    "catch_up_window",
                    w,
                    std::time::Duration::from_secs(1),
                )?),
            };
            let max = match spec.catch_up_max {
                None => crate::misfire::DEFAULT_CATCH_UP_MAX,
                Some(n) if (1..=10_000).contains(&n) => {
                    usize::try_from(n).unwrap_or(crate::misfire::DEFAULT_CATCH_UP_MAX)
                }
                Some(n) => {
                    return Err((
                        "catch_up_max",
                        format!("{n} is out of range; allowed 1 to 10000"),
                    ))
                }
            };
            Ok(MisfirePolicy::CatchUp { window, max })
        }
        Some(other) => Err((
            "misfire",
            format!("unknown policy {other:?}; use \"skip\", \"fire_once\" or \"catch_up\""),
        )),
    }
}

fn job_options(spec: &ScheduleSpec) -> Result<JobOptions, (&'static str, String)> {
    job_options_of(&RunOptionsSpec {
        retry: spec.retry.as_ref(),
        timeout: spec.timeout.as_deref(),
        concurrency: spec.concurrency,
        concurrency_key: spec.concurrency_key.as_deref(),
        rate_limit: spec.rate_limit.as_deref(),
        rate_limit_key: spec.rate_limit_key.as_deref(),
        priority: spec.priority.as_deref(),
        job_name: &spec.name,
        on_success: spec.on_success.as_deref().unwrap_or_default(),
        on_failure: spec.on_failure.as_deref().unwrap_or_default(),
        on_finish: spec.on_finish.as_deref().unwrap_or_default(),
    })
}

/// A run's options as written in a schedule or an ad-hoc job request,
/// not yet checked.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptionsSpec<'a> {
    /// Overrides of the job type's retry policy.
    pub retry: Option<&'a belfry_protocol::RetrySpec>,
    /// Per-attempt timeout, e.g. `"10m"`.
    pub timeout: Option<&'a str>,
    /// The cluster-wide concurrency limit.
    pub concurrency: Option<u32>,
    /// What the limit counts by (a payload template).
    pub concurrency_key: Option<&'a str>,
    /// The cluster-wide rate limit, e.g. `"50/s"`.
    pub rate_limit: Option<&'a str>,
    /// What the rate limit counts by (a payload template).
    pub rate_limit_key: Option<&'a str>,
    /// `"high"`, `"normal"` or `"low"`.
    pub priority: Option<&'a str>,
    /// The job name of the runs (a follow-up may not take it).
    pub job_name: &'a str,
    /// Follow-ups enqueued when a run succeeds.
    pub on_success: &'a [FollowUpSpec],
    /// Follow-ups enqueued when a run ends `failed` or `dead`.
    pub on_failure: &'a [FollowUpSpec],
    /// Follow-ups enqueued whatever a run's end.
    pub on_finish: &'a [FollowUpSpec],
}

/// The largest `concurrency` accepted.
pub const MAX_CONCURRENCY: u32 = 100_000;
/// The longest `concurrency_key` or `rate_limit_key` template accepted, in
/// bytes.
pub const MAX_CONCURRENCY_KEY: usize = 256;

/// Validates a run's options as written in a schedule (or an ad-hoc job
/// request) and returns them as the run carries them.
///
/// # Errors
///
/// `(field, message)`: the offending field (`timeout`, `retry.max_attempts`,
/// `concurrency`, `rate_limit`, ...) and what is allowed.
pub fn job_options_of(spec: &RunOptionsSpec<'_>) -> Result<JobOptions, (&'static str, String)> {
    let RunOptionsSpec {
        retry,
        timeout,
        concurrency,
        concurrency_key,
        rate_limit,
        rate_limit_key,
        priority,
        job_name,
        on_success,
        on_failure,
        on_finish,
    } = *spec;
    let follow_ups = FollowUps {
        on_success: follow_ups_of("on_success", on_success)?,
        on_failure: follow_ups_of("on_failure", on_failure)?,
        on_finish: follow_ups_of("on_finish", on_finish)?,
    };
    follow_ups
        .validate(job_name)
        .map_err(|e| (e.list(), e.to_string()))?;
    let priority = priority
        .map(|p| {
            p.parse::<belfry_protocol::Priority>()
                .map_err(|m| ("priority", m))
        })
        .transpose()?;
    if let Some(n) = concurrency.filter(|n| !(1..=MAX_CONCURRENCY).contains(n)) {
        return Err((
            "concurrency",
            format!(
                "{n} is out of range; allowed 1 to {MAX_CONCURRENCY} (leave it out for no limit)"
            ),
        ));
    }
    if let Some(key) = concurrency_key {
        check_limit_key(key).map_err(|m| ("concurrency_key", m))?;
    }
    let rate_limit = rate_limit
        .map(|r| {
            r.parse::<belfry_protocol::RateLimit>()
                .map_err(|e| ("rate_limit", e.to_string()))
        })
        .transpose()?;
    if let Some(key) = rate_limit_key {
        check_limit_key(key).map_err(|m| ("rate_limit_key", m))?;
    }
    let timeout_ms = timeout
        .map(|t| option_ms("timeout", t, std::time::Duration::from_millis(1)))
        .transpose()?;
    let retry = match retry {
        None => None,
        Some(r) => {
            if let Some(n) = r.max_attempts.filter(|n| !(1..=1000).contains(n)) {
                return Err((
                    "retry.max_attempts",
                    format!("{n} is out of range; allowed 1 to 1000"),
                ));
            }
            if let Some(m) = r.multiplier.filter(|m| !(1.0..=100.0).contains(m)) {
                return Err((
                    "retry.multiplier",
                    format!("{m} is out of range; allowed 1 to 100"),
                ));
            }
            Some(RetryOverride {
                max_attempts: r.max_attempts,
                initial_delay_ms: r
                    .initial_delay
                    .as_deref()
                    .map(|d| option_ms("retry.initial_delay", d, std::time::Duration::ZERO))
                    .transpose()?,
                multiplier: r.multiplier,
                max_delay_ms: r
                    .max_delay
                    .as_deref()
                    .map(|d| option_ms("retry.max_delay", d, std::time::Duration::ZERO))
                    .transpose()?,
                jitter: r.jitter,
            })
        }
    };
    Ok(JobOptions {
        retry,
        timeout_ms,
        concurrency,
        concurrency_key: concurrency_key.map(str::to_owned),
        rate_limit,
        rate_limit_key: rate_limit_key.map(str::to_owned),
        priority,
        follow_ups,
        parents: Vec::new(),
    })
}

/// The follow-ups of one list as a run carries them: each child's options
/// checked as a schedule's (the error names the entry).
fn follow_ups_of(
    list: &'static str,
    specs: &[FollowUpSpec],
) -> Result<Vec<FollowUp>, (&'static str, String)> {
    specs
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let options = job_options_of(&RunOptionsSpec {
                retry: f.retry.as_ref(),
                timeout: f.timeout.as_deref(),
                priority: f.priority.as_deref(),
                job_name: &f.name,
                on_success: &f.on_success,
                on_failure: &f.on_failure,
                on_finish: &f.on_finish,
                ..RunOptionsSpec::default()
            })
            .map_err(|(field, message)| {
                (
                    list,
                    format!("follow-up {i} ({:?}): {field}: {message}", f.name),
                )
            })?;
            Ok(FollowUp {
                job_name: f.name.clone(),
                job_type: f.job_type.clone(),
                payload: f.payload.clone().unwrap_or(serde_json::Value::Null),
                after: f.after.clone(),
                options,
            })
        })
        .collect()
}

/// Whether `key` reads as a limit key template: not blank, at most
/// [`MAX_CONCURRENCY_KEY`] bytes, every `{payload.` closed by a `}` and
/// naming a field.
fn check_limit_key(key: &str) -> Result<(), String> {
    if key.trim().is_empty() {
        return Err(
            "is empty; give a template such as \"{payload.tenant}\", or leave it out to limit the job type as a whole"
                .into(),
        );
    }
    if key.len() > MAX_CONCURRENCY_KEY {
        return Err(format!(
            "is {} bytes long; at most {MAX_CONCURRENCY_KEY}",
            key.len()
        ));
    }
    let mut rest = key;
    while let Some(open) = rest.find("{payload.") {
        let after = &rest[open + "{payload.".len()..];
        let Some(close) = after.find('}') else {
            return Err(format!(
                "{key:?} opens \"{{payload.\" without a closing \"}}\"; e.g. \"{{payload.tenant}}\""
            ));
        };
        let path = &after[..close];
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(format!(
                "{key:?} names no payload field in \"{{payload.{path}}}\"; e.g. \"{{payload.tenant}}\""
            ));
        }
        rest = &after[close + 1..];
    }
    Ok(())
}

/// A `start_at`/`end_at` bound: an RFC 3339 instant, or none.
fn bound(raw: Option<&str>) -> Result<Option<DateTime<Utc>>, String> {
    raw.map(|raw| {
        DateTime::parse_from_rfc3339(raw)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                format!("{raw:?} is not an RFC 3339 instant ({e}); e.g. \"2026-07-26T03:00:00Z\"")
            })
    })
    .transpose()
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

/// A schedule named `name` firing every second (the replica's unit tests).
#[cfg(test)]
pub(crate) fn every_second(name: &str) -> std::sync::Arc<Schedule> {
    let spec = ScheduleSpec {
        name: name.into(),
        every: Some("1s".into()),
        job_type: "noop".into(),
        ..Default::default()
    };
    std::sync::Arc::new(Schedule::from_spec(&spec).unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that the next fire of `s` strictly after `from` is `next`.
    #[track_caller]
    fn assert_next(s: &Schedule, from: &str, next: &str) {
        assert_eq!(s.next_after(at(from)), Some(at(next)), "after {from}");
    }

    fn spec(cron: Option<&str>, every: Option<&str>, tz: Option<&str>) -> ScheduleSpec {
        ScheduleSpec {
            name: "s".into(),
            cron: cron.map(Into::into),
            every: every.map(Into::into),
            timezone: tz.map(Into::into),
            job_type: "noop".into(),
            ..Default::default()
        }
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn six_and_five_field_cron() {
        let s = Schedule::from_spec(&spec(Some("*/2 * * * * *"), None, None)).unwrap();
        assert_next(&s, "2026-07-26T03:00:00.700Z", "2026-07-26T03:00:02Z");
        let s = Schedule::from_spec(&spec(Some("0 3 * * *"), None, None)).unwrap();
        assert_next(&s, "2026-07-26T03:00:00Z", "2026-07-27T03:00:00Z");
    }

    #[test]
    fn cron_in_a_time_zone() {
        let s =
            Schedule::from_spec(&spec(Some("0 0 3 * * *"), None, Some("Asia/Shanghai"))).unwrap();
        assert_next(&s, "2026-07-26T00:00:00Z", "2026-07-26T19:00:00Z");
    }

    #[test]
    fn cron_syntax_beyond_numbers() {
        // Macros, names, L, W, #, ? as the cron engine has them.
        let cases = [
            ("@daily", "2026-07-26T10:00:00Z", "2026-07-27T00:00:00Z"),
            (
                "0 0 12 * JAN-DEC MON",
                "2026-07-26T10:00:00Z",
                "2026-07-27T12:00:00Z",
            ),
            (
                "0 0 0 L * *",
                "2026-07-26T10:00:00Z",
                "2026-07-31T00:00:00Z",
            ),
            (
                "0 0 0 15W * ?",
                "2026-08-01T00:00:00Z",
                "2026-08-14T00:00:00Z",
            ),
            (
                "0 0 9 * * FRI#2",
                "2026-07-26T10:00:00Z",
                "2026-08-14T09:00:00Z",
            ),
        ];
        for (expr, from, next) in cases {
            let s = Schedule::from_spec(&spec(Some(expr), None, None)).unwrap();
            assert_eq!(s.next_after(at(from)), Some(at(next)), "{expr}");
        }
    }

    #[test]
    fn policies_and_jitter_are_read_and_checked() {
        let mut s = spec(None, Some("1m"), None);
        s.misfire = Some("catch_up".into());
        s.catch_up_window = Some("30m".into());
        s.catch_up_max = Some(5);
        s.overlap = Some("forbid".into());
        s.jitter = Some("10s".into());
        let sc = Schedule::from_spec(&s).unwrap();
        assert_eq!(
            sc.misfire,
            MisfirePolicy::CatchUp {
                window: std::time::Duration::from_secs(1800),
                max: 5
            }
        );
        assert_eq!(sc.overlap, OverlapPolicy::SKIP);
        assert!(sc.jitter_offset < Duration::seconds(10));
        // Deterministic: the same name gives the same offset.
        assert_eq!(
            Schedule::from_spec(&s).unwrap().jitter_offset,
            sc.jitter_offset
        );
        let t = at("2026-07-26T03:00:00Z");
        assert_eq!(sc.wake_at(t), t + sc.jitter_offset);
        // Never past the next fire.
        let mut tight = spec(None, Some("2s"), None);
        tight.jitter = Some("1h".into());
        let tight = Schedule::from_spec(&tight).unwrap();
        assert!(tight.wake_at(t) < t + Duration::seconds(2));
        for (field, value, expected) in [
            ("misfire", "sometimes", "misfire"),
            ("overlap", "maybe", "overlap"),
            ("jitter", "soon", "jitter"),
        ] {
            let mut b = spec(None, Some("1m"), None);
            match field {
                "misfire" => b.misfire = Some(value.into()),
                "overlap" => b.overlap = Some(value.into()),
                _ => b.jitter = Some(value.into()),
            }
            assert_eq!(Schedule::from_spec(&b).unwrap_err().field, expected);
        }
        let mut b = spec(None, Some("1m"), None);
        b.catch_up_max = Some(3);
        assert_eq!(Schedule::from_spec(&b).unwrap_err().field, "catch_up_max");
    }

    #[test]
    fn upcoming_lists_the_next_instants() {
        let s =
            Schedule::from_spec(&spec(Some("0 0 3 * * *"), None, Some("Asia/Shanghai"))).unwrap();
        assert_eq!(
            s.upcoming(at("2026-07-26T00:00:00Z"), 2),
            [at("2026-07-26T19:00:00Z"), at("2026-07-27T19:00:00Z")]
        );
    }

    #[test]
    fn intervals_are_epoch_anchored() {
        let s = Schedule::from_spec(&spec(None, Some("30s"), None)).unwrap();
        assert_next(&s, "2026-07-26T03:00:10.5Z", "2026-07-26T03:00:30Z");
        assert_next(&s, "2026-07-26T03:00:30Z", "2026-07-26T03:01:00Z");
    }

    #[test]
    fn retry_and_timeout_overrides_become_job_options() {
        let mut s = spec(None, Some("1s"), None);
        s.retry = Some(belfry_protocol::RetrySpec {
            max_attempts: Some(3),
            initial_delay: Some("2s".into()),
            ..Default::default()
        });
        s.timeout = Some("10m".into());
        let o = Schedule::from_spec(&s).unwrap().options;
        assert_eq!(o.timeout_ms, Some(600_000));
        let r = o.retry.unwrap();
        assert_eq!(
            (r.max_attempts, r.initial_delay_ms, r.multiplier),
            (Some(3), Some(2000), None)
        );
    }

    #[test]
    fn a_concurrency_limit_becomes_job_options_and_bad_ones_are_refused_by_field() {
        let mut s = spec(None, Some("1s"), None);
        s.concurrency = Some(4);
        s.concurrency_key = Some("{payload.region}/{payload.tenant}".into());
        let o = Schedule::from_spec(&s).unwrap().options;
        assert_eq!(o.concurrency, Some(4));
        assert_eq!(
            o.concurrency_key.as_deref(),
            Some("{payload.region}/{payload.tenant}")
        );
        // A key alone counts the job type's registered limit per key.
        s.concurrency = None;
        s.concurrency_key = Some("{payload.tenant}".into());
        assert_eq!(Schedule::from_spec(&s).unwrap().options.concurrency, None);
        let refused = [
            (Some(0), None, "concurrency", "allowed 1 to 100000"),
            (Some(100_001), None, "concurrency", "allowed 1 to 100000"),
            (Some(2), Some(" "), "concurrency_key", "is empty"),
            (
                Some(2),
                Some("{payload.tenant"),
                "concurrency_key",
                "without a closing",
            ),
            (
                Some(2),
                Some("{payload.}"),
                "concurrency_key",
                "names no payload field",
            ),
            (
                Some(2),
                Some("{payload.a..b}"),
                "concurrency_key",
                "names no payload field",
            ),
        ];
        for (concurrency, key, field, says) in refused {
            s.concurrency = concurrency;
            s.concurrency_key = key.map(str::to_owned);
            let e = Schedule::from_spec(&s).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
        s.concurrency_key = Some("k".repeat(257));
        assert!(Schedule::from_spec(&s)
            .unwrap_err()
            .to_string()
            .contains("at most 256"));
    }

    #[test]
    fn a_rate_limit_becomes_job_options_and_bad_ones_are_refused_by_field() {
        let mut s = spec(None, Some("1s"), None);
        s.rate_limit = Some("10/1m".into());
        s.rate_limit_key = Some("{payload.partner}".into());
        let o = Schedule::from_spec(&s).unwrap().options;
        assert_eq!(
            o.rate_limit,
            Some(belfry_protocol::RateLimit {
                starts: 10,
                per_ms: 60_000
            })
        );
        assert_eq!(o.rate_limit_key.as_deref(), Some("{payload.partner}"));
        for (rate, key, field, says) in [
            (Some("10"), None, "rate_limit", "has no \"/\""),
            (Some("0/s"), None, "rate_limit", "allowed 1 to 10000"),
            (Some("5/100ms"), None, "rate_limit", "allowed 1s to 1 day"),
            (Some("5/s"), Some(""), "rate_limit_key", "is empty"),
            (
                Some("5/s"),
                Some("{payload.x"),
                "rate_limit_key",
                "without a closing",
            ),
        ] {
            s.rate_limit = rate.map(str::to_owned);
            s.rate_limit_key = key.map(str::to_owned);
            let e = Schedule::from_spec(&s).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn follow_ups_from_a_schedule_file_become_job_options_and_bad_ones_are_refused() {
        let text = r#"
            [[schedule]]
            name = "extract"
            every = "1h"
            job_type = "noop"

            [[schedule.on_success]]
            name = "load"
            job_type = "load"
            payload = { table = "orders" }
            after = ["extract-b"]
            timeout = "10m"
            priority = "high"

            [[schedule.on_success.on_failure]]
            name = "page-oncall"
            job_type = "mail"

            [[schedule.on_failure]]
            name = "page-oncall"
            job_type = "mail"
        "#;
        let specs = crate::schedule_file::parse(std::path::Path::new("t.toml"), text).unwrap();
        let o = Schedule::from_spec(&specs[0]).unwrap().options;
        let load = &o.follow_ups.on_success[0];
        assert_eq!(
            (load.job_name.as_str(), load.job_type.as_str()),
            ("load", "load")
        );
        assert_eq!(load.payload, serde_json::json!({"table": "orders"}));
        assert_eq!(load.after, ["extract-b"]);
        assert_eq!(load.options.timeout_ms, Some(600_000));
        assert_eq!(load.options.priority, Some(belfry_protocol::Priority::High));
        assert_eq!(
            load.options.follow_ups.on_failure[0].job_name,
            "page-oncall"
        );
        assert_eq!(o.follow_ups.on_failure[0].job_type, "mail");
        // A child named as its parent, a bad child timeout, a bad name.
        let mut s = specs[0].clone();
        let lists = s.on_success.clone().unwrap();
        let mut bad = lists.clone();
        bad[0].name = "extract".into();
        s.on_success = Some(bad);
        let e = Schedule::from_spec(&s).unwrap_err();
        assert_eq!(e.field, "on_success", "{e}");
        assert!(e.to_string().contains("parent's own name"), "{e}");
        let mut bad = lists.clone();
        bad[0].timeout = Some("soon".into());
        s.on_success = Some(bad);
        let e = Schedule::from_spec(&s).unwrap_err();
        assert_eq!(e.field, "on_success", "{e}");
        assert!(e.to_string().contains("timeout"), "{e}");
        s.on_success = Some(lists);
        s.on_finish = Some(vec![belfry_protocol::FollowUpSpec {
            name: "bad name".into(),
            job_type: "noop".into(),
            ..Default::default()
        }]);
        let e = Schedule::from_spec(&s).unwrap_err();
        assert_eq!(e.field, "on_finish", "{e}");
    }

    #[test]
    fn a_priority_becomes_job_options_and_an_unknown_one_is_refused() {
        let mut s = spec(None, Some("1s"), None);
        s.priority = Some("high".into());
        let o = Schedule::from_spec(&s).unwrap().options;
        assert_eq!(o.priority, Some(belfry_protocol::Priority::High));
        s.priority = None;
        assert_eq!(Schedule::from_spec(&s).unwrap().options.priority, None);
        s.priority = Some("urgent".into());
        let e = Schedule::from_spec(&s).unwrap_err();
        assert_eq!(e.field, "priority", "{e}");
        assert!(
            e.to_string().contains("\"high\", \"normal\" or \"low\""),
            "{e}"
        );
    }

    #[test]
    fn anchored_intervals_and_one_shots() {
        let mut s = spec(None, Some("90s"), None);
        s.anchor = Some("2026-07-26T03:00:10Z".into());
        let sc = Schedule::from_spec(&s).unwrap();
        assert_next(&sc, "2026-07-26T03:00:00Z", "2026-07-26T03:00:10Z");
        assert_next(&sc, "2026-07-26T03:00:10Z", "2026-07-26T03:01:40Z");
        let once = ScheduleSpec {
            name: "once".into(),
            at: Some("2026-07-26T03:00:00Z".into()),
            job_type: "noop".into(),
            ..Default::default()
        };
        let o = Schedule::from_spec(&once).unwrap();
        assert_next(&o, "2026-07-26T02:00:00Z", "2026-07-26T03:00:00Z");
        assert_eq!(o.next_after(at("2026-07-26T03:00:00Z")), None);
        assert_eq!(
            o.check_new(at("2026-07-26T04:00:00Z")).unwrap_err().field,
            "at"
        );
        assert!(o.check_new(at("2026-07-26T02:00:00Z")).is_ok());
        let later = ScheduleSpec {
            at: None,
            after: Some("10m".into()),
            ..once.clone()
        };
        let l = Schedule::from_spec(&later).unwrap();
        assert!(l.first_instant().unwrap() > Utc::now() + Duration::minutes(9));
        let both = ScheduleSpec {
            cron: Some("* * * * * *".into()),
            ..once.clone()
        };
        assert!(Schedule::from_spec(&both).is_err());
        let bad = ScheduleSpec {
            at: Some("tomorrow".into()),
            ..once
        };
        assert_eq!(Schedule::from_spec(&bad).unwrap_err().field, "at");
        let mut anchored_cron = spec(Some("* * * * * *"), None, None);
        anchored_cron.anchor = Some("2026-07-26T03:00:10Z".into());
        assert_eq!(
            Schedule::from_spec(&anchored_cron).unwrap_err().field,
            "anchor"
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
            (spec(Some("0 0 0 30 2 *"), None, None), "cron"),
        ];
        for (s, field) in cases {
            let e = Schedule::from_spec(&s).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().starts_with("schedule \"s\": field"), "{e}");
        }
        let mut bad_retry = spec(None, Some("1s"), None);
        bad_retry.retry = Some(belfry_protocol::RetrySpec {
            max_attempts: Some(0),
            ..Default::default()
        });
        assert_eq!(
            Schedule::from_spec(&bad_retry).unwrap_err().field,
            "retry.max_attempts"
        );
        bad_retry.retry = Some(belfry_protocol::RetrySpec {
            initial_delay: Some("soon".into()),
            ..Default::default()
        });
        assert_eq!(
            Schedule::from_spec(&bad_retry).unwrap_err().field,
            "retry.initial_delay"
        );
        let mut bad_timeout = spec(None, Some("1s"), None);
        bad_timeout.timeout = Some("0s".into());
        assert_eq!(
            Schedule::from_spec(&bad_timeout).unwrap_err().field,
            "timeout"
        );
        let mut bad_name = spec(None, Some("1s"), None);
        bad_name.name = "has space".into();
        assert_eq!(Schedule::from_spec(&bad_name).unwrap_err().field, "name");
    }
}
