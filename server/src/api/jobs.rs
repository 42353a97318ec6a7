//! `/v1/jobs`: enqueue an ad-hoc job of any type, through the same ledger
//! and outbox as application code using `belfry_dispatch::Client`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::Utc;
use serde_json::Value;

use belfry_api_types::{Enqueued, ErrorBody, JobRequest};
use belfry_dispatch::{AdHocJob, DispatchError};

use super::error::ApiError;
use super::input;
use super::runs::run_status;
use super::{audit, ApiState, Caller};

/// Longest accepted `delay`: one year.
const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);

/// `POST /v1/jobs`: `{"job_type", "payload", "name"?, "key"?, "at"? |
/// "delay"?, "retry"?, "timeout"?}`. 201 with the new run; 200 with the
/// existing one when `name` + `key` were enqueued before (idempotency).
#[utoipa::path(
    post, path = "/v1/jobs", operation_id = "enqueueJob", summary = "Enqueue an ad-hoc job of any type",
    request_body = JobRequest,
    responses(
        (status = 201, description = "Created", body = Enqueued, links(
            ("GetRun" = (operation_id = "getRun", parameters(("id" = "$response.body#/run_id")))),
        )),
        (status = 200, description = "Already enqueued with this name and key", body = Enqueued),
        (status = 422, description = "Invalid field", body = ErrorBody),
    ),
)]
pub async fn enqueue(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Enqueued>), ApiError> {
    let bytes = input::body_bytes(body)?;
    let value = Value::Object(input::json_object(&bytes)?);
    input::storable("payload", &value)?;
    let request: JobRequest = input::typed(value)?;
    let options =
        belfry_scheduler::schedule::job_options_of(&belfry_scheduler::schedule::RunOptionsSpec {
            retry: request.retry.as_ref(),
            timeout: request.timeout.as_deref(),
            concurrency: request.concurrency,
            concurrency_key: request.concurrency_key.as_deref(),
            rate_limit: request.rate_limit.as_deref(),
            rate_limit_key: request.rate_limit_key.as_deref(),
            priority: request.priority.as_deref(),
            job_name: request.name.as_deref().unwrap_or(&request.job_type),
            on_success: &request.on_success,
            on_failure: &request.on_failure,
            on_finish: &request.on_finish,
        })
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
        DispatchError::FollowUp(f) => ApiError::invalid(f.list(), f.to_string()),
        DispatchError::Ledger(l) => ApiError::from(l),
        other => ApiError::unavailable(format!("the job could not be enqueued: {other}; retry")),
    })?;
    let (code, created) = match &enqueued {
        belfry_dispatch::Enqueued::Created { .. } => (StatusCode::CREATED, true),
        belfry_dispatch::Enqueued::Existing { .. } => (StatusCode::OK, false),
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
        Json(Enqueued {
            created,
            run_id: enqueued.id(),
            run_key: enqueued.run_key().to_owned(),
            status: run
                .as_ref()
                .map(|r| run_status(&r.status_text))
                .transpose()?,
            scheduled_at: run.as_ref().map_or_else(Utc::now, |r| r.scheduled_at),
            trace_id: run.and_then(|r| r.trace_id),
        }),
    ))
}
