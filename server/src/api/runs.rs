//! `/v1/runs`: the run list with filters and cursor pagination, and one
//! run's detail (attempts, errors, timings, replica, worker, trace id).
//!
//! The cursor is opaque to callers: `{scheduled_at in µs}.{id}` of the last
//! run of the page, continuing in the ledger's keyset order.

use axum::extract::{RawQuery, State};
use axum::Json;
use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

use belfry_ledger::{RunCursor, RunFilter, RunRecord, RunStatus};

use super::error::ApiError;
use super::input::{PathParam, QueryParams};
use super::ApiState;

/// Largest page of the run list.
pub const MAX_PAGE: u32 = 500;

/// A run as the API shows it.
#[derive(Debug, Serialize)]
pub struct RunView {
    /// Row id (= message id).
    pub id: Uuid,
    /// Schedule or ad-hoc job name.
    pub job_name: String,
    /// Run key.
    pub run_key: String,
    /// Job type.
    pub job_type: String,
    /// Status.
    pub status: String,
    /// How the run came to be: `schedule` (the timer or misfire recovery),
    /// `backfill`, `manual` (trigger) or `adhoc`.
    pub origin: &'static str,
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
    /// Payload (detail only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// Retry/timeout overrides (detail only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Value>,
    /// Finished attempts with their errors and timings (detail only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_log: Option<Value>,
}

impl RunView {
    /// The summary of `run` (no payload, options or attempt log).
    pub fn summary(run: &RunRecord) -> Self {
        let claimed_by = run.claimed_by.clone();
        let origin = match claimed_by.as_deref() {
            Some(c) if c.starts_with("manual:") => "manual",
            Some(c) if c.starts_with("backfill:") => "backfill",
            Some(c) if c.starts_with("client:") => "adhoc",
            None => "adhoc",
            Some(_) => "schedule",
        };
        Self {
            id: run.id,
            job_name: run.job_name.clone(),
            run_key: run.run_key.clone(),
            job_type: run.job_type.clone(),
            status: run.status_text.clone(),
            origin,
            scheduled_at: run.scheduled_at,
            claimed_at: run.claimed_at,
            dispatched_at: run.dispatched_at,
            started_at: run.started_at,
            finished_at: run.finished_at,
            lateness_ms: run
                .dispatched_at
                .map(|d| (d - run.scheduled_at).num_milliseconds()),
            attempts: run.attempts,
            claimed_by,
            worker: run.worker.clone(),
            last_error: run.last_error.clone(),
            trace_id: run.trace_id.clone(),
            payload: None,
            options: None,
            attempt_log: None,
        }
    }

    /// Everything about `run`.
    pub fn detail(run: &RunRecord) -> Self {
        Self {
            payload: Some(run.payload.clone()),
            options: Some(run.options.clone()),
            attempt_log: Some(run.attempt_log.clone()),
            ..Self::summary(run)
        }
    }
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
                    s.trim().parse::<RunStatus>().map_err(|_| {
                        ApiError::bad_request(format!(
                            "status {s:?} is not a run status; use one or more (comma-separated) of {}",
                            RunStatus::ALL.map(|s| s.as_str()).join(", ")
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
pub async fn list(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
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
    Ok(Json(json!({
        "runs": runs.iter().map(RunView::summary).collect::<Vec<_>>(),
        "next_cursor": next_cursor,
    })))
}

/// `GET /v1/runs/{id}`.
pub async fn get_one(
    State(state): State<ApiState>,
    PathParam(id): PathParam,
) -> Result<Json<RunView>, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| {
        ApiError::bad_request(format!("{id:?} is not a run id (a UUID)")).field("id")
    })?;
    let run = state
        .ledger()
        .run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run with id {id}")))?;
    Ok(Json(RunView::detail(&run)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
