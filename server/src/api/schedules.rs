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
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use belfry_ledger::ScheduleRow;
use belfry_protocol::{validate_name, ScheduleSpec};

use super::error::ApiError;
use super::input::{self, PathParam, QueryParams};
use super::{audit, ApiState, Caller};
use belfry_scheduler::replica::FireOutcome;
use belfry_scheduler::schedule::Schedule;
use belfry_scheduler::schedule_sync::{schedule_of_row, spec_of_row};

/// Most fire instants one backfill request may cover.
pub const MAX_BACKFILL: usize = 10_000;
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
            map.insert("invalid".into(), json!(message));
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

/// The stored schedule `name`.
///
/// # Errors
///
/// 400 for a name outside the naming rule, 404 when there is none, 503
/// when the ledger cannot answer.
pub(crate) async fn stored(state: &ApiState, name: &str) -> Result<ScheduleRow, ApiError> {
    checked_name(name)?;
    state
        .ledger()
        .schedule(name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no schedule named {name:?}")))
}

/// The schedule as stored after a change; if it cannot be read back, what
/// was written (`written`): the change is made, so the answer must not be
/// an error inviting a retry.
async fn reread(state: &ApiState, name: &str, written: Value) -> Value {
    match state.ledger().schedule(name).await {
        Ok(Some(row)) => view(&row),
        Ok(None) | Err(_) => written,
    }
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
    let mut row = Schedule::storable_row(&spec, Utc::now(), true)?;
    row.paused = paused.unwrap_or(false);
    if !state.ledger().insert_schedule(&row).await? {
        return Err(ApiError::conflict(format!(
            "a schedule named {:?} exists; replace it with PUT /v1/schedules/{}",
            spec.name, spec.name
        ))
        .field("name"));
    }
    audit(
        &caller,
        "schedule.create",
        &spec.name,
        if row.paused { "paused" } else { "" },
    );
    Ok((
        StatusCode::CREATED,
        Json(reread(&state, &spec.name, view(&row)).await),
    )
        .into_response())
}

/// `GET /v1/schedules/{name}`.
pub async fn get_one(
    State(state): State<ApiState>,
    PathParam(name): PathParam,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(view(&stored(&state, &name).await?)))
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
    let current = state.ledger().schedule(&name).await?.ok_or_else(|| {
        ApiError::not_found(format!(
            "no schedule named {name:?}; create it with POST /v1/schedules"
        ))
    })?;
    // A one-shot whose instant passed (it fired) can still be edited; only
    // a new instant must be ahead.
    let moved = spec.after.is_some() || spec_of_row(&current).map_or(true, |old| old.at != spec.at);
    let row = Schedule::storable_row(&spec, Utc::now(), moved)?;
    if !state.ledger().replace_schedule(&row, paused).await? {
        return Err(ApiError::not_found(format!(
            "no schedule named {name:?}; create it with POST /v1/schedules"
        )));
    }
    audit(&caller, "schedule.replace", &name, "");
    let mut written = row;
    written.paused = paused.unwrap_or(current.paused);
    Ok(Json(reread(&state, &name, view(&written)).await))
}

/// `DELETE /v1/schedules/{name}`: its runs stay in `job_runs`.
pub async fn delete(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
) -> Result<StatusCode, ApiError> {
    checked_name(&name)?;
    if !state.ledger().delete_schedule(&name).await? {
        return Err(ApiError::not_found(format!("no schedule named {name:?}")));
    }
    audit(&caller, "schedule.delete", &name, "");
    Ok(StatusCode::NO_CONTENT)
}

async fn set_paused(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    paused: bool,
) -> Result<Json<Value>, ApiError> {
    run_set_paused(state, caller, name, paused, "").await?;
    Ok(Json(
        reread(state, name, json!({ "name": name, "paused": paused })).await,
    ))
}

