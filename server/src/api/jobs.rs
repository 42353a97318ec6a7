//! `/v1/jobs`: enqueue an ad-hoc job of any type, through the same ledger
//! and outbox as application code using `belfry_dispatch::Client`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{json, Value};

use belfry_dispatch::{AdHocJob, DispatchError, Enqueued};
use belfry_protocol::RetrySpec;

use super::error::ApiError;
use super::input;
use super::{audit, ApiState, Caller};

/// Longest accepted `delay`: one year.
const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobRequest {
    job_type: String,
    #[serde(default)]
    payload: Value,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    at: Option<String>,
    #[serde(default)]
    delay: Option<String>,
    #[serde(default)]
    retry: Option<RetrySpec>,
    #[serde(default)]
    timeout: Option<String>,
}

/// `POST /v1/jobs`: `{"job_type", "payload", "name"?, "key"?, "at"? |
/// "delay"?, "retry"?, "timeout"?}`. 201 with the new run; 200 with the
/// existing one when `name` + `key` were enqueued before (idempotency).
pub async fn enqueue(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = input::body_bytes(body)?;
    let value = Value::Object(input::json_object(&bytes)?);
    input::storable("payload", &value)?;
    let request: JobRequest = input::typed(value)?;
    let options = belfry_scheduler::schedule::job_options_of(
        request.retry.as_ref(),
        request.timeout.as_deref(),
    )
    .map_err(|(field, message)| ApiError::invalid(field, message))?;
    let mut job = AdHocJob::new(request.job_type.clone(), request.payload).options(options);
    if let Some(name) = &request.name {
        job = job.named(name.clone());
    }
    if let Some(key) = &request.key {
        job = job.idempotency_key(key.clone());
    }
    match (&request.at, &request.delay) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("delay", "give `at` or `delay`, not both"))
        }
        (Some(raw), None) => {
            let at = input::instant("at", raw).map_err(|e| ApiError::invalid("at", e.message))?;
            job = job.at(at);
        }
        (None, Some(raw)) => {
            let delay = humantime::parse_duration(raw.trim())
                .ok()
                .filter(|d| *d <= MAX_DELAY)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "delay",
                        format!("delay {raw:?} is not a duration up to one year, such as \"10m\" or \"2h\""),
                    )
                })?;
            job = job.after(delay);
        }
        (None, None) => {}
    }
    let enqueued = state.client().enqueue(job).await.map_err(|e| match e {
        DispatchError::Name(n) => {
            use belfry_protocol::NameError;
            let (NameError::Empty { what }
            | NameError::TooLong { what, .. }
            | NameError::BadCharacter { what, .. }) = &n;
            let field = if *what == "job type" {
                "job_type"
            } else {
                "name"
            };
            ApiError::invalid(field, n.to_string())
        }
        DispatchError::BadKey { .. } => ApiError::invalid("key", e.to_string()),
        DispatchError::Ledger(l) => ApiError::from(l),
        other => ApiError::unavailable(format!("the job could not be enqueued: {other}; retry")),
    })?;
    let (code, created) = match &enqueued {
        Enqueued::Created { .. } => (StatusCode::CREATED, true),
        Enqueued::Existing { .. } => (StatusCode::OK, false),
    };
    if created {
        let name = request.name.as_deref().unwrap_or(&request.job_type);
        audit(
            &caller,
            "job.enqueue",
            name,
            &format!("run {} ({})", enqueued.id(), enqueued.run_key()),
        );
    }
    // Enqueued either way: a failed read-back only leaves fields empty.
    let run = state.ledger().run(enqueued.id()).await.ok().flatten();
    Ok((
        code,
        Json(json!({
            "created": created,
            "run_id": enqueued.id(),
            "run_key": enqueued.run_key(),
            "status": run.as_ref().map(|r| r.status_text.clone()),
            "scheduled_at": run.as_ref().map_or_else(Utc::now, |r| r.scheduled_at),
            "trace_id": run.and_then(|r| r.trace_id),
        })),
    )
        .into_response())
}
