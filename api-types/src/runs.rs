//! `/v1/runs`: a run as the list and the detail show it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::Page;

wire_enum! {
    /// Where a run is in its life: `claimed → dispatched → running →
    /// retrying → succeeded | failed | dead | cancelled`.
    pub enum RunStatus {
        /// Held by the schedule's overlap policy until its previous run
        /// ends; then `claimed`.
        Buffered = "buffered",
        /// A replica won the fire; not yet confirmed by the broker.
        Claimed = "claimed",
        /// The broker confirmed the message.
        Dispatched = "dispatched",
        /// A worker is running an attempt.
        Running = "running",
        /// An attempt failed with a retryable error; another will follow.
        Retrying = "retrying",
        /// An attempt succeeded.
        Succeeded = "succeeded",
        /// The handler reported a permanent error.
        Failed = "failed",
        /// The run can never complete (retries exhausted, no handler).
        Dead = "dead",
        /// An operator cancelled the run (`last_error` says who).
        Cancelled = "cancelled",
    }
}

impl RunStatus {
    /// True for `succeeded`, `failed`, `dead` and `cancelled`: nothing more
    /// will happen to the run.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::Dead | Self::Cancelled
        )
    }
}

wire_enum! {
    /// How a run came to be.
    pub enum Origin {
        /// The timer or misfire recovery.
        Schedule = "schedule",
        /// A backfill.
        Backfill = "backfill",
        /// A manual trigger.
        Manual = "manual",
        /// An ad-hoc job.
        Adhoc = "adhoc",
        /// A follow-up of another run.
        FollowUp = "follow_up",
    }
}

impl Origin {
    /// The origin of a run claimed by `claimed_by`: triggers, backfills and
    /// ad-hoc jobs claim as `manual:`, `backfill:` and `client:` (or
    /// nobody); anything else is a replica's timer.
    pub fn of_claimer(claimed_by: Option<&str>) -> Self {
        match claimed_by {
            Some(c) if c.starts_with("manual:") => Self::Manual,
            Some(c) if c.starts_with("backfill:") => Self::Backfill,
            Some(c) if c.starts_with("client:") => Self::Adhoc,
            Some(c) if c.starts_with("follow-up:") => Self::FollowUp,
            None => Self::Adhoc,
            Some(_) => Self::Schedule,
        }
    }
}

/// A run as the list shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Run {
    /// Row id (= message id).
    pub id: Uuid,
    /// Schedule or ad-hoc job name.
    pub job_name: String,
    /// Run key.
    pub run_key: String,
    /// Job type.
    pub job_type: String,
    /// Status.
    pub status: RunStatus,
    /// How the run came to be.
    pub origin: Origin,
    /// Nominal fire instant.
    pub scheduled_at: DateTime<Utc>,
    /// When it was claimed.
    pub claimed_at: Option<DateTime<Utc>>,
    /// When the broker confirmed it.
    pub dispatched_at: Option<DateTime<Utc>>,
    /// When its first attempt started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// Scheduled instant to broker confirmation, in milliseconds.
    pub lateness_ms: Option<i64>,
    /// Attempts started.
    #[schema(minimum = 0)]
    pub attempts: i32,
    /// The claiming replica (`manual:`, `backfill:` or `client:` prefixed
    /// for triggers, backfills and ad-hoc jobs).
    pub claimed_by: Option<String>,
    /// Worker of the latest attempt.
    pub worker: Option<String>,
    /// Latest error.
    pub last_error: Option<String>,
    /// Trace id (W3C), for the trace UI.
    pub trace_id: Option<String>,
    /// When a cancel was requested; on a `running` run: its worker is
    /// stopping it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cancel_requested_at: Option<DateTime<Utc>>,
}

/// A finished attempt of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Attempt {
    /// 1-based attempt number.
    pub attempt: i32,
    /// The worker instance that ran it.
    pub worker: String,
    /// When the handler was called.
    pub started_at: DateTime<Utc>,
    /// When the attempt ended.
    pub finished_at: DateTime<Utc>,
    /// `succeeded`, `retry`, `failed`, `timeout`, `panicked`, ...
    pub outcome: String,
    /// The error text, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<String>,
    /// The run's result, when this (succeeded) attempt's handler set one
    /// (any JSON value; handed to the run's follow-ups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub result: Option<serde_json::Value>,
}

/// `GET /v1/runs/{id}`: a run with its payload, options and attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunDetail {
    /// What the list shows.
    #[serde(flatten)]
    pub run: Run,
    /// The run's payload (any JSON value).
    pub payload: serde_json::Value,
    /// Its retry and timeout overrides.
    #[schema(value_type = Object)]
    pub options: serde_json::Value,
    /// Finished attempts with their errors and timings.
    pub attempt_log: Vec<Attempt>,
    /// For a follow-up run: the runs whose end enqueued it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<RunLink>,
    /// The follow-up runs enqueued so far from this run's lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<RunLink>,
}

/// Another run related to this one (a parent or a follow-up).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunLink {
    /// Its id.
    pub id: Uuid,
    /// Its job name.
    pub job_name: String,
    /// Its run key.
    pub run_key: String,
    /// Its status now (`null` if it is no longer in the ledger).
    pub status: Option<RunStatus>,
}

/// `GET /v1/runs`: one page of runs, newest fire first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    /// The runs of this page.
    pub runs: Vec<Run>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    pub next_cursor: Option<String>,
}

