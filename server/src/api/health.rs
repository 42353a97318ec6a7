//! Liveness, readiness and the API description.
//!
//! `/healthz` answers while the process serves requests. `/readyz` checks
//! the services: Postgres and RabbitMQ are required (503 when either is
//! down: this replica can neither claim nor publish), Redis is reported
//! but optional (claims stay exact through the ledger without it, so a
//! Redis outage leaves the replica ready, `"degraded"`).

use axum::extract::State;
use axum::http::{header::CONTENT_TYPE, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::ApiState;

/// How long `/readyz` waits for the services.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `GET /healthz`.
pub async fn healthz() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`.
pub async fn readyz(State(state): State<ApiState>) -> impl IntoResponse {
    // A probe must answer quickly: a check that hangs (a half-open
    // connection) counts as down.
    let (postgres, rabbitmq, redis) =
        tokio::time::timeout(PROBE_TIMEOUT, state.replica().service_health())
            .await
            .unwrap_or((false, false, Some(false)));
    let up = |ok: bool| if ok { "up" } else { "down" };
    let ready = postgres && rabbitmq;
    let status = match (ready, redis) {
        (false, _) => "not_ready",
        (true, Some(false)) => "degraded",
        (true, _) => "ready",
    };
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    // The embedded mode has one database holding ledger and queue; its
    // answer names what it runs on instead of services it does not use.
    let body = if state.ledger().is_embedded() {
        json!({
            "status": status,
            "instance": state.replica().instance(),
            "mode": "embedded",
            "database": up(postgres),
            "queue": up(rabbitmq),
            "redis": redis.map_or("disabled", up),
        })
    } else {
        json!({
            "status": status,
            "instance": state.replica().instance(),
            "mode": "distributed",
            "postgres": up(postgres),
            "rabbitmq": up(rabbitmq),
            "redis": redis.map_or("disabled", up),
        })
    };
    (code, Json(body))
}

/// `GET /openapi.json`.
pub async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], super::OPENAPI_JSON)
}
