//! `/v1/schedules`: a schedule as it is sent and shown, and the answers of
//! its actions (trigger, backfill, preview).
//!
//! A schedule's JSON is its `[[schedule]]` table of the schedule file
//! ([`ScheduleSpec`]) plus two read-only fields, `paused` and `updated_at`.
//! The definition fields are listed once, in `schedule_types!` below, and
//! from there become [`ScheduleInput`], [`Schedule`] and the conversions
//! to and from [`ScheduleSpec`]; a field added to the spec fails to
//! compile here until the API carries it too.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{IntoParams, PartialSchema, ToSchema};
use uuid::Uuid;

use belfry_protocol::{RetrySpec, ScheduleSpec};

use crate::runs::RunStatus;
use crate::{Page, NAME_PATTERN};

/// The schema of a name (schedule, job type, ad-hoc job): a string of
/// [`NAME_PATTERN`]. Only a schema; names are `String`s.
pub struct Name;

impl PartialSchema for Name {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(NAME_PATTERN))
            .description(Some("1 to 100 characters from A-Z a-z 0-9 . _ -"))
            .into()
    }
}

impl ToSchema for Name {}

wire_enum! {
    /// What happens to fires that were missed (every replica down, the
    /// ledger unreachable).
    pub enum Misfire {
        /// Drop them.
        Skip = "skip",
        /// Run the latest one once (the default).
        FireOnce = "fire_once",
        /// Run each, within `catch_up_window` and `catch_up_max`.
        CatchUp = "catch_up",
    }
}

wire_enum! {
    /// What happens to a fire while the schedule's previous run is
    /// unfinished (Temporal's overlap policies).
    pub enum Overlap {
        /// It starts at once (the default).
        AllowAll = "allow_all",
        /// It is skipped (recorded in `skipped_fires`).
        Skip = "skip",
        /// It waits (`buffered`) and starts when the previous run ends; at
        /// most one fire waits, later ones are skipped.
        BufferOne = "buffer_one",
        /// Every fire waits, and they start in order.
        BufferAll = "buffer_all",
        /// The previous run is cancelled (with the grace period); the fire
        /// starts when it has ended.
        CancelOther = "cancel_other",
        /// The previous run is cancelled without grace; the fire starts at
        /// once.
        TerminateOther = "terminate_other",
        /// Alias of `allow_all`.
        Allow = "allow",
        /// Alias of `skip`.
        Forbid = "forbid",
    }
}