impl Page for RunList {
    type Item = Run;

    fn into_parts(self) -> (Vec<Run>, Option<String>) {
        (self.runs, self.next_cursor)
    }

    fn from_parts(runs: Vec<Run>, next_cursor: Option<String>) -> Self {
        Self { runs, next_cursor }
    }
}

/// The query of `GET /v1/runs`: filters and paging.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunQuery {
    /// Job name (a schedule's or an ad-hoc job's).
    #[param(min_length = 1, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Job type.
    #[param(min_length = 1, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_type: Option<String>,
    /// Comma-separated statuses.
    #[param(
        pattern = "^(buffered|claimed|dispatched|running|retrying|succeeded|failed|dead|cancelled)(,(buffered|claimed|dispatched|running|retrying|succeeded|failed|dead|cancelled))*$",
        nullable = false
    )]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// `scheduled_at >= from` (RFC 3339).
    #[param(format = DateTime, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// `scheduled_at < to` (RFC 3339).
    #[param(format = DateTime, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Runs per page.
    #[param(minimum = 1, maximum = 500, default = 50, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page, unchanged.
    #[param(pattern = "^-?[0-9]{1,17}\\.[0-9a-f]{32}$", nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// The path of `/v1/runs/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RunPath {
    /// The run's id.
    pub id: Uuid,
}

/// The body of `POST /v1/runs/{id}/cancel` (optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRun {
    /// Why, for the run's `last_error` and the audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, max_length = 1000)]
    pub reason: Option<String>,
}

wire_enum! {
    /// What a cancel did.
    pub enum CancelResult {
        /// The run was waiting for a worker (or its worker was gone): it is
        /// `cancelled` and will never execute.
        Cancelled = "cancelled",
        /// A worker is running it: the worker was told, fires the
        /// handler's cancellation token and ends the run `cancelled` after
        /// the grace period (`BELFRY_CANCEL_GRACE`) at the latest.
        CancelRequested = "cancel_requested",
    }
}

/// The answer of `POST /v1/runs/{id}/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CancelAnswer {
    /// The run.
    pub run_id: Uuid,
    /// What happened.
    pub result: CancelResult,
    /// The run's status after the request.
    pub status: RunStatus,
}

/// What a line of a run's log is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogLineKind {
    /// A line the handler logged.
    Log,
    /// A progress report (`done` of `total`, the note as the message).
    Progress,
    /// The run's log reached its bound here: later lines were dropped.
    Truncated,
    /// The attempt's failure, written by the worker after its lines.
    Error,
}

/// One line of a run's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LogLine {
    /// The attempt that wrote it (1-based).
    pub attempt: i32,
    /// Its place in the attempt, from 0.
    pub seq: i32,
    /// When it was written (the worker's clock).
    pub at: DateTime<Utc>,
    /// What it is.
    pub kind: LogLineKind,
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// The text (a NUL written as `\0`).
    pub message: String,
    /// Structured fields (a JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub fields: Option<serde_json::Value>,
    /// Progress: units done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub done: Option<i64>,
    /// Progress: units in all, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub total: Option<i64>,
}

impl LogLine {
    /// The line as one line of text, as the CLI prints it and the web view
    /// shows it: `HH:MM:SS.mmm LEVEL text {fields}`, progress as
    /// `[done/total] note`, a failure as `attempt failed: …`, the
    /// truncation marker as `… note`. Not escaped for any medium.
    pub fn text(&self) -> String {
        let body = match self.kind {
            LogLineKind::Progress => format!(
                "[{}{}] {}",
                self.done.unwrap_or(0),
                self.total.map(|t| format!("/{t}")).unwrap_or_default(),
                self.message
            ),
            LogLineKind::Truncated => format!("… {}", self.message),
            LogLineKind::Error => format!("attempt failed: {}", self.message),
            LogLineKind::Log => self.message.clone(),
        };
        let fields = self
            .fields
            .as_ref()
            .map(|f| format!(" {f}"))
            .unwrap_or_default();
        format!(
            "{} {:<5} {body}{fields}",
            self.at.format("%H:%M:%S%.3f"),
            self.level.to_uppercase()
        )
    }
}

/// `GET /v1/runs/{id}/logs`: a page of a run's log, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunLogPage {
    /// The run.
    pub run_id: Uuid,
    /// The run's status now.
    pub status: RunStatus,
    /// True when this page is empty and the log will not grow: the run is
    /// final and every line its attempts sent is stored (each attempt
    /// entry records how many it sent), or it ended 2 minutes ago (a
    /// worker that gave lines up). A follower stops here.
    pub complete: bool,
    /// The lines after `after`, at most `limit`.
    pub lines: Vec<LogLine>,
    /// Pass as `after` for the lines that follow (the same cursor when the
    /// page is empty: ask again later for new lines).
    pub next: String,
    /// The run's latest progress report, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub progress: Option<LogLine>,
}

/// The query of `GET /v1/runs/{id}/logs` and its stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunLogQuery {
    /// `next` of the previous page (`ATTEMPT.SEQ`); from the start when
    /// absent.
    #[param(pattern = "^-?[0-9]{1,10}\\.-?[0-9]{1,10}$", nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Lines per page (the stream: lines read at a time).
    #[param(minimum = 1, maximum = 1000, default = 200, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Lines per page of `GET /v1/runs/{id}/logs` at most.
pub const MAX_LOG_PAGE: u32 = 1000;
