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
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use belfry_ledger::ScheduleRow;
use belfry_protocol::{validate_name, ScheduleSpec};

use belfry_scheduler::ops::{Backfilled, OpsError, Triggered};
use belfry_scheduler::schedule_sync::spec_of_row;

use super::error::ApiError;
use super::input::{self, PathParam, QueryParams};
use super::{ApiState, Caller};
/// Most instants a preview returns.
pub const MAX_PREVIEW: u32 = 100;
/// Largest page of the schedule list.
pub const MAX_PAGE: u32 = 500;

/// A schedule as the API shows it: the definition plus its state.
pub fn view(row: &ScheduleRow) -> Value {
    let mut obj = match spec_of_row(row).map(serde_json::to_value) {
        Ok(Ok(Value::Object(map))) => map,
        Ok(_) => serde_json::Map::new(),
        Err(message) => {
            // Edited by hand into something unreadable: show what is there
            // and say why it does not fire.
            let mut map = serde_json::Map::new();
            map.insert("name".into(), json!(row.name));
            map.insert("invalid".into(), json!(message.to_string()));
            map
        }
    };
    obj.insert("paused".into(), json!(row.paused));
    obj.insert("updated_at".into(), json!(row.updated_at));
    Value::Object(obj)
}

pub(crate) fn checked_name(name: &str) -> Result<(), ApiError> {
    validate_name("schedule name", name)
        .map_err(|e| ApiError::bad_request(e.to_string()).field("name"))
}

/// Reads a schedule body: the definition and an optional `paused`.
fn schedule_input(
    bytes: &[u8],
    path_name: Option<&str>,
) -> Result<(ScheduleSpec, Option<bool>), ApiError> {
    let mut map = input::json_object(bytes)?;
    let paused = match map.remove("paused") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(b),
        Some(_) => return Err(ApiError::invalid("paused", "paused must be true or false")),
    };
    // Read-only; accepted so a fetched schedule can be sent back as is.
    map.remove("updated_at");
    map.remove("invalid");
    if let Some(name) = path_name {
        match map.get("name") {
            None => {
                map.insert("name".into(), json!(name));
            }
            Some(Value::String(given)) if given == name => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    "name",
                    format!(
                        "the body's name must be {name:?}, as in the path; to rename, create the \
                         new schedule and delete the old one"
                    ),
                ))
            }
        }
    }
    let value = Value::Object(map);
    input::storable("payload", &value)?;
    Ok((input::typed(value)?, paused))
}

/// `GET /v1/schedules?limit=&cursor=`: schedules by name, a page at a time;
/// `next_cursor` continues.
pub async fn list(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
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
    Ok(Json(json!({
        "schedules": page.iter().map(view).collect::<Vec<_>>(),
        "next_cursor": if more { page.last().map(|r| r.name.clone()) } else { None },
    })))
}

/// `POST /v1/schedules`: creates a schedule (409 when the name is taken).
pub async fn create(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = input::body_bytes(body)?;
    let (spec, paused) = schedule_input(&bytes, None)?;
    let row = state
        .ops()
        .create(&caller.name, &spec, paused.unwrap_or(false))
        .await?;
    Ok((StatusCode::CREATED, Json(view(&row))).into_response())
}

/// `GET /v1/schedules/{name}`.
pub async fn get_one(
    State(state): State<ApiState>,
    PathParam(name): PathParam,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(view(&state.ops().schedule(&name).await?)))
}

/// `PUT /v1/schedules/{name}`: replaces the definition of an existing
/// schedule (404 when there is none; create with `POST`).
pub async fn replace(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
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
) -> Result<Json<Value>, ApiError> {
    let row = state
        .ops()
        .set_paused(&caller.name, name, paused, "")
        .await?;
    Ok(Json(row.as_ref().map_or_else(
        || json!({ "name": name, "paused": paused }),
        view,
    )))
}

/// `POST /v1/schedules/{name}/pause`: no more fires until resumed.
pub async fn pause(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
) -> Result<Json<Value>, ApiError> {
    set_paused(&state, &caller, &name, true).await
}

