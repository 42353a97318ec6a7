//! `/v1/runs`: the run list with filters and cursor pagination, one run's
//! detail (attempts, errors, timings, replica, worker, trace id), and
//! cancelling a run.
//!
//! The cursor is opaque to callers: `{scheduled_at in µs}.{id}` of the last
//! run of the page, continuing in the ledger's keyset order.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{TimeZone, Utc};
use uuid::Uuid;

use belfry_api_types::{
    Attempt, CancelAnswer, CancelResult, CancelRun, ErrorBody, Origin, Run, RunDetail, RunLink,
    RunList, RunPath, RunQuery, RunStatus, MAX_PAGE,
};
use belfry_ledger::{RunCursor, RunFilter, RunRecord};
use belfry_scheduler::cancel::Cancelled;

use super::error::ApiError;
use super::input::{self, PathParam, QueryParams};
use super::{ApiState, Caller};

/// The API's status of a stored status text.
///
/// # Errors
///
/// 503 for a text that is not a run status (a row edited by hand).
pub(crate) fn run_status(text: &str) -> Result<RunStatus, ApiError> {
    RunStatus::from_wire(text).ok_or_else(|| {
        ApiError::unavailable(format!("a stored run has the unknown status {text:?}"))
    })
}

/// The summary of `run` (no payload, options or attempt log): the API's
/// and the web view's.
///
/// # Errors
///
/// As [`run_status`].
pub fn summary(run: &RunRecord) -> Result<Run, ApiError> {
    Ok(Run {
        id: run.id,
        job_name: run.job_name.clone(),
        run_key: run.run_key.clone(),
        job_type: run.job_type.clone(),
        status: run_status(&run.status_text)?,
        origin: Origin::of_claimer(run.claimed_by.as_deref()),
        scheduled_at: run.scheduled_at,
        claimed_at: run.claimed_at,
        dispatched_at: run.dispatched_at,
        started_at: run.started_at,
        finished_at: run.finished_at,
        lateness_ms: run
            .dispatched_at
            .map(|d| (d - run.scheduled_at).num_milliseconds()),
        attempts: run.attempts,
        claimed_by: run.claimed_by.clone(),
        worker: run.worker.clone(),
        last_error: run.last_error.clone(),
        trace_id: run.trace_id.clone(),
        cancel_requested_at: run.cancel_requested_at,
    })
}

/// Everything about `run`. An attempt log that does not read is shown
/// empty (and logged): the run itself stays readable.
///
/// # Errors
///
/// As [`run_status`].
pub fn detail(run: &RunRecord) -> Result<RunDetail, ApiError> {
    let attempts = run.attempt_entries().unwrap_or_else(|e| {
        tracing::warn!(run = %run.id, error = %e, "unreadable attempt log");
        Vec::new()
    });
    Ok(RunDetail {
        run: summary(run)?,
        payload: run.payload.clone(),
        options: run.options.clone(),
        attempt_log: attempts
            .into_iter()
            .map(|a| Attempt {
                attempt: a.attempt,
                worker: a.worker,
                started_at: a.started_at,
                finished_at: a.finished_at,
                outcome: a.outcome,
                error: a.error,
                result: a.result,
            })
            .collect(),
        parents: Vec::new(),
        children: Vec::new(),
    })
}

/// A link to `run`.
fn link(run: &RunRecord) -> Result<RunLink, ApiError> {
    Ok(RunLink {
        id: run.id,
        job_name: run.job_name.clone(),
        run_key: run.run_key.clone(),
        status: Some(run_status(&run.status_text)?),
    })
}

