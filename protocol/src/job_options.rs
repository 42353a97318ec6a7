//! Per-run overrides of a job type's retry policy and timeout.
//!
//! A schedule (or an ad-hoc request) may say "this run retries at most 3
//! times" or "this run may take 10 minutes". The override travels in the
//! message (`options`) and in `job_runs.options`, so a republished or
//! retried message keeps it. Unset fields fall back to the job type's
//! setting, then to the worker's default.
//!
//! A run may also carry a cluster-wide concurrency limit (`concurrency`,
//! and optionally `concurrency_key`) and a cluster-wide rate limit
//! (`rate_limit`, and optionally `rate_limit_key`): the ones it is started
//! under.
//!
//! Precedence, most specific first: run (schedule / request) → job type
//! (registered with the handler) → worker default (environment).

use serde::{Deserialize, Serialize};

/// Overrides for one run. All fields optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobOptions {
    /// Retry policy fields to override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryOverride>,
    /// Per-attempt timeout in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// At most this many runs with the same limit key run at once, across
    /// every worker of every host (see `belfry_worker`'s `run_limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// What the concurrency limit counts by: a template over the payload
    /// such as `"{payload.tenant}"` (one limit per tenant); absent, the
    /// job type as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// At most this many starts per window of runs with the same rate key,
    /// across every worker of every host (see `belfry_worker`'s
    /// `run_limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<crate::RateLimit>,
    /// What the rate limit counts by: a payload template as
    /// `concurrency_key`; absent, the job type as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_key: Option<String>,
    /// The run's priority; absent, `normal` (see [`crate::Priority`]).
    /// Set by a schedule, an ad-hoc request or a message: it picks the
    /// routing key when the run is published, where no worker's registry
    /// is known, so a job type registered with one does not use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<crate::Priority>,
    /// Runs to enqueue when this one ends (see [`crate::follow_up`]).
    #[serde(default, skip_serializing_if = "crate::FollowUps::is_empty")]
    pub follow_ups: crate::FollowUps,
    /// For a follow-up run: the runs whose end enqueued it, with their
    /// outcome (see [`crate::follow_up`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<crate::ParentRun>,
}

impl JobOptions {
    /// The run's priority (`normal` when unset).
    pub fn priority(&self) -> crate::Priority {
        self.priority.unwrap_or_default()
    }

    /// True when nothing is overridden (the field is then left out of
    /// messages).
    pub fn is_empty(&self) -> bool {
        self.retry.is_none()
            && self.timeout_ms.is_none()
            && self.concurrency.is_none()
            && self.concurrency_key.is_none()
            && self.rate_limit.is_none()
            && self.rate_limit_key.is_none()
            && self.priority.is_none()
            && self.follow_ups.is_empty()
            && self.parents.is_empty()
    }
}

/// Retry policy fields to override; see the worker's `RetryPolicy`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RetryOverride {
    /// Attempts in total, the first included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Delay after the first failed attempt, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_ms: Option<u64>,
    /// Growth factor per failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f32>,
    /// Cap of one delay, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
    /// Whether delays are randomly stretched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<bool>,
}