/// Declares [`ScheduleInput`] and [`Schedule`] with the optional definition
/// fields of [`ScheduleSpec`] (all but `name` and `job_type`), and the
/// conversions between them, from one list.
macro_rules! schedule_types {
    ($( $(#[$meta:meta])* $field:ident: $ty:ty, )+) => {
        /// A schedule definition as a request body (`POST /v1/schedules`,
        /// `PUT /v1/schedules/{name}`): a `[[schedule]]` table of the
        /// schedule file as JSON, with exactly one of `cron`, `every`, `at`,
        /// `after`. `updated_at` and `invalid` are accepted and ignored, so
        /// a fetched schedule can be sent back as it is.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
        #[serde(deny_unknown_fields)]
        #[schema(example = json!({
            "name": "nightly-report", "cron": "0 0 3 * * *", "timezone": "Asia/Shanghai",
            "job_type": "noop", "payload": {"report": "daily"}
        }))]
        pub struct ScheduleInput {
            /// Unique name, also the job name of its runs. Required when
            /// creating; when replacing, optional but equal to the path's.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(value_type = Option<Name>)]
            pub name: Option<String>,
            /// The job type its runs are routed by and handled as.
            #[schema(value_type = Name)]
            pub job_type: String,
            $(
                $(#[$meta])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $field: Option<$ty>,
            )+
            /// Sets the paused state; left out: unchanged (a new schedule:
            /// not paused).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub paused: Option<bool>,
            /// Ignored (read-only).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub updated_at: Option<serde_json::Value>,
            /// Ignored (read-only).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub invalid: Option<serde_json::Value>,
            /// Ignored (read-only).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub runs_left: Option<serde_json::Value>,
            /// Sets the pause note with `paused`; otherwise ignored.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub pause_note: Option<serde_json::Value>,
        }

        /// A schedule as the API shows it: its definition, whether it is
        /// paused and when it last changed. A stored definition that does
        /// not read (edited by hand) shows only `name` and `invalid`.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
        pub struct Schedule {
            /// Unique name, also the job name of its runs.
            #[schema(value_type = Name)]
            pub name: String,
            /// The job type of its runs (left out only with `invalid`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(value_type = Option<Name>)]
            pub job_type: Option<String>,
            $(
                $(#[$meta])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $field: Option<$ty>,
            )+
            /// Whether firing is paused.
            pub paused: bool,
            /// When the definition or state last changed.
            #[serde(default)]
            #[schema(read_only)]
            pub updated_at: Option<DateTime<Utc>>,
            /// Why a hand-edited stored definition does not fire.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(read_only)]
            pub invalid: Option<String>,
            /// With `remaining_runs`: fires left (0: it ran out and was
            /// paused).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(read_only)]
            pub runs_left: Option<i64>,
            /// Why it is paused: an operator's note, or why belfry paused
            /// it (ran out of `remaining_runs`, `pause_after_failures`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(read_only)]
            pub pause_note: Option<String>,
        }

        impl ScheduleInput {
            /// The definition, named `name` (the body's or the path's).
            pub fn into_spec(self, name: String) -> ScheduleSpec {
                ScheduleSpec {
                    name,
                    job_type: self.job_type,
                    $( $field: self.$field, )+
                }
            }
        }

        impl Schedule {
            /// `spec` in the state `paused`, changed at `updated_at`.
            pub fn new(spec: ScheduleSpec, paused: bool, updated_at: Option<DateTime<Utc>>) -> Self {
                let ScheduleSpec { name, job_type, $( $field, )+ } = spec;
                Self {
                    name,
                    job_type: Some(job_type),
                    $( $field, )+
                    paused,
                    updated_at,
                    invalid: None,
                    runs_left: None,
                    pause_note: None,
                }
            }

            /// A stored definition that does not read, and why.
            pub fn unreadable(
                name: String,
                why: String,
                paused: bool,
                updated_at: Option<DateTime<Utc>>,
            ) -> Self {
                Self {
                    name,
                    job_type: None,
                    $( $field: None, )+
                    paused,
                    updated_at,
                    invalid: Some(why),
                    runs_left: None,
                    pause_note: None,
                }
            }

            /// The definition as a body to send back (`PUT`): the state
            /// fields are left out, so a pause made meanwhile is not undone.
            pub fn into_input(self) -> ScheduleInput {
                ScheduleInput {
                    name: Some(self.name),
                    job_type: self.job_type.unwrap_or_default(),
                    $( $field: self.$field, )+
                    paused: None,
                    updated_at: None,
                    invalid: None,
                    runs_left: None,
                    pause_note: None,
                }
            }
        }
    };
}

