//! The REST API every scheduler replica serves on `BELFRY_API_ADDR`:
//! schedules, runs, manual triggers, backfills and ad-hoc jobs, without SQL.
//!
//! Resources live under `/v1/`; `/healthz`, `/readyz` and `/openapi.json`
//! sit beside them (the OpenAPI document is generated from the handlers
//! and `belfry-api-types`, see [`doc`]). Every replica can answer every request: all state is in
//! the ledger, and a change reaches every replica's timer through the
//! `schedules` table's notifications. Errors share one shape
//! ([`error::ApiError`]); tokens and roles are in [`auth`].

pub mod alerts;
pub mod auth;
pub mod doc;
pub mod error;
pub mod health;
pub mod input;
pub mod jobs;
pub mod run_logs;
pub mod runs;
pub mod schedules;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio_util::sync::CancellationToken;

use belfry_dispatch::Client;

pub use auth::{Caller, Role, Tokens};
use belfry_scheduler::ops::Ops;
use belfry_scheduler::replica::Replica;
pub use error::ApiError;

/// What every handler shares.
#[derive(Clone)]
pub struct ApiState {
    inner: Arc<Inner>,
}

struct Inner {
    ops: Ops,
    client: Client,
    tokens: Tokens,
    trace_ui: Option<String>,
    alerts: Option<Arc<belfry_alert::AlertDeliverer>>,
    /// Open log streams (`/v1/runs/{id}/logs/stream`, and the web view's):
    /// each reads the ledger every 250 ms, so their number is bounded.
    log_streams: Arc<tokio::sync::Semaphore>,
}

impl ApiState {
    /// The API of `replica`, guarded by `tokens` (none: open).
    pub fn new(replica: Arc<Replica>, tokens: Tokens) -> Self {
        let client = Client::new(
            replica.ledger().clone(),
            replica.broker().clone(),
            replica.instance(),
        );
        Self {
            inner: Arc::new(Inner {
                ops: Ops::new(replica),
                client,
                tokens,
                trace_ui: None,
                alerts: None,
                log_streams: Arc::new(tokio::sync::Semaphore::new(run_logs::MAX_LOG_STREAMS)),
            }),
        }
    }

    /// Tells the API how long finished runs are kept (`BELFRY_RETENTION`):
    /// a backfill reaching further back is refused, since fires that ran
    /// there may have been pruned and would run again.
    pub fn with_retention(mut self, retention: Option<std::time::Duration>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.ops = inner.ops.clone().with_retention(retention);
        }
        self
    }

    /// The operator actions the handlers (and the web view) call.
    pub(crate) fn ops(&self) -> &Ops {
        &self.inner.ops
    }

    /// Links trace ids in the web view to a trace UI: `template` with
    /// `{trace_id}` replaced (`BELFRY_TRACE_UI_URL`, e.g.
    /// `http://jaeger:16686/trace/{trace_id}`).
    pub fn with_trace_ui(mut self, template: Option<String>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.trace_ui = template;
        }
        self
    }

    /// Lets the API list alert channels and send test alerts through
    /// `deliverer` (the replica's own).
    pub fn with_alerts(mut self, deliverer: Arc<belfry_alert::AlertDeliverer>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.alerts = Some(deliverer);
        }
        self
    }

    /// Bounds the log streams open at once to `max` (default
    /// [`run_logs::MAX_LOG_STREAMS`]); a stream past it is refused with 503.
    pub fn with_max_log_streams(mut self, max: usize) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.log_streams = Arc::new(tokio::sync::Semaphore::new(max));
        }
        self
    }

    /// The bound of open log streams.
    pub(crate) fn log_streams(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.inner.log_streams
    }

    pub(crate) fn alerts(&self) -> Option<&belfry_alert::AlertDeliverer> {
        self.inner.alerts.as_deref()
    }

    pub(crate) fn trace_ui(&self) -> Option<&str> {
        self.inner.trace_ui.as_deref()
    }

    pub(crate) fn replica(&self) -> &Arc<Replica> {
        self.inner.ops.replica()
    }

    pub(crate) fn ledger(&self) -> &belfry_ledger::Ledger {
        self.replica().ledger()
    }

    pub(crate) fn client(&self) -> &Client {
        &self.inner.client
    }

    pub(crate) fn tokens(&self) -> &Tokens {
        &self.inner.tokens
    }
}

