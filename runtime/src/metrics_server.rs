//! The Prometheus endpoint: `GET /metrics` on `BELFRY_METRICS_ADDR`.
//!
//! Each binary builds a [`Registry`] of its own metrics (the scheduler's
//! fires and claims, the worker's jobs and attempts) and serves it here.
//! The text is OpenMetrics (what `prometheus-client` writes; Prometheus
//! scrapes it natively). Port `0` picks a free port; the bound address is
//! logged and returned, so several processes can share a host.
//!
//! Behind the `metrics-server` feature (it brings in the HTTP server); the
//! encoding helpers that collectors use are in [`crate::metrics`].

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// The endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound.
    #[error("BELFRY_METRICS_ADDR={addr}: cannot listen: {source}; use host:port (port 0 picks a free one) or unset it")]
    Bind {
        /// The configured address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The OpenMetrics content type.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `registry` at `/metrics` on `addr` until `cancel`; returns the
/// bound address once listening.
///
/// # Errors
///
/// [`MetricsError::Bind`] when `addr` cannot be listened on.
pub async fn serve(
    addr: &str,
    registry: Arc<Registry>,
    cancel: CancellationToken,
) -> Result<SocketAddr, MetricsError> {
    let (listener, bound) = listen(addr).await.map_err(|source| MetricsError::Bind {
        addr: addr.to_owned(),
        source,
    })?;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move {
                let mut body = String::new();
                // Encoding into a String cannot fail (fmt::Write on String).
                let _ = prometheus_client::encoding::text::encode(&mut body, &registry);
                ([(CONTENT_TYPE, CONTENT_TYPE_OPENMETRICS)], body)
            }
        }),
    );
    tracing::info!(addr = %bound, "metrics endpoint listening on /metrics");
    spawn_graceful(listener, app, cancel, "metrics endpoint");
    Ok(bound)
}

/// Binds a TCP listener on `addr` (`host:port`; port `0` picks a free
/// one) and returns it with the address it bound.
///
/// # Errors
///
/// The I/O error of binding or of reading the bound address back.
pub async fn listen(addr: &str) -> std::io::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Serves `app` on `listener` in a task of its own until `cancel`; `what`
/// names the server in the log line if serving ends with an error.
///
/// Graceful: at `cancel` the listener stops accepting and requests in
/// flight (a scrape, an API call) finish. The metrics endpoint and the
/// scheduler's API both stop this way.
pub fn spawn_graceful(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    cancel: CancellationToken,
    what: &'static str,
) {
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "{what} stopped");
        }
    });
}