/// Pauses or resumes `name` on behalf of `caller` (the API's and the web
/// view's), with its audit line.
///
/// # Errors
///
/// 400 bad name, 404 no such schedule, 503 the ledger cannot answer.
pub(crate) async fn run_set_paused(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    paused: bool,
    detail: &str,
) -> Result<(), ApiError> {
    checked_name(name)?;
    if !state.ledger().set_paused(name, paused).await? {
        return Err(ApiError::not_found(format!("no schedule named {name:?}")));
    }
    audit(
        caller,
        if paused {
            "schedule.pause"
        } else {
            "schedule.resume"
        },
        name,
        detail,
    );
    Ok(())
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

fn compiled(row: &ScheduleRow) -> Result<Schedule, ApiError> {
    schedule_of_row(row, &mut belfry_scheduler::zoned_cron::CronCache::default()).map_err(
        |message| {
            ApiError::conflict(format!(
                "the stored definition of {:?} is not valid ({message}); fix it with PUT first",
                row.name
            ))
        },
    )
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TriggerRequest {
    #[serde(default)]
    force: bool,
}

/// What a trigger did.
#[derive(Serialize)]
pub(crate) struct Triggered {
    pub(crate) outcome: &'static str,
    pub(crate) run_id: uuid::Uuid,
    pub(crate) run_key: Option<String>,
    pub(crate) status: Option<String>,
    pub(crate) trace_id: Option<String>,
    pub(crate) message: Option<String>,
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
    let body = run_trigger(&state, &caller, &name, request.force).await?;
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// Triggers `name` now on behalf of `caller` (the API's and the web view's
/// "run now").
///
/// # Errors
///
/// 404 no such schedule, 409 overlap forbids it (or the stored definition
/// is invalid), 503 the run could not be claimed.
pub(crate) async fn run_trigger(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    force: bool,
) -> Result<Triggered, ApiError> {
    let row = stored(state, name).await?;
    let schedule = compiled(&row)?;
    let outcome = state.replica().trigger(&schedule, force).await;
    let (id, message) = match &outcome {
        FireOutcome::Dispatched { id } => (*id, None),
        FireOutcome::Unroutable { id } => (
            *id,
            Some(format!("no worker group serves job type {:?}; the run is dead", schedule.job_type)),
        ),
        FireOutcome::NotConfirmed { id, reason } => (
            *id,
            Some(format!("not yet confirmed by the broker ({reason}); the outbox publishes it")),
        ),
        FireOutcome::Skipped { reason } if reason.starts_with("overlap") => {
            return Err(ApiError::conflict(format!(
                "{name:?} forbids overlap and its previous run is not finished; send {{\"force\": true}} to run anyway"
            )))
        }
        FireOutcome::Skipped { reason } | FireOutcome::ClaimFailed { reason } => {
            return Err(ApiError::unavailable(format!("the run could not be claimed: {reason}; retry")))
        }
        FireOutcome::Lost => return Err(ApiError::unavailable("the run could not be claimed; retry")),
    };
    audit(
        caller,
        "schedule.trigger",
        name,
        &format!("run {id}{}", if force { " (forced)" } else { "" }),
    );
    // The run exists either way: a failed read-back only leaves fields empty.
    let run = state.ledger().run(id).await.ok().flatten();
    Ok(Triggered {
        outcome: outcome.label(),
        run_id: id,
        run_key: run.as_ref().map(|r| r.run_key.clone()),
        status: run.as_ref().map(|r| r.status_text.clone()),
        trace_id: run.and_then(|r| r.trace_id),
        message,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillRequest {
    from: String,
    to: String,
    #[serde(default)]
    force: bool,
}

/// The fire instants of `schedule` in `[from, to)`.
///
/// # Errors
///
/// 422 when there are more than [`MAX_BACKFILL`].
pub fn instants_between(
    schedule: &Schedule,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<DateTime<Utc>>, ApiError> {
    let mut out = Vec::new();
    // `next_after` is strict: start a second early so `from` itself counts.
    let mut t = from - Duration::seconds(1);
    while let Some(next) = schedule.next_after(t).filter(|n| *n < to) {
        if next >= from {
            if out.len() == MAX_BACKFILL {
                return Err(ApiError::invalid(
                    "to",
                    format!(
                        "the range holds more than {MAX_BACKFILL} fire instants; backfill it in smaller ranges"
                    ),
                ));
            }
            out.push(next);
        }
        t = next;
    }
    Ok(out)
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
    Ok(Json(
        run_backfill(
            &state,
            &caller,
            &name,
            &request.from,
            &request.to,
            request.force,
        )
        .await?,
    ))
}

/// Backfills `[from, to)` of `name` on behalf of `caller` (the API's and
/// the web view's backfill), with every check of the API.
///
/// # Errors
///
/// 404 no such schedule, 409 overlap without force, 422 a bad range.
pub(crate) async fn run_backfill(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    from: &str,
    to: &str,
    force: bool,
) -> Result<Value, ApiError> {
    let row = stored(state, name).await?;
    let body_instant = |field: &str, raw: &str| {
        input::instant(field, raw).map_err(|e| ApiError::invalid(field, e.message))
    };
    let from = body_instant("from", from)?;
    let to = body_instant("to", to)?;
    if from >= to {
        return Err(ApiError::invalid(
            "to",
            "to must be after from; the range is [from, to)",
        ));
    }
    let now = Utc::now();
    if to > now {
        return Err(ApiError::invalid(
            "to",
            format!("to ({to}) is in the future; backfill covers past fires, later ones run on schedule"),
        ));
    }
    if let Some(keep) = state.retention() {
        let horizon = chrono::Duration::from_std(keep)
            .ok()
            .and_then(|keep| now.checked_sub_signed(keep));
        if horizon.is_some_and(|h| from < h) {
            return Err(ApiError::invalid(
                "from",
                format!(
                    "from ({from}) is older than the run retention ({}): runs there may have been \
                     pruned, so fires that ran would run again",
                    humantime::format_duration(keep)
                ),
            ));
        }
    }
    let schedule = std::sync::Arc::new(compiled(&row)?);
    let instants = instants_between(&schedule, from, to)?;
    let total = instants.len();
    if schedule.overlap == belfry_scheduler::schedule::OverlapPolicy::Forbid
        && instants.len() > 1
        && !force
    {
        return Err(ApiError::conflict(format!(
            "{name:?} forbids overlap, and a backfill of {} instants would run them side by side; \
             send \"force\": true to run them anyway, or backfill one instant at a time",
            instants.len()
        )));
    }
    audit(
        caller,
        "schedule.backfill",
        name,
        &format!(
            "[{from}, {to}): {} instants{}",
            instants.len(),
            if force { " (forced)" } else { "" }
        ),
    );
    // Its own task: a client that disconnects does not cut a backfill off
    // halfway (what it claimed would stay claimed for the outbox anyway).
    let replica = state.replica().clone();
    let outcomes = tokio::spawn(async move { replica.backfill(&schedule, &instants, force).await })
        .await
        .map_err(|e| ApiError::unavailable(format!("the backfill stopped: {e}")))?;
    let mut counts = std::collections::BTreeMap::<&str, u64>::new();
    let fires: Vec<Value> = outcomes
        .iter()
        .map(|(at, outcome)| {
            let label = match outcome {
                FireOutcome::Lost => "already_ran",
                FireOutcome::ClaimFailed { .. } => "failed",
                other => other.label(),
            };
            *counts.entry(label).or_default() += 1;
            json!({ "scheduled_at": at, "outcome": label })
        })
        .collect();
    Ok(json!({
        "schedule": name,
        "from": from,
        "to": to,
        "instants": total,
        // dispatched, already_ran, skipped (overlap), not_confirmed (the
        // outbox publishes it), unroutable (no worker group: dead), failed
        // (not claimed: the ledger was unreachable; backfill again).
        "counts": counts,
        "fires": fires,
    }))
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
    let row = stored(&state, &name).await?;
    let schedule = compiled(&row)?;
    let next = schedule.upcoming(Utc::now(), count as usize);
    Ok(Json(json!({
        "schedule": name,
        "paused": row.paused,
        "next": next,
    })))
}
