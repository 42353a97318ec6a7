//! Signing in (a token kept as the `belfry_token` cookie) and out.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::{LOCATION, SET_COOKIE};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use crate::api::ApiState;
use crate::ui::html::{esc, page, url, Section};

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
        crate::ui::TOKEN_COOKIE,
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
        crate::ui::TOKEN_COOKIE
    );
    (
        StatusCode::SEE_OTHER,
        [(LOCATION, "/ui/login".to_owned()), (SET_COOKIE, cookie)],
    )
        .into_response()
}
