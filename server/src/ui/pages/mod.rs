//! The pages and actions of the web view, a file per page family, and
//! what they share: the page frame, error pages, run tables and paging.

mod alerts;
mod login;
mod overview;
mod runs;
mod schedules;

pub use alerts::test_alert;
pub use login::{login, login_form, logout};
pub use overview::overview;
pub use runs::{cancel, run, runs};
pub use schedules::{act, schedule, schedules};

use std::fmt::Write as _;

use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};

use belfry_api_types::{Run, RunDetail};
use belfry_ledger::{RunCursor, RunFilter, ScheduleRow};

use super::html::{esc, page, when, Section};
use crate::api::{ApiError, ApiState, Caller};
use belfry_scheduler::schedule_sync::schedule_of_row;
use belfry_scheduler::zoned_cron::CronCache;

/// Schedules per page.
pub(super) const SCHEDULE_PAGE: i64 = 100;
/// Runs per page.
pub(super) const RUN_PAGE: i64 = 50;
/// Fires in a schedule's strip.
pub(super) const STRIP: i64 = 20;
/// Hours of the overview's chart.
pub(super) const CHART_HOURS: i64 = 3;

pub(super) type PageResult = Result<Response, Response>;

/// The outcome of an action the page was redirected to after: `msg`
/// (done) and `err` (refused) of its query.
pub(super) fn flashes(q: &crate::api::input::QueryParams) -> String {
    let mut out = String::new();
    if let Some(m) = q.text("msg") {
        let _ = write!(out, "<div class=\"flash\">{}</div>", esc(m));
    }
    if let Some(e) = q.text("err") {
        let _ = write!(out, "<div class=\"error\">{}</div>", esc(e));
    }
    out
}

pub(super) fn error_page(e: ApiError) -> Response {
    let body = format!(
        "<h1>{}</h1><div class=\"error\">{}</div><p><a href=\"/ui\">back to the overview</a></p>",
        esc(e.status.canonical_reason().unwrap_or("error")),
        esc(&e.message)
    );
    (
        e.status,
        Html(page("error", Section::None, None, false, &body)),
    )
        .into_response()
}

pub(super) fn html(
    title: &str,
    section: Section,
    caller: &Caller,
    refresh: bool,
    body: &str,
) -> Response {
    Html(page(title, section, Some(&caller.name), refresh, body)).into_response()
}

pub(super) fn status_strip(fires: &[(DateTime<Utc>, String)]) -> String {
    let mut out = String::from("<span class=\"strip\">");
    // Oldest on the left, newest on the right.
    for (at, status) in fires.iter().rev() {
        let _ = write!(
            out,
            "<span class=\"s-{}\" title=\"{} {}\"></span>",
            esc(status),
            esc(&at.format("%Y-%m-%d %H:%M:%S").to_string()),
            esc(status)
        );
    }
    out.push_str("</span>");
    out
}

pub(super) fn upcoming(
    row: &ScheduleRow,
    count: usize,
) -> Result<Vec<DateTime<Utc>>, belfry_scheduler::schedule_sync::StoredScheduleError> {
    // No more than it has runs left (as the API's preview).
    let count = row.capped_by_runs_left(count);
    schedule_of_row(row, &mut CronCache::default()).map(|s| s.upcoming(Utc::now(), count))
}

/// Scheduled instant to broker confirmation, as the pages show it.
pub(super) fn lateness(run: &Run) -> String {
    run.lateness_ms
        .map(|ms| format!("{ms} ms"))
        .unwrap_or_else(|| "-".into())
}

pub(super) fn run_rows(runs: &[Run]) -> Vec<String> {
    runs.iter()
        .map(|r| {
            format!(
                "<tr><td><a href=\"/ui/runs/{}\">{}</a></td><td>{}</td><td><span class=\"badge s-{}\">{}</span></td>\
                 <td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
                r.id,
                esc(&r.run_key),
                esc(&r.job_type),
                r.status,
                r.status,
                when(Some(r.scheduled_at)),
                lateness(r),
                r.attempts,
                esc(r.worker.as_deref().unwrap_or("-")),
                esc(&shortened(r.last_error.as_deref().unwrap_or(""), 300))
            )
        })
        .collect()
}

/// `text` cut to at most `max` characters (on a character boundary), with
/// an ellipsis when cut: lists stay small; the run's page shows it whole.
pub(super) fn shortened(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

pub(super) const RUN_HEADERS: [&str; 8] = [
    "run",
    "job type",
    "status",
    "scheduled (UTC)",
    "lateness",
    "attempts",
    "worker",
    "last error",
];

pub(super) fn cursor_of(raw: Option<&str>) -> Result<Option<RunCursor>, Box<Response>> {
    raw.map(crate::api::runs::decode_cursor)
        .transpose()
        .map_err(|e| Box::new(error_page(e)))
}

/// One page of runs matching `filter` from `cursor`, as the API shows
/// them, and the cursor of the next page when more follow.
pub(super) async fn run_page(
    state: &ApiState,
    filter: &RunFilter,
    cursor: Option<&str>,
) -> Result<(Vec<Run>, Option<String>), Response> {
    let cursor = cursor_of(cursor).map_err(|e| *e)?;
    let mut runs = state
        .ledger()
        .list_runs(filter, cursor, RUN_PAGE + 1)
        .await
        .map_err(|e| error_page(e.into()))?;
    let more = runs.len() > RUN_PAGE as usize;
    runs.truncate(RUN_PAGE as usize);
    let next = more
        .then(|| {
            runs.last()
                .map(|r| crate::api::runs::encode_cursor(RunCursor::after(r)))
        })
        .flatten();
    let runs = runs
        .iter()
        .map(crate::api::runs::summary)
        .collect::<Result<_, _>>()
        .map_err(error_page)?;
    Ok((runs, next))
}

/// One run with its attempts, as the API shows it.
pub(super) async fn run_detail(state: &ApiState, id: uuid::Uuid) -> Result<RunDetail, Response> {
    let run = state
        .ledger()
        .run(id)
        .await
        .map_err(|e| error_page(e.into()))?
        .ok_or_else(|| error_page(ApiError::not_found(format!("no run with id {id}"))))?;
    crate::api::runs::detail_with_lineage(state.ledger(), &run)
        .await
        .map_err(error_page)
}
