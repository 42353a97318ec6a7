//! `/v1/runs/{id}/logs`: a run's stored log (issue 23), a page at a time
//! after a cursor, and the same as a stream of server-sent events that
//! tails it while the run is running.
//!
//! The cursor is `ATTEMPT.SEQ` of the last line seen
//! (`belfry_ledger::LogCursor`). The stream reads the ledger every
//! [`TAIL_EVERY`] after its cursor, sends each line as an event whose id is
//! the line's cursor (a browser's `EventSource` reconnects with
//! `Last-Event-ID` and misses nothing), and ends with an `end` event once
//! the run is final and nothing more is stored.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use futures::Stream;
use uuid::Uuid;

use belfry_api_types::{
    ErrorBody, LogLine, LogLineKind, RunLogPage, RunLogQuery, RunPath, RunStatus, MAX_LOG_PAGE,
};
use belfry_ledger::{LogCursor, LogKind, RunLogLine};

use super::error::ApiError;
use super::input::{PathParam, QueryParams};
use super::runs::{run_id, run_status};
use super::ApiState;

/// How often a stream looks for new lines.
pub const TAIL_EVERY: Duration = Duration::from_millis(250);

/// Log streams one API process serves at once (each reads the ledger
/// every [`TAIL_EVERY`]: 256 streams are about 1,000 small reads a
/// second); a stream past it is refused with 503, and the page form
/// (`GET /v1/runs/{id}/logs`) still answers.
pub const MAX_LOG_STREAMS: usize = 256;

/// How long after a run ended its log is taken as complete even when an
/// attempt's lines are not all stored: the worker writing them gave up
/// (its writer drops a batch after a minute of failed tries) or died.
/// Normally the log is complete as soon as every attempt's `log_lines`
/// are stored (`belfry_ledger::log_is_complete`), well before this.
pub const LOG_SETTLED_AFTER: Duration = Duration::from_secs(120);

/// How long after a run ended the lines of an attempt that recorded no
/// count may still arrive: one handed back by a stopping worker (then the
/// run cancelled), or one whose worker lost its lease. Its worker writes
/// them within a batch's wait (100 ms) or at its shutdown flush.
pub const UNCOUNTED_LINES: Duration = Duration::from_secs(3);

/// The API's form of a stored line (a function, not a `From`: neither type
/// is this crate's).
pub fn log_line(l: &RunLogLine) -> LogLine {
    LogLine {
        attempt: l.attempt,
        seq: l.seq,
        at: l.at,
        kind: match l.kind {
            LogKind::Log => LogLineKind::Log,
            LogKind::Progress => LogLineKind::Progress,
            LogKind::Truncated => LogLineKind::Truncated,
            LogKind::Error => LogLineKind::Error,
        },
        level: l.level.clone(),
        message: l.message.clone(),
        fields: l.fields.clone(),
        done: l.done,
        total: l.total,
    }
}

/// The cursor of `after` (or the start).
fn cursor(raw: Option<&str>) -> Result<LogCursor, ApiError> {
    raw.map_or(Ok(LogCursor::START), |r| {
        r.parse().map_err(|e: belfry_ledger::BadLogCursor| {
            ApiError::bad_request(e.to_string()).field("after")
        })
    })
}

/// The run's status now, and whether its log can still grow: the run is
/// not final, or an attempt's lines are not all stored yet (by the count
/// its attempt entry recorded) and it ended less than
/// [`LOG_SETTLED_AFTER`] ago. 404 when there is no such run.
///
/// # Errors
///
/// [`ApiError`]: 404 for no such run, 503 when the ledger cannot be read.
pub(crate) async fn log_status(state: &ApiState, id: Uuid) -> Result<(RunStatus, bool), ApiError> {
    let run = state
        .ledger()
        .run(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no run with id {id}")))?;
    let status = run_status(&run.status_text)?;
    if !status.is_terminal() {
        return Ok((status, true));
    }
    let ended_within = |bound: Duration| {
        run.finished_at.is_none_or(|f| {
            chrono::Utc::now() - f <= chrono::Duration::from_std(bound).unwrap_or_default()
        })
    };
    if !ended_within(LOG_SETTLED_AFTER) {
        return Ok((status, false));
    }
    // An attempt log that cannot be decoded says nothing about lines: the
    // time bound above decides.
    let Ok(entries) = run.attempt_entries() else {
        return Ok((status, true));
    };
    let uncounted = (1..=run.attempts).any(|a| entries.iter().all(|e| e.attempt != a));
    if uncounted && ended_within(UNCOUNTED_LINES) {
        return Ok((status, true));
    }
    let extent = state.ledger().run_log_extent(id).await?;
    Ok((status, !belfry_ledger::log_is_complete(&entries, &extent)))
}

/// `GET /v1/runs/{id}/logs`.
#[utoipa::path(
    get, path = "/v1/runs/{id}/logs", operation_id = "getRunLogs",
    summary = "A page of a run's log (the handler's lines, progress, each failed attempt's error), oldest first",
    params(RunPath, RunLogQuery),
    responses(
        (status = 200, description = "A page; pass `next` as `after` for the lines that follow", body = RunLogPage),
        (status = 400, description = "A bad cursor or limit", body = ErrorBody),
        (status = 404, description = "No such run", body = ErrorBody),
    ),
)]
pub async fn page(
    State(state): State<ApiState>,
    PathParam(id): PathParam,
    RawQuery(query): RawQuery,
) -> Result<Json<RunLogPage>, ApiError> {
    let id = run_id(&id)?;
    let q = QueryParams::parse(query.as_deref(), &["after", "limit"])?;
    let after = cursor(q.text("after"))?;
    let limit = q.number("limit", 200, 1, MAX_LOG_PAGE)?;
    // The status first: a line written after it is read below too, so a
    // final status with an empty page really is the end.
    let (status, growing) = log_status(&state, id).await?;
    let lines = state.ledger().run_logs(id, after, i64::from(limit)).await?;
    let progress = state.ledger().latest_progress(id).await?;
    let next = lines.last().map_or(after, RunLogLine::cursor);
    Ok(Json(RunLogPage {
        run_id: id,
        status,
        complete: !growing && lines.is_empty(),
        lines: lines.iter().map(log_line).collect(),
        next: next.to_string(),
        progress: progress.as_ref().map(log_line),
    }))
}