/// `POST /v1/schedules/{name}/resume`: fires again; fires missed while
/// paused follow the schedule's misfire policy.
pub async fn resume(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
) -> Result<Json<Value>, ApiError> {
    set_paused(&state, &caller, &name, false).await
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TriggerRequest {
    #[serde(default)]
    force: bool,
}

/// The API's answer to a trigger.
pub(crate) fn triggered_view(t: &Triggered) -> Value {
    json!({
        "outcome": t.outcome.label(),
        "run_id": t.run_id,
        "run_key": t.run.as_ref().map(|r| r.run_key.clone()),
        "status": t.run.as_ref().map(|r| r.status_text.clone()),
        "trace_id": t.run.as_ref().and_then(|r| r.trace_id.clone()),
        "message": t.note,
    })
}

/// `POST /v1/schedules/{name}/trigger` (`{"force": false}`): runs the
/// schedule now with its own run key. 409 when its overlap policy forbids
/// a run while the previous one is unfinished (`force: true` runs anyway).
pub async fn trigger(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    checked_name(&name)?;
    let bytes = input::body_bytes(body)?;
    let request: TriggerRequest = input::typed(Value::Object(input::json_object(&bytes)?))?;
    let done = state
        .ops()
        .trigger(&caller.name, &name, request.force)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(triggered_view(&done))).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillRequest {
    from: String,
    to: String,
    #[serde(default)]
    force: bool,
}

/// `POST /v1/schedules/{name}/backfill` (`{"from": ..., "to": ...}`): every
/// fire instant in `[from, to)` goes through the normal claim path, so
/// fires that already ran are not repeated. Works on paused schedules.
pub async fn backfill(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    checked_name(&name)?;
    let bytes = input::body_bytes(body)?;
    let request: BackfillRequest = input::typed(Value::Object(input::json_object(&bytes)?))?;
    let done = run_backfill(
        &state,
        &caller,
        &name,
        &request.from,
        &request.to,
        request.force,
    )
    .await?;
    Ok(Json(backfilled_view(&name, &done)))
}

/// Backfills `[from, to)` of `name` on behalf of `caller` from the
/// request's texts (the API's and the web view's backfill).
///
/// # Errors
///
/// 422 for an instant that does not parse, and every error of
/// [`belfry_scheduler::Ops::backfill`].
pub(crate) async fn run_backfill(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    from: &str,
    to: &str,
    force: bool,
) -> Result<Backfilled, ApiError> {
    // The schedule first, as before the range: a missing schedule is a 404
    // whatever the range says.
    let row = state.ops().schedule(name).await?;
    let body_instant = |field: &str, raw: &str| {
        input::instant(field, raw).map_err(|e| ApiError::invalid(field, e.message))
    };
    let from = body_instant("from", from)?;
    let to = body_instant("to", to)?;
    Ok(state
        .ops()
        .backfill(&caller.name, &row, from, to, force)
        .await?)
}

/// The API's answer to a backfill.
pub(crate) fn backfilled_view(name: &str, done: &Backfilled) -> Value {
    let counts: std::collections::BTreeMap<&str, u64> = done
        .counts()
        .into_iter()
        .map(|(outcome, n)| (outcome.label(), n))
        .collect();
    let fires: Vec<Value> = done
        .fires
        .iter()
        .map(|(at, outcome)| json!({ "scheduled_at": at, "outcome": outcome.label() }))
        .collect();
    json!({
        "schedule": name,
        "from": done.from,
        "to": done.to,
        "instants": done.fires.len(),
        // dispatched, already_ran, skipped (overlap), not_confirmed (the
        // outbox publishes it), unroutable (no worker group: dead), failed
        // (not claimed: the ledger was unreachable; backfill again).
        "counts": counts,
        "fires": fires,
    })
}

/// `GET /v1/schedules/{name}/preview?count=N`: the next N fire instants
/// (1 to 100, default 10), computed as the timer does.
pub async fn preview(
    State(state): State<ApiState>,
    PathParam(name): PathParam,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = QueryParams::parse(query.as_deref(), &["count"])?;
    let count = q.number("count", 10, 1, MAX_PREVIEW)?;
    let (row, next) = state.ops().preview(&name, count as usize).await?;
    Ok(Json(json!({
        "schedule": name,
        "paused": row.paused,
        "next": next,
    })))
}