schedule_types! {
    /// A cron expression: 6 fields with seconds, or 5 (seconds = 0);
    /// macros, `L W # ?`.
    cron: String,
    /// A fixed interval such as `"30s"`, in whole seconds.
    every: String,
    /// With `every`: the RFC 3339 instant intervals count from (default the
    /// Unix epoch).
    anchor: String,
    /// A one-shot run at this RFC 3339 instant.
    at: String,
    /// A one-shot run this long after the schedule is first stored (stored
    /// as `at`).
    after: String,
    /// IANA time zone `cron` is read in; default UTC.
    timezone: String,
    /// The payload of its runs: any JSON value, passed to the handler.
    payload: serde_json::Value,
    /// Overrides of the job type's retry policy.
    retry: RetrySpec,
    /// Per-attempt timeout, e.g. `"10m"`.
    timeout: String,
    /// At most this many of its runs (per `concurrency_key`) run at once
    /// across every worker (1 to 100000).
    #[schema(minimum = 1, maximum = 100000)]
    concurrency: u32,
    /// What the concurrency limit counts by, e.g. `"{payload.tenant}"`;
    /// absent, the job type.
    concurrency_key: String,
    /// At most this many of its runs (per `rate_limit_key`) start in any
    /// window across every worker: `"50/s"`, `"10/1m"`, `"3/10s"` (1 to
    /// 10000 starts, a window of 1s to 1 day).
    rate_limit: String,
    /// What the rate limit counts by, e.g. `"{payload.partner}"`; absent,
    /// the job type.
    rate_limit_key: String,
    /// The priority of its runs: `high`, `normal` (default) or `low`.
    #[schema(value_type = Option<belfry_protocol::Priority>)]
    priority: String,
    /// What to do with missed fires.
    #[schema(value_type = Option<Misfire>)]
    misfire: String,
    /// With `misfire = "catch_up"`: how far back (default `"1h"`).
    catch_up_window: String,
    /// With `misfire = "catch_up"`: at most this many missed fires (default
    /// 100).
    #[schema(minimum = 1, maximum = 10000)]
    catch_up_max: u32,
    /// Whether a fire may start while the previous run is unfinished.
    #[schema(value_type = Option<Overlap>)]
    overlap: String,
    /// Spread fires over up to this long after their nominal instant (e.g.
    /// `"30s"`), the same offset on every replica.
    jitter: String,
    /// No fire before this RFC 3339 instant.
    #[schema(format = DateTime)]
    start_at: String,
    /// No fire after this RFC 3339 instant.
    #[schema(format = DateTime)]
    end_at: String,
    /// Fire at most this many more times, then pause with a note (see
    /// `runs_left`); the counter restarts whenever this value changes.
    #[schema(minimum = 1, maximum = 1000000000)]
    remaining_runs: u64,
    /// Pause after this many consecutive runs ended `failed` or `dead`.
    #[schema(minimum = 1, maximum = 1000)]
    pause_after_failures: u32,
    /// A run not finished this long after its scheduled instant (e.g.
    /// `"15m"`) raises a `run.late` alert.
    deadline: String,
    /// Alert channels (of `BELFRY_ALERTS`) that get every alert of this
    /// schedule.
    alerts: Vec<String>,
    /// Runs to enqueue when a run of this schedule succeeds; each child's
    /// run key is `{name}@{the parent's fire instant}`.
    #[schema(no_recursion)]
    on_success: Vec<belfry_protocol::FollowUpSpec>,
    /// Runs to enqueue when a run ends `failed` or `dead`.
    #[schema(no_recursion)]
    on_failure: Vec<belfry_protocol::FollowUpSpec>,
    /// Runs to enqueue whatever a run's end (`cancelled` too).
    #[schema(no_recursion)]
    on_finish: Vec<belfry_protocol::FollowUpSpec>,
}

/// `GET /v1/schedules`: one page of schedules, by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScheduleList {
    /// The schedules of this page.
    pub schedules: Vec<Schedule>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    pub next_cursor: Option<String>,
}

impl Page for ScheduleList {
    type Item = Schedule;

    fn into_parts(self) -> (Vec<Schedule>, Option<String>) {
        (self.schedules, self.next_cursor)
    }

    fn from_parts(schedules: Vec<Schedule>, next_cursor: Option<String>) -> Self {
        Self {
            schedules,
            next_cursor,
        }
    }
}

/// The query of `GET /v1/schedules`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ScheduleQuery {
    /// Schedules per page.
    #[param(minimum = 1, maximum = 500, default = 100, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page (the last name).
    #[param(value_type = Option<Name>, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// The body of `POST /v1/schedules/{name}/trigger` (optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerRequest {
    /// Run even when the overlap policy forbids it and the previous run
    /// is unfinished.
    #[serde(default)]
    #[schema(default = false)]
    pub force: bool,
}

