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

use belfry_api_types::{
    Liveness, LivenessStatus, Mode, Readiness, ReadinessStatus, RedisState, ServiceState,
};

use super::ApiState;

/// How long `/readyz` waits for the services.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `GET /healthz`.
#[utoipa::path(
    get, path = "/healthz", operation_id = "healthz", summary = "Liveness", security(()),
    responses((status = 200, description = "The process serves requests", body = Liveness)),
)]
pub async fn healthz() -> Json<Liveness> {
    Json(Liveness {
        status: LivenessStatus::Ok,
    })
}

/// `GET /readyz`.
#[utoipa::path(
    get, path = "/readyz", operation_id = "readyz", security(()),
    summary = "Readiness: Postgres and RabbitMQ required, Redis reported (embedded mode: its database)",
    responses(
        (status = 200, description = "Ready (or degraded: Redis down, claims exact through Postgres)", body = Readiness),
        (status = 503, description = "Not ready: Postgres or RabbitMQ down", body = Readiness),
    ),
)]
pub async fn readyz(State(state): State<ApiState>) -> (StatusCode, Json<Readiness>) {
    // A probe must answer quickly: a check that hangs (a half-open
    // connection) counts as down.
    let (ledger, broker, redis) =
        tokio::time::timeout(PROBE_TIMEOUT, state.replica().service_health())
            .await
            .unwrap_or((false, false, Some(false)));
    let ready = ledger && broker;
    let status = match (ready, redis) {
        (false, _) => ReadinessStatus::NotReady,
        (true, Some(false)) => ReadinessStatus::Degraded,
        (true, _) => ReadinessStatus::Ready,
    };
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let (ledger, broker) = (
        Some(ServiceState::of(ledger)),
        Some(ServiceState::of(broker)),
    );
    let mut body = Readiness {
        status,
        instance: state.replica().instance().to_string(),
        mode: Mode::Distributed,
        postgres: ledger,
        rabbitmq: broker,
        database: None,
        queue: None,
        redis: RedisState::of(redis),
        nodes: state
            .replica()
            .service_nodes()
            .current()
            .into_iter()
            .map(|(service, node)| (service.to_owned(), node))
            .collect(),
    };
    // The embedded mode has one database holding ledger and queue; its
    // answer names what it runs on instead of services it does not use.
    if state.ledger().is_embedded() {
        body = Readiness {
            mode: Mode::Embedded,
            postgres: None,
            rabbitmq: None,
            database: ledger,
            queue: broker,
            nodes: Default::default(),
            ..body
        };
    }
    (code, Json(body))
}

/// `GET /openapi.json`.
#[utoipa::path(
    get, path = "/openapi.json", operation_id = "openapi", summary = "This document", security(()),
    responses((status = 200, description = "OpenAPI 3 document", content_type = "application/json", body = Object)),
)]
pub async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], super::doc::document())
}
