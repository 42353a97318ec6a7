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
use crate::config::Secret;
use crate::message::AlertMessage;
use crate::signature;

/// The 4xx answers a webhook is retried after (a secret being rotated, a
/// receiver asking to slow down); every other 4xx, and a 3xx, is final.
const RETRIED_4XX: [u16; 4] = [401, 403, 408, 429];

/// A webhook channel's sender.
pub struct WebhookSender {
    url: Secret,
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
    pub fn new(url: Secret, secret: &str, timeout: Duration) -> Result<Self, String> {
        Ok(Self {
            url,
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
            .post(self.url.expose())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", &signed)
            .header("X-Belfry-Signature", &signed)
            .header("X-Belfry-Event", &message.body.kind)
            .body(body)
            .send()
            .await;
        http_result(answer, &RETRIED_4XX).await
    }
}