/// `GET /v1/runs/{id}/logs/stream`: server-sent events, one `line` event
/// per line (data: a [`LogLine`], id: its cursor), then `end` (data: the
/// run's final status) once the run is final and its log is read.
#[utoipa::path(
    get, path = "/v1/runs/{id}/logs/stream", operation_id = "streamRunLogs",
    summary = "A run's log as server-sent events, tailed while the run is running",
    params(RunPath, RunLogQuery),
    responses(
        (status = 200, description = "`text/event-stream`: `line` events (a LogLine as JSON, id = its cursor), then `end`", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad cursor", body = ErrorBody),
        (status = 404, description = "No such run", body = ErrorBody),
        (status = 503, description = "Too many log streams open on this API process, or the ledger cannot be read", body = ErrorBody),
    ),
)]
pub async fn stream(
    State(state): State<ApiState>,
    PathParam(id): PathParam,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let id = run_id(&id)?;
    let q = QueryParams::parse(query.as_deref(), &["after", "limit"])?;
    // A reconnecting EventSource names the last event it had.
    let resumed = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let after = cursor(resumed.as_deref().or(q.text("after")))?;
    // For the stream, the most lines read from the ledger at a time.
    let read = i64::from(q.number("limit", 200, 1, MAX_LOG_PAGE)?);
    log_status(&state, id).await?;
    // Held by the stream until its client goes (the body is dropped).
    let permit = state
        .log_streams()
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            ApiError::unavailable(format!(
                "too many log streams are open on this API process; \
             try again later, or read pages of GET /v1/runs/{id}/logs"
            ))
        })?;
    let tail = Tail {
        _permit: permit,
        state,
        id,
        after,
        read,
        pending: VecDeque::new(),
        ended: false,
    };
    let events = futures::stream::unfold(tail, |mut t| async move {
        let event = t.next_event().await?;
        Some((Ok(event), t))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

/// A stream's state: where it is, lines read but not sent yet, and its
/// place among the open streams.
struct Tail {
    _permit: tokio::sync::OwnedSemaphorePermit,
    state: ApiState,
    id: Uuid,
    after: LogCursor,
    read: i64,
    pending: VecDeque<RunLogLine>,
    ended: bool,
}

impl Tail {
    /// The next event, or `None` once `end` was sent.
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(line) = self.pending.pop_front() {
                self.after = line.cursor();
                return Some(
                    Event::default()
                        .event("line")
                        .id(line.cursor().to_string())
                        .json_data(log_line(&line))
                        .unwrap_or_else(|_| Event::default().event("line")),
                );
            }
            // The status before the read, as in `page`.
            let (status, growing) = match log_status(&self.state, self.id).await {
                Ok(s) => s,
                // Gone (pruned) or the database away: say so and stop; the
                // client may reconnect with the last id it had.
                Err(e) => {
                    self.ended = true;
                    return Some(Event::default().event("error").data(e.to_string()));
                }
            };
            match self
                .state
                .ledger()
                .run_logs(self.id, self.after, self.read)
                .await
            {
                Ok(lines) if !lines.is_empty() => self.pending = lines.into(),
                Ok(_) if !growing => {
                    self.ended = true;
                    return Some(Event::default().event("end").data(status.as_str()));
                }
                Ok(_) => tokio::time::sleep(TAIL_EVERY).await,
                Err(e) => {
                    self.ended = true;
                    return Some(Event::default().event("error").data(e.to_string()));
                }
            }
        }
    }
}
