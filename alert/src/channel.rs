//! The channels alerts are sent on, built once from the configuration,
//! and what one attempt at sending came to.
//!
//! What is retried and what is given up at once: a receiver that answers
//! that it will never take this message (an HTTP 3xx, since redirects are
//! not followed, or a 4xx other than 401, 403, 408 and 429; an SMTP 5xx)
//! gets it given up with the answer as the reason; a timeout, a refused
//! connection, an HTTP 401/403/408/429/5xx or an SMTP 4xx is retried with
//! back-off (a `Retry-After` is honoured) until `give_up_after`, so a
//! receiver that is down or a secret being rotated gets its alerts once it
//! is back. (Slack answers 403 for hooks that were revoked: permanent
//! there.) Each attempt is bounded by the channel's `timeout` as a whole
//! (an SMTP exchange is several commands, each with its own timeout).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::{AlertsConfig, ChannelConfig, ChannelKind};
use crate::email::EmailSender;
use crate::message::AlertMessage;
use crate::slack::SlackSender;
use crate::webhook::WebhookSender;
use crate::AlertError;

/// What one attempt at sending came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// Accepted.
    Delivered,
    /// Not now: try again (after this long, if the receiver said).
    Retry {
        /// The receiver's `Retry-After`, if any.
        after: Option<Duration>,
        /// What went wrong.
        error: String,
    },
    /// Never: the receiver refuses this message, or the channel cannot
    /// send it.
    Permanent(String),
}

/// The longest `Retry-After` honoured (a longer one waits this long).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The outcome of an HTTP answer with `status`, for a receiver whose
/// 4xx answers other than `retried_4xx` are permanent refusals;
/// `retry_after` is the header's value; `body` the start of the answer
/// (for the reason).
pub(crate) fn http_outcome(
    status: reqwest::StatusCode,
    retry_after: Option<&str>,
    body: &str,
    retried_4xx: &[u16],
) -> SendOutcome {
    if status.is_success() {
        return SendOutcome::Delivered;
    }
    let error = format!(
        "HTTP {status}{}{}",
        if body.is_empty() { "" } else { ": " },
        crate::message::clip(body.trim(), 300)
    );
    let permanent = status.is_redirection()
        || (status.is_client_error() && !retried_4xx.contains(&status.as_u16()));
    if permanent {
        return SendOutcome::Permanent(error);
    }
    let after = retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER));
    SendOutcome::Retry { after, error }
}

/// The outcome of an HTTP request's `answer` (see [`http_outcome`]); a
/// request that got no answer is retried.
pub(crate) async fn http_result(
    answer: Result<reqwest::Response, reqwest::Error>,
    retried_4xx: &[u16],
) -> SendOutcome {
    match answer {
        Err(e) => SendOutcome::Retry {
            after: None,
            error: request_error(e),
        },
        Ok(answer) => {
            let status = answer.status();
            let retry_after = answer
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let text = answer.text().await.unwrap_or_default();
            http_outcome(status, retry_after.as_deref(), &text, retried_4xx)
        }
    }
}

/// The reason of a failed HTTP request (no secret: URLs are left out,
/// since a Slack hook's URL is one).
fn request_error(e: reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let e = e.without_url();
    let mut reason = format!("{what}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        reason.push_str(&format!(": {s}"));
        source = s.source();
    }
    reason
}

/// One channel's sender.
#[derive(Debug)]
enum Sender {
    Webhook(WebhookSender),
    Slack(SlackSender),
    Email(EmailSender),
}

/// Every configured channel, ready to send.
#[derive(Debug)]
pub struct Channels {
    senders: BTreeMap<String, (Sender, Duration)>,
}

impl Channels {
    /// Builds the senders of `config`'s channels.
    ///
    /// # Errors
    ///
    /// [`AlertError::Channel`] when a channel's TLS settings cannot be
    /// used (a CA file that holds no certificate).
    pub fn new(config: &AlertsConfig) -> Result<Self, AlertError> {
        let mut senders = BTreeMap::new();
        for (name, channel) in &config.channels {
            senders.insert(name.clone(), (Self::sender(channel)?, channel.timeout));
        }
        Ok(Self { senders })
    }

    fn sender(channel: &ChannelConfig) -> Result<Sender, AlertError> {
        let wrong = |reason: String| AlertError::Channel {
            channel: channel.name.clone(),
            reason,
        };
        Ok(match &channel.kind {
            ChannelKind::Webhook { url, secret } => Sender::Webhook(
                WebhookSender::new(url.clone(), secret.expose(), channel.timeout).map_err(wrong)?,
            ),
            ChannelKind::Slack { url } => {
                Sender::Slack(SlackSender::new(url.clone(), channel.timeout).map_err(wrong)?)
            }
            ChannelKind::Email { .. } => Sender::Email(EmailSender::new(channel).map_err(wrong)?),
        })
    }

    /// Sends `message` on channel `name`, within the channel's timeout.
    pub async fn send(&self, name: &str, message: &AlertMessage) -> SendOutcome {
        let Some((sender, timeout)) = self.senders.get(name) else {
            return SendOutcome::Permanent(format!(
                "no channel {name:?} in BELFRY_ALERTS: define it, or remove the name"
            ));
        };
        let sending = async {
            match sender {
                Sender::Webhook(w) => w.send(message).await,
                Sender::Slack(s) => s.send(message).await,
                Sender::Email(e) => e.send(message).await,
            }
        };
        match tokio::time::timeout(*timeout, sending).await {
            Ok(outcome) => outcome,
            Err(_) => SendOutcome::Retry {
                after: None,
                error: format!(
                    "no answer within the channel's timeout ({})",
                    humantime::format_duration(*timeout)
                ),
            },
        }
    }

    /// Whether channel `name` is configured.
    pub fn contains(&self, name: &str) -> bool {
        self.senders.contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;

    #[test]
    fn answers_are_delivered_retried_or_given_up() {
        let retried = [401, 403, 408, 429];
        let o = |code: u16, retry_after: Option<&str>| {
            http_outcome(
                StatusCode::from_u16(code).unwrap(),
                retry_after,
                "no",
                &retried,
            )
        };
        assert_eq!(o(204, None), SendOutcome::Delivered);
        assert!(matches!(o(410, None), SendOutcome::Permanent(e) if e.contains("410")));
        assert!(matches!(o(415, None), SendOutcome::Permanent(_)));
        assert!(matches!(o(301, None), SendOutcome::Permanent(_)));
        assert!(matches!(
            o(503, None),
            SendOutcome::Retry { after: None, .. }
        ));
        assert!(matches!(o(401, None), SendOutcome::Retry { .. }));
        assert_eq!(
            o(429, Some("7")),
            SendOutcome::Retry {
                after: Some(Duration::from_secs(7)),
                error: "HTTP 429 Too Many Requests: no".into()
            }
        );
        // A huge Retry-After is capped.
        assert!(matches!(
            o(429, Some("99999999")),
            SendOutcome::Retry { after: Some(d), .. } if d == MAX_RETRY_AFTER
        ));
    }
}
