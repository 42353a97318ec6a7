//! `/v1/schedules`: create, list, read, replace, delete, pause, resume,
//! trigger, backfill and preview.
//!
//! A schedule's JSON is its `[[schedule]]` table from the file, plus two
//! read-only fields: `paused` and `updated_at`. A body may carry them back
//! unchanged (so `GET`, edit, `PUT` works); `paused` in a body sets the
//! paused state, `updated_at` is ignored. Every definition goes through the
//! engine's validation before anything is stored, and every change is
//! written to the `schedules` table, whose notifications reach each
//! replica's timer.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::Value;

use belfry_api_types::{
    Backfill, BackfillOutcome, BackfillRequest, BackfilledFire, ErrorBody, PauseRequest, Preview,
    PreviewQuery, Schedule, ScheduleInput, ScheduleList, SchedulePath, ScheduleQuery,
    TriggerOutcome, TriggerRequest, Triggered, MAX_PAGE, MAX_PREVIEW,
};
use belfry_ledger::ScheduleRow;
use belfry_protocol::{validate_name, ScheduleSpec};

use belfry_scheduler::ops::{self, Backfilled, OpsError};
use belfry_scheduler::schedule_sync::spec_of_row;

use super::error::ApiError;
use super::input::{self, PathParam, QueryParams};
use super::runs::run_status;
use super::{ApiState, Caller};

/// A schedule as the API shows it: the definition plus its state.
pub fn view(row: &ScheduleRow) -> Schedule {
    match spec_of_row(row) {
        Ok(spec) => Schedule {
            runs_left: row.remaining_runs,
            pause_note: row.pause_note.clone(),
            ..Schedule::new(spec, row.paused, row.updated_at)
        },
        // Edited by hand into something unreadable: show what is there and
        // say why it does not fire.
        Err(why) => Schedule::unreadable(
            row.name.clone(),
            why.to_string(),
            row.paused,
            row.updated_at,
        ),
    }
}

pub(crate) fn checked_name(name: &str) -> Result<(), ApiError> {
    validate_name("schedule name", name)
        .map_err(|e| ApiError::bad_request(e.to_string()).field("name"))
}

/// Reads a schedule body: the definition and an optional `paused`. The
/// name is the body's; with `path_name` (a replace) it may be left out and
/// must otherwise equal the path's.
fn schedule_input(
    bytes: &[u8],
    path_name: Option<&str>,
) -> Result<(ScheduleSpec, Option<bool>), ApiError> {
    let value = Value::Object(input::json_object(bytes)?);
    input::storable("payload", &value)?;
    let body: ScheduleInput = input::typed(value)?;
    let name = match (&body.name, path_name) {
        (Some(given), Some(name)) if given != name => {
            return Err(ApiError::invalid(
                "name",
                format!(
                    "the body's name must be {name:?}, as in the path; to rename, create the \
                     new schedule and delete the old one"
                ),
            ))
        }
        (Some(given), _) => given.clone(),
        (None, Some(name)) => name.to_owned(),
        (None, None) => return Err(ApiError::invalid("name", "missing field `name`")),
    };
    let paused = body.paused;
    Ok((body.into_spec(name), paused))
}

