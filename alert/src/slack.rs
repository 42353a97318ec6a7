//! The Slack channel: an incoming webhook's documented body (`text` as the
//! notification fallback, `blocks` for the message: a header, a section
//! with the summary in `mrkdwn`, a context line), which Slack-compatible
//! receivers (Mattermost, Rocket.Chat, ...) take too.
//!
//! Slack's limits are kept: a header's text at most 150 characters, a
//! section's at most 3000, `&`, `<` and `>` escaped (they are its link
//! syntax). Slack answers 200 `ok`; 400 (`invalid_payload`), 403
//! (`action_prohibited`, a revoked hook), 404 (`channel_not_found`,
//! a deleted hook) and 410 (`channel_is_archived`) are final; 429 and
//! 5xx are retried.

use std::time::Duration;

use serde_json::{json, Value};

use crate::channel::{http_result, SendOutcome};
use crate::config::Secret;
use crate::message::{clip, AlertMessage};
use crate::webhook::http_client;

/// The 4xx answers a Slack hook is retried after; every other one (400
/// `invalid_payload`, 403 a revoked hook, 404 a deleted one, 410 an
/// archived channel) and a 3xx is final.
const RETRIED_4XX: [u16; 2] = [408, 429];

/// A Slack channel's sender.
#[derive(Debug)]
pub struct SlackSender {
    url: Secret,
    client: reqwest::Client,
}

/// `text` with Slack's three control characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The body Slack's incoming webhooks take, for `message`.
pub fn slack_body(message: &AlertMessage) -> Value {
    let d = &message.body.data;
    let mut context = vec![format!(
        "{} · {}",
        message.body.kind, message.body.timestamp
    )];
    if let Some(key) = &d.run_key {
        context.push(format!("run `{}`", escape(key)));
    }
    let mut blocks = vec![
        json!({
            "type": "header",
            "text": {"type": "plain_text", "text": clip(&message.title, 150)}
        }),
        json!({
            "type": "section",
            "text": {"type": "mrkdwn", "text": clip(&escape(&d.summary), 3000)}
        }),
        json!({
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": clip(&context.join(" · "), 3000)}]
        }),
    ];
    if let Some(url) = &d.url {
        blocks.push(json!({
            "type": "section",
            "text": {"type": "mrkdwn", "text": format!("<{}|Open in belfry>", escape(url))}
        }));
    }
    json!({
        "text": clip(&format!("{}: {}", message.title, escape(&d.summary)), 3000),
        "blocks": blocks,
    })
}

impl SlackSender {
    /// A sender to the hook at `url`.
    ///
    /// # Errors
    ///
    /// The reason, when the HTTP client cannot be built.
    pub fn new(url: Secret, timeout: Duration) -> Result<Self, String> {
        Ok(Self {
            url,
            client: http_client(timeout)?,
        })
    }

    /// One attempt.
    pub async fn send(&self, message: &AlertMessage) -> SendOutcome {
        let answer = self
            .client
            .post(self.url.expose())
            .json(&slack_body(message))
            .send()
            .await;
        http_result(answer, &RETRIED_4XX).await
    }
}