/// [`detail`] with the run's lineage: the parents that enqueued it (from
/// its options) and the follow-ups enqueued from its lists so far (looked
/// up by their derived run keys), each with its status now.
///
/// # Errors
///
/// As [`detail`]; [`ApiError`] from the ledger when a lookup fails.
pub async fn detail_with_lineage(
    ledger: &belfry_ledger::Ledger,
    run: &RunRecord,
) -> Result<RunDetail, ApiError> {
    let mut out = detail(run)?;
    // Options that do not read show no lineage (the run itself still
    // shows), and neither does a lookup that fails: the lineage is an aid,
    // the run's own page must not depend on it.
    let options: belfry_protocol::JobOptions =
        serde_json::from_value(run.options.clone()).unwrap_or_default();
    let look = |r: Result<Option<RunRecord>, belfry_ledger::LedgerError>| match r {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(run = %run.id, error = %e, "cannot read a related run; its link is left out");
            None
        }
    };
    // At most the parent and the runs it waited for (checked when the run
    // was received); each shown as the ledger has it, not as the options
    // say.
    for p in options
        .parents
        .iter()
        .take(belfry_protocol::follow_up::MAX_AFTER + 1)
    {
        if let Some(found) = look(ledger.run(p.id).await) {
            out.parents.push(link(&found)?);
        }
    }
    for (_, list) in options.follow_ups.lists() {
        for f in list {
            let Some(key) = f.child_run_key(&run.job_name, &run.run_key) else {
                continue;
            };
            if out.children.iter().any(|c| c.run_key == key) {
                continue;
            }
            if let Some(child) = look(ledger.run_by_key(&f.job_name, &key).await) {
                out.children.push(link(&child)?);
            }
        }
    }
    Ok(out)
}

/// The opaque cursor that continues after `c`.
pub(crate) fn encode_cursor(c: RunCursor) -> String {
    format!("{}.{}", c.scheduled_at.timestamp_micros(), c.id.simple())
}

/// A cursor [`encode_cursor`] made.
///
/// # Errors
///
/// 400 naming `cursor` for anything else.
pub(crate) fn decode_cursor(raw: &str) -> Result<RunCursor, ApiError> {
    let bad = || {
        ApiError::bad_request("cursor is not one this API returned; pass next_cursor unchanged")
            .field("cursor")
    };
    let (micros, id) = raw.split_once('.').ok_or_else(bad)?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    // Years 1 to 9999: what a run's scheduled_at can be, and safely inside
    // what Postgres compares.
    if !(-62_135_596_800_000_000..=253_402_300_799_999_999).contains(&micros) {
        return Err(bad());
    }
    let scheduled_at = Utc.timestamp_micros(micros).single().ok_or_else(bad)?;
    let id = Uuid::parse_str(id).map_err(|_| bad())?;
    Ok(RunCursor { scheduled_at, id })
}