/// `GET /v1/schedules?limit=&cursor=`: schedules by name, a page at a time;
/// `next_cursor` continues.
#[utoipa::path(
    get, path = "/v1/schedules", operation_id = "listSchedules", summary = "Schedules by name, paginated",
    params(ScheduleQuery),
    responses((status = 200, description = "A page", body = ScheduleList)),
)]
pub async fn list(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Result<Json<ScheduleList>, ApiError> {
    let q = QueryParams::parse(query.as_deref(), &["limit", "cursor"])?;
    let limit = q.number("limit", 100, 1, MAX_PAGE)?;
    if let Some(cursor) = q.text("cursor") {
        // The cursor is the last name of the previous page.
        validate_name("cursor", cursor).map_err(|e| {
            ApiError::bad_request(format!("{e}; pass next_cursor unchanged")).field("cursor")
        })?;
    }
    let rows = state
        .ledger()
        .schedules_page(q.text("cursor"), i64::from(limit) + 1)
        .await?;
    let more = rows.len() > limit as usize;
    let page = &rows[..rows.len().min(limit as usize)];
    Ok(Json(ScheduleList {
        schedules: page.iter().map(view).collect(),
        next_cursor: if more {
            page.last().map(|r| r.name.clone())
        } else {
            None
        },
    }))
}

/// `POST /v1/schedules`: creates a schedule (409 when the name is taken).
#[utoipa::path(
    post, path = "/v1/schedules", operation_id = "createSchedule", summary = "Create a schedule",
    request_body = ScheduleInput,
    responses(
        // Links to every operation on the new schedule: added in `doc`.
        (status = 201, description = "Created", body = Schedule),
        (status = 409, description = "Name taken", body = ErrorBody),
        (status = 422, description = "Invalid field", body = ErrorBody),
    ),
)]
pub async fn create(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Schedule>), ApiError> {
    let bytes = input::body_bytes(body)?;
    let (spec, paused) = schedule_input(&bytes, None)?;
    let row = state
        .ops()
        .create(&caller.name, &spec, paused.unwrap_or(false))
        .await?;
    Ok((StatusCode::CREATED, Json(view(&row))))
}

/// `GET /v1/schedules/{name}`.
#[utoipa::path(
    get, path = "/v1/schedules/{name}", operation_id = "getSchedule", summary = "One schedule",
    params(SchedulePath),
    responses(
        (status = 200, description = "The schedule", body = Schedule),
        (status = 404, description = "No such schedule", body = ErrorBody),
    ),
)]
pub async fn get_one(
    State(state): State<ApiState>,
    PathParam(name): PathParam,
) -> Result<Json<Schedule>, ApiError> {
    Ok(Json(view(&state.ops().schedule(&name).await?)))
}

