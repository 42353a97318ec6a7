//! `http`: requests a URL. 2xx is success; 5xx, 429, connection errors and
//! timeouts are retryable; any other status (4xx) is permanent.
//!
//! Every request carries `x-belfry-run-id`, `x-belfry-job`,
//! `x-belfry-run-key` and `x-belfry-attempt`, so the receiver can make its
//! side effect idempotent per run.

use std::time::Duration;

use serde::Deserialize;

use crate::job::{Job, JobContext, JobError};

/// Payload of `http`: `{"url": "https://...", "method": "POST", "body": {...}}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpPayload {
    /// The URL to request.
    pub url: String,
    /// HTTP method; default `GET`.
    #[serde(default)]
    pub method: Option<String>,
    /// JSON body, sent with `content-type: application/json`.
    #[serde(default)]
    pub body: Option<serde_json::Value>,
    /// Per-request timeout in milliseconds; default 30 000.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// The `http` job type.
#[derive(Debug, Clone, Default)]
pub struct Http {
    client: reqwest::Client,
}

impl Job for Http {
    const TYPE: &'static str = "http";
    type Payload = HttpPayload;

    async fn run(&self, ctx: JobContext, p: HttpPayload) -> Result<(), JobError> {
        let method: reqwest::Method = p
            .method
            .as_deref()
            .unwrap_or("GET")
            .parse()
            .map_err(|_| JobError::permanent(format!("invalid HTTP method {:?}", p.method)))?;
        let url = reqwest::Url::parse(&p.url)
            .map_err(|e| JobError::permanent(format!("invalid url {:?}: {e}", p.url)))?;
        let mut request = self
            .client
            .request(method, url)
            .timeout(Duration::from_millis(p.timeout_ms.unwrap_or(30_000)))
            // Receivers can deduplicate on these: a run may be delivered
            // again after a crash, with the same id and run key.
            .header("x-belfry-run-id", ctx.run_id.to_string())
            .header("x-belfry-job", &ctx.job_name)
            .header("x-belfry-run-key", &ctx.run_key)
            .header("x-belfry-attempt", ctx.attempt.to_string());
        if let Some(body) = &p.body {
            request = request.json(body);
        }
        let response = tokio::select! {
            r = request.send() => r,
            _ = ctx.cancel.cancelled() => return Err(JobError::retryable("request cancelled")),
        };
        let response = response
            .map_err(|e| JobError::retryable(format!("request to {} failed: {e}", p.url)))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            Err(JobError::retryable(format!("{} answered {status}", p.url)))
        } else {
            Err(JobError::permanent(format!("{} answered {status}", p.url)))
        }
    }
}
