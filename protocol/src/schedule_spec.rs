//! The definition of one schedule, as written in a schedule file's
//! `[[schedule]]` table (and, in a later issue, as JSON over the API).
//!
//! ```toml
//! [[schedule]]
//! name = "nightly-report"
//! cron = "0 0 3 * * *"          # 6 fields, with seconds; or `every = "30s"`
//! timezone = "Asia/Shanghai"    # IANA name; default UTC
//! job_type = "http"
//! payload = { url = "http://127.0.0.1:9000/report" }
//! retry = { max_attempts = 3, initial_delay = "30s" }   # optional
//! timeout = "10m"                                       # optional
//! concurrency = 2                                       # optional: at most 2 running at once
//! rate_limit = "10/1m"                                  # optional: at most 10 starts a minute
//! priority = "high"                                     # optional: "high", "normal" (default) or "low"
//!
//! [[schedule.on_success]]                               # optional: follow-up runs (also on_failure, on_finish)
//! name = "nightly-report-mail"
//! job_type = "mail"
//! ```
//!
//! This type only carries the fields; the scheduler validates them (cron
//! syntax, time zone, interval) and reports errors naming the schedule and
//! the field.

use serde::{Deserialize, Serialize};

/// One schedule definition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Unique name; also the job name of its runs and the prefix of their
    /// run keys.
    pub name: String,
    /// A cron expression: 6 fields with seconds, or 5 fields (seconds = 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// A fixed interval such as `"30s"`, `"5m"` or `"1h 30m"`, in whole
    /// seconds, anchored at the Unix epoch so every replica computes the same
    /// instants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// With `every`: the instant the intervals count from (RFC 3339);
    /// default the Unix epoch. Every replica and every restart computes the
    /// same instants from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<String>,
    /// A one-shot run at this instant (RFC 3339), instead of `cron`/`every`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// A one-shot run this long after the schedule is first stored
    /// (`"10m"`); stored as the resulting instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// IANA time zone the cron expression is read in; default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The job type its runs are routed by and handled as.
    pub job_type: String,
    /// The payload of its runs; any value (an inline table in TOML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// Overrides of the job type's retry policy for this schedule's runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// Per-attempt timeout for this schedule's runs, e.g. `"10m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// At most this many of these runs (of its job type, or per
    /// `concurrency_key`) run at once across every worker of every host
    /// (1 to 100000); overrides the limit the job type was registered
    /// with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// What the concurrency limit counts by: a template over the payload,
    /// e.g. `"{payload.tenant}"` (one limit per tenant); absent, the job
    /// type as a whole. With no `concurrency` here it applies the job
    /// type's registered limit per key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// At most this many of these runs (of its job type, or per
    /// `rate_limit_key`) start in any window, across every worker of every
    /// host: `"50/s"`, `"10/1m"`, `"3/10s"`; overrides the job type's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// What the rate limit counts by: a template over the payload, e.g.
    /// `"{payload.partner}"`; absent, the job type as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_key: Option<String>,
    /// The priority of its runs: `"high"`, `"normal"` (default) or
    /// `"low"`; a worker takes ready runs of a higher level first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// What to do with fires that were missed (every replica down, the
    /// ledger unreachable): `"skip"`, `"fire_once"` (default) or `"catch_up"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub misfire: Option<String>,
    /// With `misfire = "catch_up"`: how far back missed fires are caught up;
    /// default `"1h"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_window: Option<String>,
    /// With `misfire = "catch_up"`: at most this many missed fires (the
    /// latest); default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_max: Option<u32>,
    /// What happens to a fire while the previous run of the schedule is
    /// unfinished: `"allow_all"` (default), `"skip"`, `"buffer_one"`,
    /// `"buffer_all"`, `"cancel_other"` or `"terminate_other"`
    /// (`"allow"` and `"forbid"` are aliases of the first two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
    /// No fire before this instant (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    /// No fire after this instant (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    /// Fire at most this many more times (fires of the timetable; manual
    /// triggers and backfills do not count), then pause with a note. The
    /// stored counter restarts from this value whenever it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_runs: Option<u64>,
    /// Pause the schedule (with a note) after this many consecutive runs
    /// ended `failed` or `dead`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_after_failures: Option<u32>,
    /// Spread fires of this schedule over up to this long after their
    /// nominal instant (e.g. `"30s"`), by an offset derived from the name:
    /// the same on every replica, never past the next fire. The run key
    /// keeps the nominal instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    /// A run not finished this long after its scheduled instant (e.g.
    /// `"15m"`) raises a `run.late` alert, once per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// Alert channels (names of `BELFRY_ALERTS` channels) that get every
    /// alert of this schedule, beside the file's routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alerts: Option<Vec<String>>,
    /// Runs to enqueue when a run of this schedule succeeds (see
    /// [`crate::follow_up`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_success: Option<Vec<crate::FollowUpSpec>>,
    /// Runs to enqueue when a run of this schedule ends `failed` or `dead`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<Vec<crate::FollowUpSpec>>,
    /// Runs to enqueue whatever a run of this schedule's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_finish: Option<Vec<crate::FollowUpSpec>>,
}

/// A schedule's retry override as written in the file: durations as
/// strings (`"2s"`), every field optional.
///
/// ```toml
/// retry = { max_attempts = 3, initial_delay = "2s", multiplier = 2.0, max_delay = "1m", jitter = false }
/// ```
///
/// With the `openapi` feature it is also the `Retry` schema of the REST
/// API's documents.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = Retry))]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in total, the first included (1 to 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub max_attempts: Option<u32>,
    /// Delay after the first failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay: Option<String>,
    /// Growth factor per failed attempt (1 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub multiplier: Option<f32>,
    /// Cap of one delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay: Option<String>,
    /// Whether delays are randomly stretched by up to 100 %.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<bool>,
}