/// `PUT /v1/schedules/{name}`: replaces the definition of an existing
/// schedule (404 when there is none; create with `POST`).
#[utoipa::path(
    put, path = "/v1/schedules/{name}", operation_id = "replaceSchedule",
    summary = "Replace a schedule's definition",
    params(SchedulePath),
    request_body(content = ScheduleInput, example = json!({"every": "30s", "job_type": "noop"})),
    responses(
        (status = 200, description = "Replaced", body = Schedule),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 422, description = "Invalid field", body = ErrorBody),
    ),
)]
pub async fn replace(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Schedule>, ApiError> {
    checked_name(&name)?;
    let bytes = input::body_bytes(body)?;
    let (spec, paused) = schedule_input(&bytes, Some(&name))?;
    match state.ops().replace(&caller.name, &spec, paused).await {
        Ok(row) => Ok(Json(view(&row))),
        Err(e @ OpsError::NotFound { .. }) => Err(ApiError::not_found(format!(
            "{e}; create it with POST /v1/schedules"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// `DELETE /v1/schedules/{name}`: its runs stay in `job_runs`.
#[utoipa::path(
    delete, path = "/v1/schedules/{name}", operation_id = "deleteSchedule",
    summary = "Delete a schedule (its runs stay)",
    params(SchedulePath),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such schedule", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
) -> Result<StatusCode, ApiError> {
    state.ops().delete(&caller.name, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn set_paused(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    paused: bool,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Schedule>, ApiError> {
    checked_name(name)?;
    let bytes = input::body_bytes(body)?;
    let value = Value::Object(input::json_object(&bytes)?);
    input::storable("note", &value)?;
    let request: PauseRequest = input::typed(value)?;
    let row = state
        .ops()
        .set_paused(&caller.name, name, paused, request.note.as_deref(), "")
        .await?;
    // Changed either way: a failed read-back only leaves the definition out.
    Ok(Json(row.as_ref().map_or_else(
        || Schedule {
            name: name.to_owned(),
            paused,
            ..Schedule::default()
        },
        view,
    )))
}

/// `POST /v1/schedules/{name}/pause` (`{"note"?}`): no more fires until
/// resumed; the note says why, until then.
#[utoipa::path(
    post, path = "/v1/schedules/{name}/pause", operation_id = "pauseSchedule",
    summary = "Stop firing until resumed",
    params(SchedulePath),
    request_body(content = PauseRequest, description = "Optional"),
    responses(
        (status = 200, description = "Paused", body = Schedule),
        (status = 404, description = "No such schedule", body = ErrorBody),
    ),
)]
pub async fn pause(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Schedule>, ApiError> {
    set_paused(&state, &caller, &name, true, body).await
}

/// `POST /v1/schedules/{name}/resume`: fires again; fires missed while
/// paused follow the schedule's misfire policy.
#[utoipa::path(
    post, path = "/v1/schedules/{name}/resume", operation_id = "resumeSchedule",
    summary = "Fire again; fires missed while paused follow the misfire policy",
    params(SchedulePath),
    request_body(content = PauseRequest, description = "Optional; the note goes to the audit log"),
    responses(
        (status = 200, description = "Resumed", body = Schedule),
        (status = 404, description = "No such schedule", body = ErrorBody),
    ),
)]
pub async fn resume(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Schedule>, ApiError> {
    set_paused(&state, &caller, &name, false, body).await
}

/// The API's answer to a trigger.
///
/// # Errors
///
/// 503 for a run whose stored status is not one of the API's, or an
/// outcome a trigger does not end with (the engine answers those as
/// errors).
pub(crate) fn triggered_view(t: &ops::Triggered) -> Result<Triggered, ApiError> {
    let label = t.outcome.label();
    let outcome = TriggerOutcome::from_wire(label).ok_or_else(|| {
        ApiError::unavailable(format!("the trigger ended as {label}; look the run up"))
    })?;
    Ok(Triggered {
        outcome,
        run_id: t.run_id,
        run_key: t.run.as_ref().map(|r| r.run_key.clone()),
        status: t
            .run
            .as_ref()
            .map(|r| run_status(&r.status_text))
            .transpose()?,
        trace_id: t.run.as_ref().and_then(|r| r.trace_id.clone()),
        message: t.note.clone(),
    })
}

/// `POST /v1/schedules/{name}/trigger` (`{"force": false}`): runs the
/// schedule now with its own run key. 409 when its overlap policy forbids
/// a run while the previous one is unfinished (`force: true` runs anyway).
#[utoipa::path(
    post, path = "/v1/schedules/{name}/trigger", operation_id = "triggerSchedule",
    summary = "Run now with its own run key (overlap policy applies unless forced)",
    params(SchedulePath),
    request_body(content = Option<TriggerRequest>),
    responses(
        (status = 202, description = "Run created", body = Triggered, links(
            ("GetRun" = (operation_id = "getRun", parameters(("id" = "$response.body#/run_id")))),
        )),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 409, description = "Overlap forbidden and previous run unfinished, or stored definition invalid", body = ErrorBody),
        (status = 422, description = "Invalid field", body = ErrorBody),
    ),
)]
pub async fn trigger(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Triggered>), ApiError> {
    checked_name(&name)?;
    let bytes = input::body_bytes(body)?;
    let request: TriggerRequest = input::typed(Value::Object(input::json_object(&bytes)?))?;
    let done = state
        .ops()
        .trigger(&caller.name, &name, request.force)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(triggered_view(&done)?)))
}

/// `POST /v1/schedules/{name}/backfill` (`{"from": ..., "to": ...}`): every
/// fire instant in `[from, to)` goes through the normal claim path, so
/// fires that already ran are not repeated. Works on paused schedules.
#[utoipa::path(
    post, path = "/v1/schedules/{name}/backfill", operation_id = "backfillSchedule",
    summary = "Fire every instant in [from, to) through the claim path; fires that already ran are not repeated",
    params(SchedulePath),
    request_body = BackfillRequest,
    responses(
        (status = 200, description = "What happened to each instant", body = Backfill),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 409, description = "Overlap forbidden for a multi-instant backfill without force, or stored definition invalid", body = ErrorBody),
        (status = 422, description = "Invalid range, or older than the run retention", body = ErrorBody),
    ),
)]
pub async fn backfill(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Backfill>, ApiError> {
    checked_name(&name)?;
    let bytes = input::body_bytes(body)?;
    let request: BackfillRequest = input::typed(Value::Object(input::json_object(&bytes)?))?;
    let done = run_backfill(&state, &caller, &name, &request).await?;
    Ok(Json(backfilled_view(&name, &done)))
}

/// Backfills `request`'s range of `name` on behalf of `caller` (the API's
/// and the web view's backfill).
///
/// # Errors
///
/// 422 for an instant that does not parse, and every error of
/// [`belfry_scheduler::Ops::backfill`].
pub(crate) async fn run_backfill(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    request: &BackfillRequest,
) -> Result<Backfilled, ApiError> {
    // The schedule first, as before the range: a missing schedule is a 404
    // whatever the range says.
    let row = state.ops().schedule(name).await?;
    let body_instant = |field: &str, raw: &str| {
        input::instant(field, raw).map_err(|e| ApiError::invalid(field, e.message))
    };
    let from = body_instant("from", &request.from)?;
    let to = body_instant("to", &request.to)?;
    Ok(state
        .ops()
        .backfill(&caller.name, &row, from, to, request.force)
        .await?)
}

/// The API's answer to a backfill.
pub(crate) fn backfilled_view(name: &str, done: &Backfilled) -> Backfill {
    let outcome = |o: ops::BackfillOutcome| match o {
        ops::BackfillOutcome::Dispatched => BackfillOutcome::Dispatched,
        ops::BackfillOutcome::AlreadyRan => BackfillOutcome::AlreadyRan,
        ops::BackfillOutcome::Skipped => BackfillOutcome::Skipped,
        ops::BackfillOutcome::NotConfirmed => BackfillOutcome::NotConfirmed,
        ops::BackfillOutcome::Unroutable => BackfillOutcome::Unroutable,
        ops::BackfillOutcome::Buffered => BackfillOutcome::Buffered,
        ops::BackfillOutcome::Failed => BackfillOutcome::Failed,
    };
    let mut counts = std::collections::BTreeMap::new();
    for (o, n) in done.counts() {
        counts.insert(outcome(o), n);
    }
    Backfill {
        schedule: name.to_owned(),
        from: done.from,
        to: done.to,
        instants: u32::try_from(done.fires.len()).unwrap_or(u32::MAX),
        counts,
        fires: done
            .fires
            .iter()
            .map(|(at, o)| BackfilledFire {
                scheduled_at: *at,
                outcome: outcome(*o),
            })
            .collect(),
    }
}

/// `GET /v1/schedules/{name}/preview?count=N`: the next N fire instants
/// (1 to 100, default 10), computed as the timer does.
#[utoipa::path(
    get, path = "/v1/schedules/{name}/preview", operation_id = "previewSchedule", summary = "Next fire instants",
    params(SchedulePath, PreviewQuery),
    responses(
        (status = 200, description = "Instants", body = Preview),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 409, description = "Stored definition invalid", body = ErrorBody),
    ),
)]
pub async fn preview(
    State(state): State<ApiState>,
    PathParam(name): PathParam,
    RawQuery(query): RawQuery,
) -> Result<Json<Preview>, ApiError> {
    let q = QueryParams::parse(query.as_deref(), &["count"])?;
    let count = q.number("count", 10, 1, MAX_PREVIEW)?;
    let (row, next) = state.ops().preview(&name, count as usize).await?;
    Ok(Json(Preview {
        schedule: name,
        paused: row.paused,
        next,
    }))
}
