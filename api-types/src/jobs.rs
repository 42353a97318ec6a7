//! `/v1/jobs`: enqueue an ad-hoc job.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use belfry_protocol::RetrySpec;

use crate::runs::RunStatus;
use crate::schedules::Name;

/// The body of `POST /v1/jobs`: a job of any type, now, at an instant or
/// after a delay (`at` or `delay`, not both).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "job_type": "noop", "payload": {"customer": "c-42"}, "name": "billing",
    "key": "invoice-2026-07", "delay": "10m"
}))]
pub struct JobRequest {
    /// The job type (routes it to a worker group).
    #[schema(value_type = Name)]
    pub job_type: String,
    /// Any JSON value, passed to the handler.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub payload: serde_json::Value,
    /// The job name of the run (default: the job type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Name>)]
    pub name: Option<String>,
    /// Idempotency key: the same name and key enqueue once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Run at this RFC 3339 instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub at: Option<String>,
    /// Run after this long, e.g. `"10m"` (up to one year).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// Overrides of the job type's retry policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// Per-attempt timeout, e.g. `"10m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// At most this many runs of its job type (per `concurrency_key`) run
    /// at once across every worker (1 to 100000), this run included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100000)]
    pub concurrency: Option<u32>,
    /// What the concurrency limit counts by, e.g. `"{payload.tenant}"`;
    /// absent, the job type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// At most this many runs of its job type (per `rate_limit_key`) start
    /// in any window across every worker: `"50/s"`, `"10/1m"`, `"3/10s"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// What the rate limit counts by, e.g. `"{payload.partner}"`; absent,
    /// the job type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_key: Option<String>,
    /// The run's priority: `high`, `normal` (default) or `low`; a worker
    /// takes ready runs of a higher level first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<belfry_protocol::Priority>)]
    pub priority: Option<String>,
    /// Runs to enqueue when this one succeeds; each child's run key is
    /// `{name}@{this run key's identity}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(no_recursion)]
    pub on_success: Vec<belfry_protocol::FollowUpSpec>,
    /// Runs to enqueue when this one ends `failed` or `dead`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(no_recursion)]
    pub on_failure: Vec<belfry_protocol::FollowUpSpec>,
    /// Runs to enqueue whatever this one's end (`cancelled` too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(no_recursion)]
    pub on_finish: Vec<belfry_protocol::FollowUpSpec>,
}

/// The answer to `POST /v1/jobs`: the run, new (201) or enqueued before
/// with the same name and key (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Enqueued {
    /// Whether this request created it.
    pub created: bool,
    /// The run's id.
    pub run_id: Uuid,
    /// Its run key.
    pub run_key: String,
    /// Its status (`null` if it could not be read back).
    pub status: Option<RunStatus>,
    /// When it is due.
    pub scheduled_at: DateTime<Utc>,
    /// Its trace id.
    pub trace_id: Option<String>,
}
