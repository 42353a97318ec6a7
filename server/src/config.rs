//! The `belfry-scheduler` process's configuration: the engine's
//! ([`SchedulerConfig`], every variable it documents) plus the REST API's
//! and web view's, from environment variables.
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `BELFRY_API_ADDR` | `127.0.0.1:8080` | `host:port` of the REST API; port `0` picks a free one (logged); `off` disables it |
//! | `BELFRY_API_ADMIN_TOKENS` | unset | comma-separated `name:secret` bearer tokens that may change things (secrets ≥ 16 characters) |
//! | `BELFRY_API_READ_TOKENS` | unset | the same for read-only tokens; with neither set the API is open and only listens on loopback |
//! | `BELFRY_ALERTS` | unset (no alerts sent; events still recorded) | path of the alerts file: channels (webhook, Slack, e-mail), routes, throttling (see `belfry_alert::config` and the README's Alerts section) |
//! | `BELFRY_TRACE_UI_URL` | unset | link for trace ids in the web view, `{trace_id}` replaced (e.g. `http://127.0.0.1:16686/trace/{trace_id}`) |

use belfry_runtime::{SettingError, Settings};
use belfry_scheduler::SchedulerConfig;

use crate::api::Tokens;

/// Default address of the REST API.
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:8080";

/// Everything a `belfry-scheduler` process needs to start.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The replica's own settings (services, timing, retention, metrics).
    pub scheduler: SchedulerConfig,
    /// Where the REST API listens (`BELFRY_API_ADDR`); `None`: off.
    pub api_addr: Option<String>,
    /// API bearer tokens (secrets never shown by `Debug`).
    pub api_tokens: Tokens,
    /// The trace UI link template of the web view (`BELFRY_TRACE_UI_URL`).
    pub trace_ui: Option<String>,
    /// The alert channels and routes (`BELFRY_ALERTS`); `None`: unset.
    pub alerts: Option<belfry_alert::AlertsConfig>,
}

impl ServerConfig {
    /// Reads the configuration from `settings`.
    ///
    /// # Errors
    ///
    /// [`SettingError`] naming the variable whose value is invalid (a
    /// token's secret is never echoed back).
    pub fn from_settings(settings: &Settings) -> Result<Self, SettingError> {
        let alerts = belfry_alert::AlertsConfig::from_settings(settings).map_err(|e| {
            SettingError::Invalid {
                var: belfry_alert::ALERTS_VAR.into(),
                value: settings.string(belfry_alert::ALERTS_VAR, ""),
                reason: e.to_string(),
            }
        })?;
        Ok(Self {
            alerts,
            scheduler: SchedulerConfig::from_settings(settings)?,
            api_addr: match settings.string("BELFRY_API_ADDR", DEFAULT_API_ADDR).trim() {
                "off" | "-" => None,
                addr => Some(addr.to_owned()),
            },
            api_tokens: Tokens::parse(
                settings.get("BELFRY_API_ADMIN_TOKENS"),
                settings.get("BELFRY_API_READ_TOKENS"),
            )
            .map_err(|e| SettingError::Invalid {
                var: e.variable.into(),
                // Never echo a secret back.
                value: "(hidden)".into(),
                reason: e.message,
            })?,
            trace_ui: match settings.get("BELFRY_TRACE_UI_URL").map(str::trim) {
                None => None,
                Some(t)
                    if (t.starts_with("http://") || t.starts_with("https://"))
                        && t.contains("{trace_id}") =>
                {
                    Some(t.to_owned())
                }
                Some(t) => {
                    return Err(SettingError::Invalid {
                        var: "BELFRY_TRACE_UI_URL".into(),
                        value: t.to_owned(),
                        reason: "expected an http:// or https:// URL containing {trace_id}, \
                                 e.g. http://127.0.0.1:16686/trace/{trace_id}"
                            .into(),
                    })
                }
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_defaults_switches_and_hidden_secrets() {
        let c = ServerConfig::from_settings(&Settings::from_pairs([(
            "DATABASE_URL",
            "postgres://app:hunter2@db/belfry",
        )]))
        .unwrap();
        assert_eq!(c.api_addr.as_deref(), Some("127.0.0.1:8080"));
        let c = ServerConfig::from_settings(&Settings::from_pairs([
            ("BELFRY_API_ADDR", "off"),
            (
                "BELFRY_API_ADMIN_TOKENS",
                "ops:correct-horse-battery-staple",
            ),
        ]))
        .unwrap();
        assert_eq!(c.api_addr, None);
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("horse") && !shown.contains("hunter2"),
            "{shown}"
        );
        let e = ServerConfig::from_settings(&Settings::from_pairs([(
            "BELFRY_API_READ_TOKENS",
            "grafana:tooshort",
        )]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("BELFRY_API_READ_TOKENS") && !e.contains("tooshort"),
            "{e}"
        );
    }

    #[test]
    fn trace_ui_links_must_be_http_templates() {
        let ok = ServerConfig::from_settings(&Settings::from_pairs([(
            "BELFRY_TRACE_UI_URL",
            "http://jaeger:16686/trace/{trace_id}",
        )]))
        .unwrap();
        assert_eq!(
            ok.trace_ui.as_deref(),
            Some("http://jaeger:16686/trace/{trace_id}")
        );
        for bad in [
            "javascript:alert(1)//{trace_id}",
            "http://jaeger:16686/search",
        ] {
            let e =
                ServerConfig::from_settings(&Settings::from_pairs([("BELFRY_TRACE_UI_URL", bad)]))
                    .unwrap_err()
                    .to_string();
            assert!(e.contains("BELFRY_TRACE_UI_URL"), "{e}");
        }
    }
}