/// The run filter of a query string (`schedule`, `job_type`, `status` as a
/// comma-separated list, `from`, `to`): the API's and the web view's.
///
/// # Errors
///
/// 400 naming the parameter that does not parse.
pub(crate) fn run_filter(q: &QueryParams) -> Result<RunFilter, ApiError> {
    let statuses = q
        .text("status")
        .map(|raw| {
            raw.split(',')
                .map(|s| {
                    s.trim().parse::<belfry_ledger::RunStatus>().map_err(|_| {
                        ApiError::bad_request(format!(
                            "status {s:?} is not a run status; use one or more (comma-separated) of {}",
                            belfry_ledger::RunStatus::ALL.map(|s| s.as_str()).join(", ")
                        ))
                        .field("status")
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    Ok(RunFilter {
        job_name: q.text("schedule").map(str::to_owned),
        job_type: q.text("job_type").map(str::to_owned),
        statuses,
        from: q.instant("from")?,
        to: q.instant("to")?,
    })
}

/// `GET /v1/runs?schedule=&job_type=&status=a,b&from=&to=&limit=&cursor=`:
/// newest fire first; `from`/`to` bound `scheduled_at` as `[from, to)`.
#[utoipa::path(
    get, path = "/v1/runs", operation_id = "listRuns",
    summary = "Runs, newest fire first, with filters and cursor pagination",
    params(RunQuery),
    responses((status = 200, description = "A page", body = RunList)),
)]
pub async fn list(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Result<Json<RunList>, ApiError> {
    let q = QueryParams::parse(
        query.as_deref(),
        &[
            "schedule", "job_type", "status", "from", "to", "limit", "cursor",
        ],
    )?;
    let filter = run_filter(&q)?;
    let limit = q.number("limit", 50, 1, MAX_PAGE)?;
    let cursor = q.text("cursor").map(decode_cursor).transpose()?;
    let mut runs = state
        .ledger()
        .list_runs(&filter, cursor, i64::from(limit) + 1)
        .await?;
    let more = runs.len() > limit as usize;
    runs.truncate(limit as usize);
    let next_cursor = more
        .then(|| runs.last().map(|r| encode_cursor(RunCursor::after(r))))
        .flatten();
    Ok(Json(RunList {
        runs: runs.iter().map(summary).collect::<Result<_, _>>()?,
        next_cursor,
    }))
}

/// `GET /v1/runs/{id}`.
#[utoipa::path(
    get, path = "/v1/runs/{id}", operation_id = "getRun",
    summary = "One run with attempts, errors, timings, replica, worker, trace id",
    params(RunPath),
    responses(
        (status = 200, description = "The run", body = RunDetail),
        (status = 404, description = "No such run", body = ErrorBody),
    ),
)]
pub async fn get_one(
    State(state): State<ApiState>,
    PathParam(id): PathParam,
) -> Result<Json<RunDetail>, ApiError> {
    let id = run_id(&id)?;
    let run = state
        .ledger()
        .run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run with id {id}")))?;
    Ok(Json(detail_with_lineage(state.ledger(), &run).await?))
}

/// A run id of a path.
///
/// # Errors
///
/// 400 naming `id` when it is not a UUID.
pub(crate) fn run_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw)
        .map_err(|_| ApiError::bad_request(format!("{raw:?} is not a run id (a UUID)")).field("id"))
}

/// The answer for a cancel that was made.
///
/// # Errors
///
/// As [`run_status`].
pub(crate) fn cancel_answer(
    id: Uuid,
    done: &belfry_scheduler::cancel::CancelDone,
) -> Result<CancelAnswer, ApiError> {
    let (result, fallback) = match done.cancelled {
        Cancelled::Now { .. } => (CancelResult::Cancelled, RunStatus::Cancelled),
        Cancelled::Requested => (CancelResult::CancelRequested, RunStatus::Running),
    };
    Ok(CancelAnswer {
        run_id: id,
        result,
        status: match &done.run {
            Some(r) => run_status(&r.status_text)?,
            None => fallback,
        },
    })
}

/// `POST /v1/runs/{id}/cancel` (`{"reason"?}`): a waiting run is cancelled
/// at once (200); a running one is stopped on its worker (202: the worker
/// fires the handler's cancellation token and ends the run `cancelled`
/// within `BELFRY_CANCEL_GRACE`). A finished run is a 409.
#[utoipa::path(
    post, path = "/v1/runs/{id}/cancel", operation_id = "cancelRun",
    summary = "Cancel a run: a waiting run never executes; a running one is stopped on its worker",
    params(RunPath),
    request_body(content = CancelRun, description = "Optional"),
    responses(
        (status = 200, description = "Cancelled (it was waiting for a worker)", body = CancelAnswer),
        (status = 202, description = "Cancel requested: its worker is stopping it", body = CancelAnswer),
        (status = 404, description = "No such run", body = ErrorBody),
        (status = 409, description = "The run has already finished", body = ErrorBody),
    ),
)]
pub async fn cancel(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(id): PathParam,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<CancelAnswer>), ApiError> {
    let id = run_id(&id)?;
    let bytes = input::body_bytes(body)?;
    let value = serde_json::Value::Object(input::json_object(&bytes)?);
    input::storable("reason", &value)?;
    let request: CancelRun = input::typed(value)?;
    let done = state
        .ops()
        .cancel_run(&caller.name, id, request.reason.as_deref(), "")
        .await?;
    let code = match done.cancelled {
        Cancelled::Now { .. } => StatusCode::OK,
        Cancelled::Requested => StatusCode::ACCEPTED,
    };
    Ok((code, Json(cancel_answer(id, &done)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_and_the_ledger_agree_on_which_statuses_are_terminal() {
        for st in belfry_ledger::RunStatus::ALL {
            let api = run_status(st.as_str()).unwrap_or_else(|e| panic!("{st}: {e:?}"));
            assert_eq!(api.is_terminal(), st.is_terminal(), "{st}");
        }
    }

    #[test]
    fn cursors_round_trip_and_refuse_garbage() {
        let c = RunCursor {
            scheduled_at: Utc
                .timestamp_micros(1_780_000_000_123_456)
                .single()
                .unwrap(),
            id: Uuid::now_v7(),
        };
        assert_eq!(decode_cursor(&encode_cursor(c)).unwrap(), c);
        for bad in [
            "",
            "abc",
            "1.2",
            "x.0190a3e2-0000-7000-8000-000000000000",
            "99999999999999999999.00",
        ] {
            let e = decode_cursor(bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("cursor"), "{bad}");
        }
    }
}
