//! The generic webhook channel: the alert's JSON body (see
//! `docs/alert-webhook.schema.json`) `POST`ed with Standard Webhooks
//! headers, signed with the channel's secret (see [`crate::signature`]).
//!
//! Headers: `webhook-id` (the delivery's id: the same on every attempt,
//! for receivers that drop repeats), `webhook-timestamp` (Unix seconds of
//! this attempt), `webhook-signature` (`v1,<base64>`), and the same
//! signature as `X-Belfry-Signature` for receivers written against
//! belfry's own name; `X-Belfry-Event` carries the kind.

use std::time::Duration;

use crate::channel::{http_result, SendOutcome};
use crate::message::AlertMessage;
use crate::signature;

/// Answers after which a webhook is given up at once.
const PERMANENT: [u16; 6] = [400, 404, 405, 410, 413, 422];

/// A webhook channel's sender.
pub struct WebhookSender {
    url: String,
    key: Vec<u8>,
    client: reqwest::Client,
}

impl std::fmt::Debug for WebhookSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSender")
            .field("url", &self.url)
            .field("key", &"***")
            .finish()
    }
}

/// An HTTP client with `timeout` per request, no redirects (a redirect
/// would re-send the signed body somewhere the operator did not name).
pub(crate) fn http_client(timeout: Duration) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("belfry/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

impl WebhookSender {
    /// A sender to `url`, signing with `secret`.
    ///
    /// # Errors
    ///
    /// The reason, when the HTTP client cannot be built.
    pub fn new(url: &str, secret: &str, timeout: Duration) -> Result<Self, String> {
        Ok(Self {
            url: url.to_owned(),
            key: signature::key_of(secret),
            client: http_client(timeout)?,
        })
    }

    /// One attempt.
    pub async fn send(&self, message: &AlertMessage) -> SendOutcome {
        let body = match serde_json::to_vec(&message.body) {
            Ok(body) => body,
            Err(e) => return SendOutcome::Permanent(format!("cannot encode the body: {e}")),
        };
        let id = message.body.data.delivery_id.to_string();
        let timestamp = chrono::Utc::now().timestamp();
        let signed = signature::sign(&self.key, &id, timestamp, &body);
        let answer = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", &signed)
            .header("X-Belfry-Signature", &signed)
            .header("X-Belfry-Event", &message.body.kind)
            .body(body)
            .send()
            .await;
        http_result(answer, &PERMANENT).await
    }
}
