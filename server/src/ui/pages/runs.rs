//! `GET /ui/runs` (filtered, paged), `GET /ui/runs/{id}` and its cancel
//! button (`POST /ui/runs/{id}/cancel`).

use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::header::LOCATION;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use crate::api::input::{PathParam, QueryParams};
use crate::api::{ApiError, ApiState, Caller, Role};
use crate::ui::html::{esc, table, url, when, Section};

use super::*;

/// `GET /ui/runs`: runs with filters (schedule, job type, status, time
/// range), newest first, 50 a page.
pub async fn runs(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> PageResult {
    let q = QueryParams::parse(
        query.as_deref(),
        &["schedule", "job_type", "status", "from", "to", "cursor"],
    )
    .map_err(error_page)?;
    let filter = crate::api::runs::run_filter(&q).map_err(error_page)?;
    let (runs, next) = run_page(&state, &filter, q.text("cursor")).await?;
    let field = |n: &str, ph: &str| {
        format!(
            "<input name=\"{n}\" placeholder=\"{ph}\" value=\"{}\" size=\"16\">",
            esc(q.text(n).unwrap_or(""))
        )
    };
    let mut body = format!(
        "<h1>Runs</h1><form method=\"get\" action=\"/ui/runs\" class=\"inline\">{}{}{}{}{}<button>filter</button></form>",
        field("schedule", "schedule"),
        field("job_type", "job type"),
        field("status", "failed,dead"),
        field("from", "from (RFC 3339)"),
        field("to", "to (RFC 3339)"),
    );
    body.push_str(&table(&RUN_HEADERS, &run_rows(&runs)));
    if let Some(c) = next {
        let mut keep = String::new();
        for n in ["schedule", "job_type", "status", "from", "to"] {
            if let Some(v) = q.text(n) {
                let _ = write!(keep, "&{n}={}", url(v));
            }
        }
        let _ = write!(
            body,
            "<p class=\"pager\"><a href=\"/ui/runs?cursor={c}{keep}\">older runs</a></p>"
        );
    }
    Ok(html("Runs", Section::Runs, &caller, true, &body))
}

/// `GET /ui/runs/{id}`: one run's timings, attempts and errors, replica,
/// worker and trace.
pub async fn run(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(id): PathParam,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
) -> PageResult {
    let q = QueryParams::parse(query.as_deref(), &["msg", "err"]).map_err(error_page)?;
    let id = crate::api::runs::run_id(&id).map_err(error_page)?;
    // The page's own refresh (`ui.js`) of a page tailing the run's log
    // keeps the log panel it has.
    let tailing = headers.contains_key(REFRESH_HEADER) && headers.contains_key(TAILING_HEADER);
    let detail = run_detail(&state, id).await?;
    let r = &detail.run;
    let trace = match (&r.trace_id, state.trace_ui()) {
        (Some(t), Some(template)) => format!(
            "<a href=\"{}\">{}</a>",
            esc(&template.replace("{trace_id}", &url(t))),
            esc(t)
        ),
        (Some(t), None) => format!("<code>{}</code>", esc(t)),
        (None, _) => "-".into(),
    };
    let facts: Vec<(&str, String)> = vec![
        (
            "schedule",
            format!(
                "<a href=\"/ui/schedules/{}\">{}</a>",
                url(&r.job_name),
                esc(&r.job_name)
            ),
        ),
        ("run key", esc(&r.run_key)),
        ("job type", esc(&r.job_type)),
        (
            "status",
            format!("<span class=\"badge s-{0}\">{0}</span>", r.status),
        ),
        ("scheduled", when(Some(r.scheduled_at))),
        ("claimed", when(r.claimed_at)),
        ("dispatched", when(r.dispatched_at)),
        ("started", when(r.started_at)),
        ("finished", when(r.finished_at)),
        ("lateness (scheduled → dispatched)", lateness(r)),
        ("attempts", r.attempts.to_string()),
        ("claimed by", esc(r.claimed_by.as_deref().unwrap_or("-"))),
        ("worker", esc(r.worker.as_deref().unwrap_or("-"))),
        (
            "last error",
            format!("<pre>{}</pre>", esc(r.last_error.as_deref().unwrap_or(""))),
        ),
        ("trace", trace),
        (
            "payload",
            format!(
                "<pre>{}</pre>",
                esc(&serde_json::to_string_pretty(&detail.payload).unwrap_or_default())
            ),
        ),
    ];
    let rows: Vec<String> = facts
        .iter()
        .map(|(k, v)| format!("<tr><th>{}</th><td>{v}</td></tr>", esc(k)))
        .collect();
    let attempts: Vec<String> = detail
        .attempt_log
        .iter()
        .map(|a| {
            format!(
                "<tr><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
                a.attempt,
                esc(&a.worker),
                when(Some(a.started_at)),
                when(Some(a.finished_at)),
                esc(&a.outcome),
                esc(a.error.as_deref().unwrap_or(""))
            )
        })
        .collect();
    let unfinished = !r.status.is_terminal();
    let cancel = match (caller.role, unfinished, r.cancel_requested_at) {
        (_, true, Some(at)) => format!(
            "<div class=\"flash\">cancel requested at {}: its worker is stopping it</div>",
            when(Some(at))
        ),
        (Role::Admin, true, None) => format!(
            "<form class=\"inline\" method=\"post\" action=\"/ui/runs/{}/cancel\">\
             <input name=\"reason\" placeholder=\"reason (optional)\" size=\"30\"> \
             <button>cancel run</button></form>",
            r.id
        ),
        _ => String::new(),
    };
    let lineage = [
        ("Parents", &detail.parents),
        ("Follow-ups", &detail.children),
    ]
    .iter()
    .filter(|(_, links)| !links.is_empty())
    .map(|(title, links)| {
        let rows: Vec<String> = links
            .iter()
            .map(|l| {
                let status = l.status.map_or("gone", |s| s.as_str());
                format!(
                    "<tr><td><a href=\"/ui/runs/{}\">{}</a></td><td>{}</td>\
                         <td><span class=\"badge s-{status}\">{status}</span></td></tr>",
                    l.id,
                    esc(&l.run_key),
                    esc(&l.job_name)
                )
            })
            .collect();
        format!(
            "<h2>{title}</h2>{}",
            table(&["run key", "job", "status"], &rows)
        )
    })
    .collect::<String>();
    let log = log_panel(&state, r, tailing).await;
    let body = format!(
        "<h1>Run {}</h1>{}{cancel}<table><tbody>{}</tbody></table>{lineage}<h2>Attempts</h2>{}{log}",
        esc(&r.run_key),
        flashes(&q),
        rows.concat(),
        table(
            &["#", "worker", "started", "finished", "outcome", "error"],
            &attempts
        )
    );
    Ok(html(&r.run_key, Section::Runs, &caller, true, &body))
}

/// Lines of a run's log the page shows at most (the rest: `belfry runs
/// logs` or the API).
const PAGE_LOG_LINES: i64 = 2_000;

/// The header `ui.js` sends with its refresh of a page.
const REFRESH_HEADER: &str = "x-belfry-refresh";

/// The header `ui.js` adds to a refresh while it tails the page's log
/// (its stream open, not ended).
const TAILING_HEADER: &str = "x-belfry-tailing";

/// The run's log (issue 23): its latest progress as a bar, then its lines
/// per attempt, a failed attempt's error after its last lines. While the
/// run can still write lines, `ui.js` tails them live from the stream
/// named in `data-stream`, after the cursor in `data-after`. A log that
/// cannot be read is said so; the rest of the page stands.
///
/// For the refresh of a page that tails the log (`tailing`), while the log
/// can still grow, only a placeholder (`data-keep-log`): the browser keeps
/// the panel it is tailing (its scroll, its lines) instead of a redraw
/// that re-reads up to [`PAGE_LOG_LINES`] lines every few seconds. A panel
/// not tailed (over the page's lines, unreadable) is drawn again.
async fn log_panel(state: &ApiState, r: &belfry_api_types::Run, tailing: bool) -> String {
    // Tail only what can still grow (a run that cannot be read now is
    // taken as growing: the stream says what it finds).
    let growing = crate::api::run_logs::log_status(state, r.id)
        .await
        .map_or(true, |(_, growing)| growing);
    if tailing && growing {
        return "<div id=\"log-panel\" data-keep-log></div>".into();
    }
    let ledger = state.ledger();
    let (lines, progress) = match tokio::try_join!(
        ledger.run_logs(r.id, belfry_ledger::LogCursor::START, PAGE_LOG_LINES + 1),
        ledger.latest_progress(r.id)
    ) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(run = %r.id, error = %e, "run log unreadable");
            return "<div id=\"log-panel\"><h2>Log</h2><p class=\"muted\">the log cannot be read now</p></div>".into();
        }
    };
    let more = lines.len() > PAGE_LOG_LINES as usize;
    let shown = &lines[..lines.len().min(PAGE_LOG_LINES as usize)];
    let after = shown.last().map_or(
        belfry_ledger::LogCursor::START,
        belfry_ledger::RunLogLine::cursor,
    );
    // Tail only from the end of what is shown.
    let live = !more && growing;
    let mut out = String::from("<div id=\"log-panel\"><h2>Log</h2>");
    if progress.is_none() && live {
        // A place for the first report the stream brings.
        out.push_str(
            "<p class=\"progress\" hidden><progress></progress> <span class=\"progress-text\"></span></p>",
        );
    }
    if let Some(p) = &progress {
        let (done, total) = (p.done.unwrap_or(0), p.total);
        let _ = write!(
            out,
            "<p class=\"progress\">{}<span class=\"progress-text\">{done}{} {}</span></p>",
            match total {
                Some(t) if t > 0 => format!("<progress value=\"{done}\" max=\"{t}\"></progress> "),
                _ => "<progress></progress> ".into(),
            },
            total.map(|t| format!(" / {t}")).unwrap_or_default(),
            esc(&p.message)
        );
    }
    let _ = write!(
        out,
        "<section id=\"run-log\" data-after=\"{after}\"{}>",
        if live {
            format!(" data-stream=\"/ui/runs/{}/logs/stream\"", r.id)
        } else {
            String::new()
        }
    );
    if shown.is_empty() {
        out.push_str("<p class=\"muted log-empty\">nothing logged (yet)</p>");
    }
    let mut attempt = None;
    for l in shown {
        if attempt != Some(l.attempt) {
            if attempt.is_some() {
                out.push_str("</pre>");
            }
            attempt = Some(l.attempt);
            let _ = write!(
                out,
                "<h3>Attempt {0}</h3><pre class=\"log\" data-attempt=\"{0}\">",
                l.attempt
            );
        }
        out.push_str(&log_line_html(&crate::api::run_logs::log_line(l)));
    }
    if attempt.is_some() {
        out.push_str("</pre>");
    }
    out.push_str("</section>");
    if more {
        let _ = write!(
            out,
            "<p class=\"muted\">only the first {PAGE_LOG_LINES} lines are shown: \
             <code>belfry runs logs {}</code> prints all of them</p>",
            r.id
        );
    }
    out.push_str("</div>");
    out
}

