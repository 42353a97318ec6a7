//! `GET /ui`: the overview, with its fires-per-minute chart.

use std::fmt::Write as _;

use axum::extract::{RawQuery, State};
use axum::Extension;
use chrono::{DateTime, Duration, DurationRound, Utc};

use crate::api::input::QueryParams;
use crate::api::{ApiState, Caller};
use crate::ui::html::{esc, table, when, Section};

use super::*;

/// `GET /ui`: fires per minute and outcomes, in-flight and stuck runs,
/// dead letters, the replicas and workers seen lately, recent alerts and
/// failed alert deliveries.
pub async fn overview(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> PageResult {
    let q = QueryParams::parse(query.as_deref(), &["msg", "err"]).map_err(error_page)?;
    let now = Utc::now();
    let ledger = state.ledger();
    let (numbers, minutes) = tokio::try_join!(
        ledger.overview(now - Duration::minutes(15)),
        ledger.runs_per_minute(chart_start(now)),
    )
    .map_err(|e| error_page(e.into()))?;
    let mut body = format!("<h1>Overview</h1>{}<div class=\"cards\">", flashes(&q));
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
    body.push_str(
        &super::alerts::sections(&state, &caller)
            .await
            .map_err(error_page)?,
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
    let mut counts = vec![(0i64, 0i64, 0i64, 0i64); slots];
    for m in minutes {
        let i = usize::try_from((m.minute - start).num_minutes()).unwrap_or(usize::MAX);
        if let Some(c) = counts.get_mut(i) {
            match m.status.as_str() {
                "succeeded" => c.0 += m.count,
                "failed" | "dead" => c.1 += m.count,
                "cancelled" => c.3 += m.count,
                _ => c.2 += m.count,
            }
        }
    }
    let peak = counts
        .iter()
        .map(|c| c.0 + c.1 + c.2 + c.3)
        .max()
        .unwrap_or(0)
        .max(1);
    let (w, h) = (4usize, 80f64);
    let mut svg = format!(
        "<svg class=\"chart\" width=\"{}\" height=\"{}\" role=\"img\" aria-label=\"fires per minute\">",
        slots * w,
        h + 2.0
    );
    for (i, (ok, bad, other, cancelled)) in counts.iter().enumerate() {
        let mut y = h;
        for (n, class) in [
            (ok, "ok"),
            (bad, "bad"),
            (cancelled, "cancelled"),
            (other, "other"),
        ] {
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
    let _ = write!(svg, "</svg><div class=\"muted\">peak {peak} fires/min; green succeeded, red failed or dead, grey cancelled, blue unfinished</div>");
    svg
}
