//! The pages and actions of the web view.

use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::header::{LOCATION, SET_COOKIE};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use chrono::{DateTime, Duration, DurationRound, Utc};

use belfry_ledger::{RunCursor, RunFilter, RunRecord, ScheduleRow};

use super::html::{esc, page, table, url, when, Section};
use crate::api::input::{PathParam, QueryParams};
use crate::api::{ApiError, ApiState, Caller, Role};
use belfry_scheduler::schedule_sync::{schedule_of_row, spec_of_row};
use belfry_scheduler::zoned_cron::CronCache;

/// Schedules per page.
const SCHEDULE_PAGE: i64 = 100;
/// Runs per page.
const RUN_PAGE: i64 = 50;
/// Fires in a schedule's strip.
const STRIP: i64 = 20;
/// Hours of the overview's chart.
const CHART_HOURS: i64 = 3;

type PageResult = Result<Response, Response>;

fn error_page(e: ApiError) -> Response {
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

fn html(title: &str, section: Section, caller: &Caller, refresh: bool, body: &str) -> Response {
    Html(page(title, section, Some(&caller.name), refresh, body)).into_response()
}

fn status_strip(fires: &[(DateTime<Utc>, String)]) -> String {
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

fn upcoming(
    row: &ScheduleRow,
    count: usize,
) -> Result<Vec<DateTime<Utc>>, belfry_scheduler::schedule_sync::StoredScheduleError> {
    schedule_of_row(row, &mut CronCache::default()).map(|s| s.upcoming(Utc::now(), count))
}

/// `GET /ui`: fires per minute and outcomes, in-flight and stuck runs,
/// dead letters, the replicas and workers seen lately.
pub async fn overview(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
) -> PageResult {
    let now = Utc::now();
    let ledger = state.ledger();
    let (numbers, minutes) = tokio::try_join!(
        ledger.overview(now - Duration::minutes(15)),
        ledger.runs_per_minute(chart_start(now)),
    )
    .map_err(|e| error_page(e.into()))?;
    let mut body = String::from("<h1>Overview</h1><div class=\"cards\">");
    for (label, n, href) in [
        (
            "runs in flight",
            numbers.in_flight,
            "/ui/runs?status=claimed,dispatched,running,retrying",
        ),
        (
            "stuck runs",
            numbers.stuck,
            "/ui/runs?status=claimed,dispatched,running,retrying",
        ),
        (
            "dead in the last 24 h",
            numbers.dead_last_day,
            "/ui/runs?status=dead",
        ),
        (
            "failed in the last 24 h",
            numbers.failed_last_day,
            "/ui/runs?status=failed",
        ),
    ] {
        let _ = write!(
            body,
            "<a class=\"card\" href=\"{href}\"><div class=\"n\">{n}</div><div class=\"muted\">{label}</div></a>"
        );
    }
    body.push_str("</div>");
    let _ = write!(
        body,
        "<h2>Fires per minute, last {CHART_HOURS} hours</h2>{}",
        chart(&minutes, now)
    );
    let seen = |rows: &[(String, DateTime<Utc>)]| -> String {
        let rows: Vec<String> = rows
            .iter()
            .map(|(who, last)| {
                format!(
                    "<tr><td>{}</td><td>{}</td></tr>",
                    esc(who),
                    when(Some(*last))
                )
            })
            .collect();
        table(&["name", "last seen"], &rows)
    };
    let _ = write!(
        body,
        "<h2>Scheduler replicas (claims in the last 15 min)</h2>{}<h2>Workers (attempts in the last 15 min)</h2>{}",
        seen(&numbers.replicas),
        seen(&numbers.workers)
    );
    Ok(html("Overview", Section::Overview, &caller, true, &body))
}

/// A bar per minute: succeeded (green), failed or dead (red), still going
/// (blue), stacked.
/// The first minute of the chart: whole minutes, the current one last.
fn chart_start(now: DateTime<Utc>) -> DateTime<Utc> {
    let minute = now.duration_trunc(Duration::minutes(1)).unwrap_or(now);
    minute - Duration::minutes(CHART_HOURS * 60 - 1)
}

fn chart(minutes: &[belfry_ledger::MinuteCount], now: DateTime<Utc>) -> String {
    let start = chart_start(now);
    let slots = usize::try_from(CHART_HOURS * 60).unwrap_or(180);
    let mut counts = vec![(0i64, 0i64, 0i64); slots];
    for m in minutes {
        let i = usize::try_from((m.minute - start).num_minutes()).unwrap_or(usize::MAX);
        if let Some(c) = counts.get_mut(i) {
            match m.status.as_str() {
                "succeeded" => c.0 += m.count,
                "failed" | "dead" => c.1 += m.count,
                _ => c.2 += m.count,
            }
        }
    }
    let peak = counts
        .iter()
        .map(|c| c.0 + c.1 + c.2)
        .max()
        .unwrap_or(0)
        .max(1);
    let (w, h) = (4usize, 80f64);
    let mut svg = format!(
        "<svg class=\"chart\" width=\"{}\" height=\"{}\" role=\"img\" aria-label=\"fires per minute\">",
        slots * w,
        h + 2.0
    );
    for (i, (ok, bad, other)) in counts.iter().enumerate() {
        let mut y = h;
        for (n, class) in [(ok, "ok"), (bad, "bad"), (other, "other")] {
            if *n == 0 {
                continue;
            }
            let height = (*n as f64 / peak as f64 * h).max(1.0);
            y -= height;
            let _ = write!(
                svg,
                "<rect class=\"{class}\" x=\"{}\" y=\"{y:.1}\" width=\"{}\" height=\"{height:.1}\"><title>{} {class}</title></rect>",
                i * w,
                w - 1,
                n
            );
        }
    }
    let _ = write!(svg, "</svg><div class=\"muted\">peak {peak} fires/min; green succeeded, red failed or dead, blue unfinished</div>");
    svg
}

/// `GET /ui/schedules`: every schedule (100 a page) with its timetable in
/// words, zone, policies, state, next fires and a strip of its last fires.
pub async fn schedules(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> PageResult {
    let q = QueryParams::parse(query.as_deref(), &["cursor"]).map_err(error_page)?;
    let rows = state
        .ledger()
        .schedules_page(q.text("cursor"), SCHEDULE_PAGE + 1)
        .await
        .map_err(|e| error_page(e.into()))?;
    let more = rows.len() > SCHEDULE_PAGE as usize;
    let rows = &rows[..rows.len().min(SCHEDULE_PAGE as usize)];
    let names: Vec<String> = rows.iter().map(|r| r.name.clone()).collect();
    let fires = state
        .ledger()
        .recent_fires(&names, STRIP)
        .await
        .map_err(|e| error_page(e.into()))?;
    let mut by_name: std::collections::HashMap<&str, Vec<(DateTime<Utc>, String)>> =
        std::collections::HashMap::new();
    for f in &fires {
        by_name
            .entry(f.job_name.as_str())
            .or_default()
            .push((f.scheduled_at, f.status.clone()));
    }
    // Newest first, whatever order the rows came in.
    for fires in by_name.values_mut() {
        fires.sort_by_key(|f| std::cmp::Reverse(f.0));
    }
    let mut cache = CronCache::default();
    let table_rows: Vec<String> = rows
        .iter()
        .map(|row| {
            let spec = spec_of_row(row);
            let (words, raw, zone, policies) = match &spec {
                Ok(spec) => (
                    belfry_scheduler::describe::describe(spec),
                    spec.cron
                        .clone()
                        .or_else(|| spec.every.clone().map(|e| format!("every = {e}")))
                        .or_else(|| spec.at.clone().map(|a| format!("at = {a}")))
                        .unwrap_or_default(),
                    spec.timezone.clone().unwrap_or_else(|| "UTC".into()),
                    format!(
                        "misfire {}, overlap {}",
                        spec.misfire.as_deref().unwrap_or("fire_once"),
                        spec.overlap.as_deref().unwrap_or("allow")
                    ),
                ),
                Err(e) => (format!("invalid: {e}"), String::new(), String::new(), String::new()),
            };
            let next = schedule_of_row(row, &mut cache)
                .map(|s| {
                    s.upcoming(Utc::now(), 3)
                        .iter()
                        .map(|t| t.format("%m-%d %H:%M:%S").to_string())
                        .collect::<Vec<_>>()
                        .join("<br>")
                })
                .unwrap_or_else(|e| esc(&e.to_string()));
            let strip = by_name.get(row.name.as_str()).map(|f| status_strip(f)).unwrap_or_default();
            format!(
                "<tr><td><a href=\"/ui/schedules/{}\">{}</a><div class=\"muted\">{}</div></td>\
                 <td>{}<div><code>{}</code></div></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                url(&row.name),
                esc(&row.name),
                esc(&row.job_type),
                esc(&words),
                esc(&raw),
                esc(&zone),
                esc(&policies),
                if row.paused {
                    "<span class=\"badge paused\">paused</span>"
                } else {
                    "<span class=\"badge active\">active</span>"
                },
                next,
                strip
            )
        })
        .collect();
    let mut body = String::from("<h1>Schedules</h1>");
    body.push_str(&table(
        &[
            "schedule",
            "when",
            "zone",
            "policies",
            "state",
            "next fires (UTC)",
            "last fires",
        ],
        &table_rows,
    ));
    if more {
        if let Some(last) = rows.last() {
            let _ = write!(
                body,
                "<p class=\"pager\"><a href=\"/ui/schedules?cursor={}\">next page</a></p>",
                url(&last.name)
            );
        }
    }
    Ok(html("Schedules", Section::Schedules, &caller, true, &body))
}

fn run_rows(runs: &[RunRecord]) -> Vec<String> {
    runs.iter()
        .map(|r| {
            let lateness = r
                .dispatched_at
                .map(|d| format!("{} ms", (d - r.scheduled_at).num_milliseconds()))
                .unwrap_or_else(|| "-".into());
            format!(
                "<tr><td><a href=\"/ui/runs/{}\">{}</a></td><td>{}</td><td><span class=\"badge s-{}\">{}</span></td>\
                 <td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
                r.id,
                esc(&r.run_key),
                esc(&r.job_type),
                esc(&r.status_text),
                esc(&r.status_text),
                when(Some(r.scheduled_at)),
                lateness,
                r.attempts,
                esc(r.worker.as_deref().unwrap_or("-")),
                esc(&shortened(r.last_error.as_deref().unwrap_or(""), 300))
            )
        })
        .collect()
}

/// `text` cut to at most `max` characters (on a character boundary), with
/// an ellipsis when cut: lists stay small; the run's page shows it whole.
fn shortened(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

const RUN_HEADERS: [&str; 8] = [
    "run",
    "job type",
    "status",
    "scheduled (UTC)",
    "lateness",
    "attempts",
    "worker",
    "last error",
];

fn cursor_of(raw: Option<&str>) -> Result<Option<RunCursor>, Box<Response>> {
    raw.map(crate::api::runs::decode_cursor)
        .transpose()
        .map_err(|e| Box::new(error_page(e)))
}

/// One page of runs matching `filter` from `cursor`, and whether more follow.
async fn run_page(
    state: &ApiState,
    filter: &RunFilter,
    cursor: Option<&str>,
) -> Result<(Vec<RunRecord>, bool), Response> {
    let cursor = cursor_of(cursor).map_err(|e| *e)?;
    let mut runs = state
        .ledger()
        .list_runs(filter, cursor, RUN_PAGE + 1)
        .await
        .map_err(|e| error_page(e.into()))?;
    let more = runs.len() > RUN_PAGE as usize;
    runs.truncate(RUN_PAGE as usize);
    Ok((runs, more))
}

fn next_cursor(runs: &[RunRecord]) -> Option<String> {
    runs.last()
        .map(|r| crate::api::runs::encode_cursor(RunCursor::after(r)))
}

/// `GET /ui/schedules/{name}`: definition, next fires, actions (admins) and
/// run history.
pub async fn schedule(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    RawQuery(query): RawQuery,
) -> PageResult {
    let q = QueryParams::parse(query.as_deref(), &["cursor", "msg", "err"]).map_err(error_page)?;
    // Looked up as written: a row whose name was set by hand outside the
    // naming rule still has a page.
    let row = state
        .ledger()
        .schedule(&name)
        .await
        .map_err(|e| error_page(e.into()))?
        .ok_or_else(|| error_page(ApiError::not_found(format!("no schedule named {name:?}"))))?;
    let filter = RunFilter {
        job_name: Some(name.clone()),
        ..RunFilter::default()
    };
    let (runs, more) = run_page(&state, &filter, q.text("cursor")).await?;
    let mut body = format!("<h1>{}</h1>", esc(&name));
    if let Some(m) = q.text("msg") {
        let _ = write!(body, "<div class=\"flash\">{}</div>", esc(m));
    }
    if let Some(e) = q.text("err") {
        let _ = write!(body, "<div class=\"error\">{}</div>", esc(e));
    }
    let spec = spec_of_row(&row);
    let words = spec
        .as_ref()
        .map(belfry_scheduler::describe::describe)
        .unwrap_or_else(|e| format!("invalid: {e}"));
    let _ = write!(
        body,
        "<p>{} — {}</p>",
        esc(&words),
        if row.paused {
            "<span class=\"badge paused\">paused</span>"
        } else {
            "<span class=\"badge active\">active</span>"
        }
    );
    if caller.role == Role::Admin {
        let base = format!("/ui/schedules/{}", url(&name));
        let toggle = if row.paused { "resume" } else { "pause" };
        let _ = write!(
            body,
            "<form class=\"inline\" method=\"post\" action=\"{base}/{toggle}\"><button>{toggle}</button></form>\
             <form class=\"inline\" method=\"post\" action=\"{base}/trigger\"><button>trigger now</button>\
             <label><input type=\"checkbox\" name=\"force\" value=\"true\"> even if the previous run is unfinished</label></form>\
             <form class=\"inline\" method=\"post\" action=\"{base}/backfill\">backfill from \
             <input name=\"from\" placeholder=\"2026-07-26T00:00:00Z\" size=\"22\"> to \
             <input name=\"to\" placeholder=\"2026-07-26T01:00:00Z\" size=\"22\">\
             <label><input type=\"checkbox\" name=\"force\" value=\"true\"> allow overlap</label>\
             <button>backfill</button></form>"
        );
    }
    let next = upcoming(&row, 10)
        .map(|n| {
            n.iter()
                .map(|t| format!("<li>{}</li>", when(Some(*t))))
                .collect::<String>()
        })
        .unwrap_or_else(|e| format!("<li>{}</li>", esc(&e.to_string())));
    let definition = spec
        .as_ref()
        .ok()
        .and_then(|s| serde_json::to_string_pretty(s).ok())
        .unwrap_or_else(|| row.spec.as_ref().map(|v| v.to_string()).unwrap_or_default());
    let _ = write!(
        body,
        "<h2>Definition</h2><pre>{}</pre><h2>Next fires (UTC)</h2><ul>{next}</ul><h2>Runs</h2>{}",
        esc(&definition),
        table(&RUN_HEADERS, &run_rows(&runs))
    );
    if more {
        if let Some(c) = next_cursor(&runs) {
            let _ = write!(
                body,
                "<p class=\"pager\"><a href=\"/ui/schedules/{}?cursor={c}\">older runs</a></p>",
                url(&name)
            );
        }
    }
    Ok(html(&name, Section::Schedules, &caller, true, &body))
}

/// `POST /ui/schedules/{name}/{action}`: pause, resume, trigger, backfill;
/// the same operations as the API, then back to the schedule's page.
pub async fn act(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    axum::extract::Path((name, action)): axum::extract::Path<(String, String)>,
    body: Bytes,
) -> Response {
    let form: std::collections::HashMap<String, String> = form_urlencoded::parse(&body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let force = form.get("force").is_some_and(|v| v == "true");
    let done: Result<String, ApiError> = async {
        crate::api::schedules::checked_name(&name)?;
        match action.as_str() {
            "pause" | "resume" => {
                state
                    .ops()
                    .set_paused(&caller.name, &name, action == "pause", "web view")
                    .await?;
                Ok(format!("{action}d"))
            }
            "trigger" => {
                let t = state.ops().trigger(&caller.name, &name, force).await?;
                Ok(format!(
                    "triggered: run {} ({})",
                    t.run.map(|r| r.run_key).unwrap_or_default(),
                    t.outcome.label()
                ))
            }
            "backfill" => {
                let from = form.get("from").map(String::as_str).unwrap_or("");
                let to = form.get("to").map(String::as_str).unwrap_or("");
                let done =
                    crate::api::schedules::run_backfill(&state, &caller, &name, from, to, force)
                        .await?;
                let counts: Vec<String> = done
                    .counts()
                    .into_iter()
                    .map(|(outcome, n)| format!("{}: {n}", outcome.label()))
                    .collect();
                Ok(format!(
                    "backfilled {} instants: {}",
                    done.fires.len(),
                    counts.join(", ")
                ))
            }
            other => Err(ApiError::not_found(format!("no action {other:?}"))),
        }
    }
    .await;
    let target = match done {
        Ok(msg) => format!("/ui/schedules/{}?msg={}", url(&name), url(&msg)),
        Err(e) if e.status == StatusCode::NOT_FOUND || e.status == StatusCode::BAD_REQUEST => {
            return error_page(e)
        }
        Err(e) => format!("/ui/schedules/{}?err={}", url(&name), url(&e.message)),
    };
    (StatusCode::SEE_OTHER, [(LOCATION, target)]).into_response()
}

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
    let (runs, more) = run_page(&state, &filter, q.text("cursor")).await?;
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
    if more {
        if let Some(c) = next_cursor(&runs) {
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
    }
    Ok(html("Runs", Section::Runs, &caller, true, &body))
}

/// `GET /ui/runs/{id}`: one run's timings, attempts and errors, replica,
/// worker and trace.
pub async fn run(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(id): PathParam,
) -> PageResult {
    let id = uuid::Uuid::parse_str(&id)
        .map_err(|_| error_page(ApiError::bad_request(format!("{id:?} is not a run id"))))?;
    let r = state
        .ledger()
        .run(id)
        .await
        .map_err(|e| error_page(e.into()))?
        .ok_or_else(|| error_page(ApiError::not_found(format!("no run with id {id}"))))?;
    let trace = match (&r.trace_id, state.trace_ui()) {
        (Some(t), Some(template)) => format!(
            "<a href=\"{}\">{}</a>",
            esc(&template.replace("{trace_id}", &url(t))),
            esc(t)
        ),
        (Some(t), None) => format!("<code>{}</code>", esc(t)),
        (None, _) => "-".into(),
    };
    let lateness = r
        .dispatched_at
        .map(|d| format!("{} ms", (d - r.scheduled_at).num_milliseconds()))
        .unwrap_or_else(|| "-".into());
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
            format!(
                "<span class=\"badge s-{0}\">{0}</span>",
                esc(&r.status_text)
            ),
        ),
        ("scheduled", when(Some(r.scheduled_at))),
        ("claimed", when(r.claimed_at)),
        ("dispatched", when(r.dispatched_at)),
        ("started", when(r.started_at)),
        ("finished", when(r.finished_at)),
        ("lateness (scheduled → dispatched)", lateness),
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
                esc(&serde_json::to_string_pretty(&r.payload).unwrap_or_default())
            ),
        ),
    ];
    let rows: Vec<String> = facts
        .iter()
        .map(|(k, v)| format!("<tr><th>{}</th><td>{v}</td></tr>", esc(k)))
        .collect();
    let attempts: Vec<String> = r
        .attempt_entries()
        .unwrap_or_default()
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
    let body = format!(
        "<h1>Run {}</h1><table><tbody>{}</tbody></table><h2>Attempts</h2>{}",
        esc(&r.run_key),
        rows.concat(),
        table(
            &["#", "worker", "started", "finished", "outcome", "error"],
            &attempts
        )
    );
    Ok(html(&r.run_key, Section::Runs, &caller, true, &body))
}

/// `GET /ui/login`: asks for a token (only when tokens are configured).
pub async fn login_form(State(state): State<ApiState>) -> Response {
    if state.tokens().is_empty() {
        return (StatusCode::SEE_OTHER, [(LOCATION, "/ui")]).into_response();
    }
    login_page(None, StatusCode::OK)
}

fn login_page(error: Option<&str>, status: StatusCode) -> Response {
    let body = format!(
        "<h1>Sign in</h1>{}<form method=\"post\" action=\"/ui/login\">\
         <label>API token <input type=\"password\" name=\"token\" size=\"40\" autofocus></label> \
         <button>sign in</button></form>\
         <p class=\"muted\">An admin or read-only token from BELFRY_API_ADMIN_TOKENS / BELFRY_API_READ_TOKENS.</p>",
        error.map(|e| format!("<div class=\"error\">{}</div>", esc(e))).unwrap_or_default()
    );
    (
        status,
        Html(page("Sign in", Section::None, None, false, &body)),
    )
        .into_response()
}

/// `POST /ui/login`: checks the token and keeps it in an HttpOnly,
/// SameSite=Lax cookie for `/ui`.
pub async fn login(State(state): State<ApiState>, body: Bytes) -> Response {
    let token = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if state.tokens().check(token.trim()).is_none() {
        return login_page(Some("that token is not valid"), StatusCode::UNAUTHORIZED);
    }
    let cookie = format!(
        // Lax, so a link from another site lands signed in; every POST is
        // still refused cross-site by the Origin check.
        "{}={}; HttpOnly; SameSite=Lax; Path=/ui",
        super::TOKEN_COOKIE,
        url(token.trim())
    );
    (
        StatusCode::SEE_OTHER,
        [(LOCATION, "/ui".to_owned()), (SET_COOKIE, cookie)],
    )
        .into_response()
}

/// `POST /ui/logout`: forgets the cookie.
pub async fn logout() -> Response {
    let cookie = format!(
        "{}=; HttpOnly; SameSite=Lax; Path=/ui; Max-Age=0",
        super::TOKEN_COOKIE
    );
    (
        StatusCode::SEE_OTHER,
        [(LOCATION, "/ui/login".to_owned()), (SET_COOKIE, cookie)],
    )
        .into_response()
}