/// The API's routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/openapi.json", get(health::openapi))
        .route(
            "/v1/schedules",
            get(schedules::list).post(schedules::create),
        )
        .route(
            "/v1/schedules/{name}",
            get(schedules::get_one)
                .put(schedules::replace)
                .delete(schedules::delete),
        )
        .route("/v1/schedules/{name}/pause", post(schedules::pause))
        .route("/v1/schedules/{name}/resume", post(schedules::resume))
        .route("/v1/schedules/{name}/trigger", post(schedules::trigger))
        .route("/v1/schedules/{name}/backfill", post(schedules::backfill))
        .route("/v1/schedules/{name}/preview", get(schedules::preview))
        .route("/v1/runs", get(runs::list))
        .route("/v1/runs/{id}", get(runs::get_one))
        .route("/v1/runs/{id}/cancel", post(runs::cancel))
        .route("/v1/runs/{id}/logs", get(run_logs::page))
        .route("/v1/runs/{id}/logs/stream", get(run_logs::stream))
        .route("/v1/jobs", post(jobs::enqueue))
        .route("/v1/alerts", get(alerts::list))
        .route("/v1/alerts/test", post(alerts::test))
        .merge(crate::ui::routes())
        .fallback(|| async { ApiError::not_found("no such path; see /openapi.json") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        // Checked before a handler reads the body, so an oversized body is
        // refused without being buffered.
        .layer(DefaultBodyLimit::max(input::MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authorize,
        ))
        .with_state(state)
}

/// The API could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be resolved or bound.
    #[error(
        "BELFRY_API_ADDR={addr}: cannot listen: {source}; use host:port (port 0 picks a free one)"
    )]
    Bind {
        /// The configured address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// An open API on a non-loopback address.
    #[error(
        "BELFRY_API_ADDR={addr} is reachable from other hosts but no token is configured; \
         set BELFRY_API_ADMIN_TOKENS (and BELFRY_API_READ_TOKENS), or listen on 127.0.0.1"
    )]
    OpenOnNetwork {
        /// The configured address.
        addr: String,
    },
}

/// Serves the API of `state` on `addr` until `cancel`; returns the bound
/// address once listening (port `0` picks a free port, logged).
///
/// # Errors
///
/// [`ServeError::OpenOnNetwork`] when no token is configured and `addr` is
/// not a loopback address; [`ServeError::Bind`] when it cannot be bound.
pub async fn serve(
    addr: &str,
    state: ApiState,
    cancel: CancellationToken,
) -> Result<SocketAddr, ServeError> {
    let (listener, bound) =
        belfry_runtime::metrics_server::listen(addr)
            .await
            .map_err(|source| ServeError::Bind {
                addr: addr.to_owned(),
                source,
            })?;
    // Checked on the bound address, so a host name resolving to a public
    // interface is caught too.
    if state.tokens().is_empty() && !bound.ip().is_loopback() {
        return Err(ServeError::OpenOnNetwork {
            addr: addr.to_owned(),
        });
    }
    tracing::info!(addr = %bound, auth = !state.tokens().is_empty(), "API listening on http://{bound}/v1/");
    belfry_runtime::metrics_server::spawn_graceful(listener, router(state), cancel, "API");
    Ok(bound)
}

/// One audit log line for a change by `caller` (see
/// [`belfry_scheduler::ops::audit`]).
pub fn audit(caller: &Caller, action: &str, schedule: &str, detail: &str) {
    belfry_scheduler::ops::audit(&caller.name, action, schedule, detail);
}