wire_enum! {
    /// What became of a triggered run.
    pub enum TriggerOutcome {
        /// The broker confirmed it.
        Dispatched = "dispatched",
        /// No worker group serves its job type: the run is dead.
        Unroutable = "unroutable",
        /// Not yet confirmed by the broker; the outbox publishes it.
        NotConfirmed = "not_confirmed",
        /// The previous run is unfinished: the overlap policy holds this
        /// one (`buffered`) until it ends.
        Buffered = "buffered",
    }
}

/// The answer to a trigger: the new run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Triggered {
    /// What became of it.
    pub outcome: TriggerOutcome,
    /// The run's id.
    pub run_id: Uuid,
    /// Its run key (`null` if the run could not be read back).
    pub run_key: Option<String>,
    /// Its status just after (`null` if it could not be read back).
    pub status: Option<RunStatus>,
    /// Its trace id.
    pub trace_id: Option<String>,
    /// A note when the run was not simply dispatched.
    pub message: Option<String>,
}

/// The body of `POST /v1/schedules/{name}/backfill`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"from": "2026-07-26T00:00:00Z", "to": "2026-07-26T01:00:00Z"}))]
pub struct BackfillRequest {
    /// Start of the range (inclusive), RFC 3339.
    #[schema(format = DateTime)]
    pub from: String,
    /// End of the range (exclusive), RFC 3339.
    #[schema(format = DateTime)]
    pub to: String,
    /// With `overlap = "forbid"`: claim every instant anyway (they may run
    /// side by side).
    #[serde(default)]
    #[schema(default = false)]
    pub force: bool,
}

wire_enum! {
    /// What happened to one instant of a backfill.
    pub enum BackfillOutcome {
        /// Claimed and confirmed by the broker.
        Dispatched = "dispatched",
        /// It had run before; not repeated.
        AlreadyRan = "already_ran",
        /// Skipped by the overlap policy.
        Skipped = "skipped",
        /// Claimed; the outbox publishes it.
        NotConfirmed = "not_confirmed",
        /// No worker group serves the job type: dead.
        Unroutable = "unroutable",
        /// Held by the overlap policy until the previous run ends.
        Buffered = "buffered",
        /// Not claimed: the ledger was unreachable; backfill again.
        Failed = "failed",
    }
}

/// One instant of a backfill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BackfilledFire {
    /// The fire instant.
    pub scheduled_at: DateTime<Utc>,
    /// What happened to it.
    pub outcome: BackfillOutcome,
}

/// The answer to a backfill: what happened to each instant of the range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Backfill {
    /// The schedule.
    pub schedule: String,
    /// Start of the range (inclusive).
    pub from: DateTime<Utc>,
    /// End of the range (exclusive).
    pub to: DateTime<Utc>,
    /// Instants in the range.
    #[schema(maximum = 10000)]
    pub instants: u32,
    /// How many instants ended each way, by [`BackfillOutcome`].
    #[schema(value_type = BTreeMap<String, u64>)]
    pub counts: BTreeMap<BackfillOutcome, u64>,
    /// Each instant, in order.
    pub fires: Vec<BackfilledFire>,
}

/// The answer of `GET /v1/schedules/{name}/preview`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Preview {
    /// The schedule.
    pub schedule: String,
    /// Whether it is paused (paused schedules do not fire these).
    pub paused: bool,
    /// The next fire instants, computed as the timer does.
    pub next: Vec<DateTime<Utc>>,
}

/// The query of `GET /v1/schedules/{name}/preview`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PreviewQuery {
    /// How many instants.
    #[param(minimum = 1, maximum = 100, default = 10, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
}

/// The path of `/v1/schedules/{name}` and its actions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SchedulePath {
    /// Schedule name.
    #[param(value_type = Name)]
    pub name: String,
}

/// The body of `POST /v1/schedules/{name}/pause` and `.../resume`
/// (optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// Why it is paused: shown with the schedule (API, web view) until it
    /// is resumed, and written to the audit log (resume: audit log only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, max_length = 1000)]
    pub note: Option<String>,
}