/// One line of the log panel; `ui.js` builds the same markup for a line
/// the stream brings.
fn log_line_html(l: &belfry_api_types::LogLine) -> String {
    format!(
        "<span class=\"l l-{} k-{}\">{}</span>\n",
        esc(&l.level),
        kind_name(l.kind),
        esc(&l.text())
    )
}

fn kind_name(k: belfry_api_types::LogLineKind) -> &'static str {
    use belfry_api_types::LogLineKind;
    match k {
        LogLineKind::Log => "log",
        LogLineKind::Progress => "progress",
        LogLineKind::Truncated => "truncated",
        LogLineKind::Error => "error",
    }
}

/// `POST /ui/runs/{id}/cancel` (form field `reason`, optional): the API's
/// cancel, then back to the run's page with what happened.
pub async fn cancel(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(id): PathParam,
    body: Bytes,
) -> Response {
    let id = match crate::api::runs::run_id(&id) {
        Ok(id) => id,
        Err(e) => return error_page(e),
    };
    let reason = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "reason")
        .map(|(_, v)| v.into_owned());
    let done = state
        .ops()
        .cancel_run(&caller.name, id, reason.as_deref(), "web view")
        .await;
    let target = match done {
        Ok(d) => {
            let msg = match d.cancelled {
                belfry_scheduler::cancel::Cancelled::Now { .. } => "cancelled".to_owned(),
                belfry_scheduler::cancel::Cancelled::Requested => {
                    "cancel requested: its worker is stopping it".to_owned()
                }
            };
            format!("/ui/runs/{id}?msg={}", url(&msg))
        }
        Err(e) => {
            let e = ApiError::from(e);
            if e.status == StatusCode::NOT_FOUND {
                return error_page(e);
            }
            format!("/ui/runs/{id}?err={}", url(&e.message))
        }
    };
    (StatusCode::SEE_OTHER, [(LOCATION, target)]).into_response()
}
