//! The web view under `/ui` on the API listener: an overview (with recent
//! alerts and failed alert deliveries), schedules,
//! one schedule with its actions, runs and one run.
//!
//! Server-rendered HTML from the same ledger queries the API uses, plus one
//! stylesheet and one small script (compiled into the binary; nothing to
//! build or serve separately). Pages read bounded, indexed data (a page of
//! schedules with their last fires, a page of runs, one hour-bucketed range
//! for the chart), so an open tab refreshing every few seconds costs the
//! database little. Auth is the API's: a bearer token, which a browser
//! presents as the `belfry_token` cookie set by `/ui/login`; read-only
//! tokens see everything and get no buttons. Actions are `POST` forms to the
//! same operations the API runs, refused cross-site like the API.

pub mod html;
mod pages;

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;

use crate::api::ApiState;

/// The stylesheet.
const CSS: &str = include_str!("assets/ui.css");
/// The refresh script.
const JS: &str = include_str!("assets/ui.js");

/// The name of the cookie a browser presents its token in.
pub const TOKEN_COOKIE: &str = "belfry_token";

/// The web view's routes (merged into the API router, behind its auth).
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/ui", get(pages::overview))
        .route("/ui/", get(pages::overview))
        .route("/ui/schedules", get(pages::schedules))
        .route("/ui/schedules/{name}", get(pages::schedule))
        .route("/ui/schedules/{name}/{action}", post(pages::act))
        .route("/ui/runs", get(pages::runs))
        .route("/ui/runs/{id}", get(pages::run))
        .route("/ui/runs/{id}/cancel", post(pages::cancel))
        // The run page's live log: the API's stream, where the web view's
        // cookie signs in (a reader may follow it; it changes nothing).
        .route(
            "/ui/runs/{id}/logs/stream",
            get(crate::api::run_logs::stream),
        )
        .route("/ui/alerts/test", post(pages::test_alert))
        .route("/ui/login", get(pages::login_form).post(pages::login))
        .route("/ui/logout", post(pages::logout))
        .route(
            "/ui/assets/ui.css",
            get(|| asset("text/css; charset=utf-8", CSS)),
        )
        .route(
            "/ui/assets/ui.js",
            get(|| asset("text/javascript; charset=utf-8", JS)),
        )
}

async fn asset(kind: &'static str, body: &'static str) -> impl IntoResponse {
    ([(CONTENT_TYPE, kind), (CACHE_CONTROL, "max-age=300")], body)
}
