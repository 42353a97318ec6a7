//! The alert configuration: the TOML file `BELFRY_ALERTS` names, with the
//! secrets it refers to read from the environment.
//!
//! ```toml
//! throttle = "5m"          # default window of every route: at most one alert
//!                          # per schedule per channel per window ("0s": none)
//! give_up_after = "24h"    # a delivery still failing this long after its event is given up
//! retry_initial = "10s"    # first retry delay, doubled per attempt ...
//! retry_max = "10m"        # ... up to this
//! public_url = "https://belfry.example.com"   # optional: links to the web view
//!
//! [channels.ops-webhook]
//! type = "webhook"
//! url = "https://hooks.example.com/belfry"
//! secret_env = "OPS_WEBHOOK_SECRET"   # the signing secret (Standard Webhooks whsec_... or any text)
//! timeout = "10s"
//!
//! [channels.team-slack]
//! type = "slack"
//! url_env = "TEAM_SLACK_WEBHOOK_URL"   # an incoming-webhook URL is a secret
//!
//! [channels.oncall-mail]
//! type = "email"
//! smtp = "smtp.example.com:587"
//! tls = "starttls"          # starttls (default) | tls (implicit, port 465) | none (127.0.0.1 only)
//! username_env = "SMTP_USER"
//! password_env = "SMTP_PASSWORD"
//! from = "belfry <belfry@example.com>"
//! to = ["oncall@example.com"]
//!
//! [[routes]]
//! channels = ["oncall-mail", "team-slack"]
//! events = ["run.failed", "run.dead", "fire.skipped"]   # default: every kind but alert.test
//! job_types = ["billing"]                                # default: any
//! names = ["nightly-*"]                                  # glob on the schedule/job name; default: any
//! throttle = "15m"                                       # default: the file's throttle
//! ```
//!
//! A schedule can also name channels itself (`alerts = ["ops-webhook"]`
//! in its definition): they get every event of that schedule, throttled
//! by the file's `throttle`.
//!
//! Secrets are only ever named here (`*_env`): their values are read from
//! the environment at start, never logged, and a missing one stops the
//! start with the variable named.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use belfry_ledger::{AlertEvent, AlertKind, AlertRoute};
use belfry_runtime::Settings;
use serde::Deserialize;

use crate::name_pattern::NamePattern;
use crate::AlertError;

/// The environment variable naming the alerts file.
pub const ALERTS_VAR: &str = "BELFRY_ALERTS";

/// Default throttling window of a route.
pub const DEFAULT_THROTTLE: Duration = Duration::from_secs(300);
/// Default time after which a failing delivery is given up.
pub const DEFAULT_GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Default first retry delay.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_secs(10);
/// Default longest retry delay.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(600);
/// Default timeout of one webhook or Slack request.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Default timeout of one SMTP exchange.
pub const DEFAULT_SMTP_TIMEOUT: Duration = Duration::from_secs(30);

/// A secret read from the environment: printed as `***` everywhere.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub(crate) String);

impl Secret {
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// How an e-mail channel secures its SMTP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// Plain connection upgraded with STARTTLS, which is required (never
    /// falls back to plaintext). Port 587 by default.
    Starttls,
    /// TLS from the first byte (port 465 by default).
    Tls,
    /// No TLS: only for an SMTP relay on the loopback interface.
    None,
}

/// What a channel sends to.
#[derive(Debug, Clone)]
pub enum ChannelKind {
    /// A generic webhook: JSON body, signed (Standard Webhooks).
    Webhook {
        /// Where to `POST` (may hold a token: shown without its path).
        url: Secret,
        /// The signing key (whsec_ base64 decoded, or the text's bytes).
        secret: Secret,
    },
    /// A Slack incoming webhook (or a compatible one: Mattermost, ...).
    Slack {
        /// The hook's URL (a secret).
        url: Secret,
    },
    /// E-mail over SMTP.
    Email {
        /// The relay's host.
        host: String,
        /// Its port.
        port: u16,
        /// How the connection is secured.
        tls: SmtpTls,
        /// A CA (PEM) to trust besides the built-in roots.
        ca_pem: Option<Vec<u8>>,
        /// Login, if the relay wants one.
        credentials: Option<(Secret, Secret)>,
        /// The sender.
        from: String,
        /// The recipients.
        to: Vec<String>,
    },
}

/// One configured channel.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// Its name (what routes and schedules refer to).
    pub name: String,
    /// What it sends to.
    pub kind: ChannelKind,
    /// Timeout of one attempt.
    pub timeout: Duration,
}

impl ChannelConfig {
    /// `webhook`, `slack` or `email`.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            ChannelKind::Webhook { .. } => "webhook",
            ChannelKind::Slack { .. } => "slack",
            ChannelKind::Email { .. } => "email",
        }
    }

    /// Where it sends, without secrets (for listings): a webhook's
    /// scheme and host only, since its path or query may hold a token.
    pub fn target(&self) -> String {
        match &self.kind {
            ChannelKind::Webhook { url, .. } => match url::Url::parse(url.expose()) {
                Ok(u) => format!(
                    "{}://{}{}/…",
                    u.scheme(),
                    u.host_str().unwrap_or(""),
                    u.port().map(|p| format!(":{p}")).unwrap_or_default()
                ),
                Err(_) => "(webhook)".into(),
            },
            ChannelKind::Slack { .. } => "(Slack incoming webhook)".into(),
            ChannelKind::Email { host, port, to, .. } => {
                format!("{} via {host}:{port}", to.join(", "))
            }
        }
    }
}

/// One `[[routes]]` table: which events go to which channels.
#[derive(Debug, Clone)]
pub struct Route {
    /// The channels.
    pub channels: Vec<String>,
    /// The kinds it takes.
    pub events: HashSet<AlertKind>,
    /// Only these job types (`None`: any).
    pub job_types: Option<Vec<String>>,
    /// Only schedules/jobs with a matching name (`None`: any).
    pub names: Option<Vec<NamePattern>>,
    /// Its throttling window.
    pub throttle: Duration,
}

impl Route {
    /// Whether `event` goes this way.
    pub fn takes(&self, event: &AlertEvent) -> bool {
        let Some(kind) = event.alert_kind() else {
            return false;
        };
        if !self.events.contains(&kind) {
            return false;
        }
        if let Some(types) = &self.job_types {
            match &event.job_type {
                Some(t) if types.contains(t) => {}
                _ => return false,
            }
        }
        if let Some(names) = &self.names {
            match &event.job_name {
                Some(n) if names.iter().any(|p| p.matches(n)) => {}
                _ => return false,
            }
        }
        true
    }
}

/// The whole alert configuration.
#[derive(Debug, Clone)]
pub struct AlertsConfig {
    /// The file it came from.
    pub path: PathBuf,
    /// Default throttling window.
    pub throttle: Duration,
    /// Give a delivery up this long after its event.
    pub give_up_after: Duration,
    /// First retry delay.
    pub retry_initial: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// The web view's public address, for links.
    pub public_url: Option<String>,
    /// The channels, by name.
    pub channels: BTreeMap<String, ChannelConfig>,
    /// The routes, in file order.
    pub routes: Vec<Route>,
}

/// The file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertsFile {
    throttle: Option<String>,
    give_up_after: Option<String>,
    retry_initial: Option<String>,
    retry_max: Option<String>,
    public_url: Option<String>,
    #[serde(default)]
    channels: BTreeMap<String, ChannelFile>,
    #[serde(default)]
    routes: Vec<RouteFile>,
}

/// A `[channels.NAME]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelFile {
    #[serde(rename = "type")]
    kind: String,
    url: Option<String>,
    url_env: Option<String>,
    secret_env: Option<String>,
    smtp: Option<String>,
    tls: Option<SmtpTls>,
    ca_file: Option<PathBuf>,
    username_env: Option<String>,
    password_env: Option<String>,
    from: Option<String>,
    to: Option<Vec<String>>,
    timeout: Option<String>,
}

/// A `[[routes]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    channels: Vec<String>,
    events: Option<Vec<String>>,
    job_types: Option<Vec<String>>,
    names: Option<Vec<String>>,
    throttle: Option<String>,
}

/// A duration written in the file, or `default`.
fn duration(text: Option<&str>, default: Duration, what: &str) -> Result<Duration, String> {
    match text {
        None => Ok(default),
        Some(t) => humantime::parse_duration(t.trim()).map_err(|e| {
            format!("{what} = {t:?}: {e}; write a duration such as \"30s\" or \"5m\"")
        }),
    }
}

/// The kinds a route takes when it does not say.
fn default_kinds() -> HashSet<AlertKind> {
    AlertKind::ALL
        .into_iter()
        .filter(|k| *k != AlertKind::Test)
        .collect()
}

impl AlertsConfig {
    /// The configuration `BELFRY_ALERTS` names, secrets read from
    /// `settings`; `None` when it is unset (no alerts are sent; events are
    /// still recorded).
    ///
    /// # Errors
    ///
    /// [`AlertError`] naming the file, channel or route that is wrong.
    pub fn from_settings(settings: &Settings) -> Result<Option<Self>, AlertError> {
        match settings.get(ALERTS_VAR) {
            None => Ok(None),
            Some(path) => Self::load(Path::new(path.trim()), settings).map(Some),
        }
    }

    /// Reads the file at `path`.
    ///
    /// # Errors
    ///
    /// As [`AlertsConfig::from_settings`].
    pub fn load(path: &Path, settings: &Settings) -> Result<Self, AlertError> {
        let text = std::fs::read_to_string(path).map_err(|source| AlertError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, path, settings)
    }

    /// Parses `text` (the content of `path`).
    ///
    /// # Errors
    ///
    /// As [`AlertsConfig::from_settings`].
    pub fn parse(text: &str, path: &Path, settings: &Settings) -> Result<Self, AlertError> {
        let shown = path.display().to_string();
        let parse_error = |reason: String| AlertError::Parse {
            path: shown.clone(),
            reason,
        };
        let file: AlertsFile = toml::from_str(text).map_err(|e| parse_error(e.to_string()))?;
        let throttle = duration(file.throttle.as_deref(), DEFAULT_THROTTLE, "throttle")
            .map_err(parse_error)?;
        let give_up_after = duration(
            file.give_up_after.as_deref(),
            DEFAULT_GIVE_UP_AFTER,
            "give_up_after",
        )
        .map_err(parse_error)?;
        let retry_initial = duration(
            file.retry_initial.as_deref(),
            DEFAULT_RETRY_INITIAL,
            "retry_initial",
        )
        .map_err(parse_error)?;
        let retry_max = duration(file.retry_max.as_deref(), DEFAULT_RETRY_MAX, "retry_max")
            .map_err(parse_error)?;
        if retry_initial.is_zero() || retry_max < retry_initial {
            return Err(parse_error(format!(
                "retry_initial ({retry_initial:?}) must be above zero and at most retry_max ({retry_max:?})"
            )));
        }
        let mut channels = BTreeMap::new();
        for (name, channel) in file.channels {
            let parsed = channel_config(&name, channel, settings)?;
            channels.insert(name, parsed);
        }
        let mut routes = Vec::with_capacity(file.routes.len());
        for (i, route) in file.routes.into_iter().enumerate() {
            routes.push(route_config(i + 1, route, &channels, throttle)?);
        }
        Ok(Self {
            path: path.to_owned(),
            throttle,
            give_up_after,
            retry_initial,
            retry_max,
            public_url: file.public_url.map(|u| u.trim_end_matches('/').to_owned()),
            channels,
            routes,
        })
    }

    /// The channels `event` goes to, each with the smallest window of the
    /// routes choosing it: a test alert to its one channel; otherwise
    /// every route that takes it, and the channels its schedule names
    /// (`schedule_alerts`, its definition's `alerts`) with the default
    /// window. A channel a schedule names that is not configured is
    /// returned too: its delivery fails with a reason that says so, in
    /// the list of failed deliveries, instead of vanishing.
    pub fn routes_for(&self, event: &AlertEvent, schedule_alerts: &[String]) -> Vec<AlertRoute> {
        if let Some(channel) = &event.channel {
            return vec![AlertRoute {
                channel: channel.clone(),
                window: Duration::ZERO,
                refusal: None,
            }];
        }
        let mut out: Vec<AlertRoute> = Vec::new();
        let mut add =
            |channel: &str, window: Duration| match out.iter_mut().find(|r| r.channel == channel) {
                Some(r) => r.window = r.window.min(window),
                None => out.push(AlertRoute {
                    channel: channel.to_owned(),
                    window,
                    refusal: None,
                }),
            };
        for route in self.routes.iter().filter(|r| r.takes(event)) {
            for channel in &route.channels {
                add(channel, route.throttle);
            }
        }
        if event.alert_kind().is_some_and(|k| k != AlertKind::Test) {
            for channel in schedule_alerts {
                add(channel, self.throttle);
            }
        }
        for route in &mut out {
            if !self.channels.contains_key(&route.channel) {
                route.refusal = Some(format!(
                    "no channel {:?} in BELFRY_ALERTS ({}), which the schedule's alerts name: \
                     define it, or remove the name from the schedule",
                    route.channel,
                    self.path.display()
                ));
            }
        }
        out
    }

    /// The names of the channels.
    pub fn channel_names(&self) -> Vec<String> {
        self.channels.keys().cloned().collect()
    }
}

/// A secret from the variable `var` (named by `field` of `channel`).
fn secret(
    settings: &Settings,
    channel: &str,
    field: &str,
    var: &str,
) -> Result<Secret, AlertError> {
    settings
        .get(var)
        .map(|v| Secret(v.to_owned()))
        .ok_or_else(|| AlertError::Channel {
            channel: channel.to_owned(),
            reason: format!("{field} = {var:?} but the environment variable {var} is not set"),
        })
}

/// A valid channel name: what a TOML bare key and a URL path segment
/// both take.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Resolves one `[channels.NAME]` table.
fn channel_config(
    name: &str,
    file: ChannelFile,
    settings: &Settings,
) -> Result<ChannelConfig, AlertError> {
    let wrong = |reason: String| AlertError::Channel {
        channel: name.to_owned(),
        reason,
    };
    if !valid_name(name) {
        return Err(wrong(
            "a channel name is 1 to 64 letters, digits, '-', '_' or '.'".into(),
        ));
    }
    let refuse = |fields: &[(&str, bool)], kind: &str| -> Result<(), AlertError> {
        match fields.iter().find(|(_, set)| *set) {
            Some((field, _)) => Err(AlertError::Channel {
                channel: name.to_owned(),
                reason: format!("{field} does not apply to a {kind} channel; remove it"),
            }),
            None => Ok(()),
        }
    };
    let http_only = [
        ("smtp", file.smtp.is_some()),
        ("tls", file.tls.is_some()),
        ("ca_file", file.ca_file.is_some()),
        ("username_env", file.username_env.is_some()),
        ("password_env", file.password_env.is_some()),
        ("from", file.from.is_some()),
        ("to", file.to.is_some()),
    ];
    let http_url = |url: &str| -> Result<(), AlertError> {
        match url::Url::parse(url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => Ok(()),
            _ => Err(AlertError::Channel {
                channel: name.to_owned(),
                reason: "the url must be an http:// or https:// URL".into(),
            }),
        }
    };
    let (kind, default_timeout) = match file.kind.as_str() {
        "webhook" => {
            refuse(&http_only, "webhook")?;
            // A URL with a token in it is a secret: url_env keeps it out
            // of the file.
            let url = match (file.url, file.url_env) {
                (Some(_), Some(_)) => return Err(wrong("give url or url_env, not both".into())),
                (Some(url), None) => Secret(url),
                (None, Some(var)) => secret(settings, name, "url_env", &var)?,
                (None, None) => {
                    return Err(wrong(
                        "a webhook channel needs url = \"https://...\" (or url_env = \"VAR\")"
                            .into(),
                    ))
                }
            };
            http_url(url.expose())?;
            let var = file.secret_env.ok_or_else(|| {
                wrong(
                    "a webhook channel needs secret_env = \"VAR\": the environment variable holding \
                     the signing secret (receivers verify webhook-signature with it)"
                        .into(),
                )
            })?;
            let secret = secret(settings, name, "secret_env", &var)?;
            if let Some(b64) = secret.expose().strip_prefix("whsec_") {
                use base64::Engine as _;
                if base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .is_err()
                {
                    return Err(wrong(format!(
                        "the secret in {var} starts with whsec_ but what follows is not base64; \
                         a Standard Webhooks secret is whsec_ followed by the base64 of the key"
                    )));
                }
            }
            (ChannelKind::Webhook { url, secret }, DEFAULT_HTTP_TIMEOUT)
        }
        "slack" => {
            refuse(&http_only, "slack")?;
            refuse(&[("secret_env", file.secret_env.is_some())], "slack")?;
            // The hook's URL is its secret: only ever named here.
            if file.url.is_some() {
                return Err(wrong(
                    "a Slack hook's URL is a secret: put it in an environment variable and \
                     write url_env = \"VAR\" instead of url"
                        .into(),
                ));
            }
            let var = file.url_env.ok_or_else(|| {
                wrong("a slack channel needs url_env = \"VAR\" (the incoming-webhook URL is a secret)".into())
            })?;
            let url = secret(settings, name, "url_env", &var)?;
            http_url(url.expose())?;
            (ChannelKind::Slack { url }, DEFAULT_HTTP_TIMEOUT)
        }
        "email" => {
            refuse(
                &[
                    ("url", file.url.is_some()),
                    ("url_env", file.url_env.is_some()),
                    ("secret_env", file.secret_env.is_some()),
                ],
                "email",
            )?;
            let tls = file.tls.unwrap_or(SmtpTls::Starttls);
            let smtp = file
                .smtp
                .ok_or_else(|| wrong("an email channel needs smtp = \"host[:port]\"".into()))?;
            let (host, port) = match smtp.rsplit_once(':') {
                Some((host, port)) => (
                    host.to_owned(),
                    port.parse::<u16>().map_err(|_| {
                        wrong(format!(
                            "smtp = {smtp:?}: the port must be a number from 1 to 65535"
                        ))
                    })?,
                ),
                None => (
                    smtp.clone(),
                    match tls {
                        SmtpTls::Tls => 465,
                        SmtpTls::Starttls => 587,
                        SmtpTls::None => 25,
                    },
                ),
            };
            if host.is_empty() {
                return Err(wrong(format!("smtp = {smtp:?} has no host")));
            }
            if tls == SmtpTls::None && !matches!(host.as_str(), "127.0.0.1" | "::1" | "localhost") {
                return Err(wrong(format!(
                    "tls = \"none\" sends mail and password in clear text; it is only allowed to a \
                     relay on this machine (127.0.0.1), not {host}: use \"starttls\" or \"tls\""
                )));
            }
            let ca_pem =
                match file.ca_file {
                    None => None,
                    Some(path) => Some(std::fs::read(&path).map_err(|e| {
                        wrong(format!("cannot read ca_file {}: {e}", path.display()))
                    })?),
                };
            let credentials = match (file.username_env, file.password_env) {
                (None, None) => None,
                (Some(u), Some(p)) => Some((
                    secret(settings, name, "username_env", &u)?,
                    secret(settings, name, "password_env", &p)?,
                )),
                _ => {
                    return Err(wrong(
                        "give both username_env and password_env, or neither".into(),
                    ))
                }
            };
            let from = file.from.ok_or_else(|| {
                wrong("an email channel needs from = \"belfry <belfry@example.com>\"".into())
            })?;
            if from.parse::<lettre::message::Mailbox>().is_err() {
                return Err(wrong(format!("from = {from:?} is not an e-mail address")));
            }
            let to = file.to.unwrap_or_default();
            if to.is_empty() {
                return Err(wrong(
                    "an email channel needs to = [\"someone@example.com\"]".into(),
                ));
            }
            if let Some(bad) = to
                .iter()
                .find(|t| t.parse::<lettre::message::Mailbox>().is_err())
            {
                return Err(wrong(format!("to: {bad:?} is not an e-mail address")));
            }
            (
                ChannelKind::Email {
                    host,
                    port,
                    tls,
                    ca_pem,
                    credentials,
                    from,
                    to,
                },
                DEFAULT_SMTP_TIMEOUT,
            )
        }
        other => {
            return Err(wrong(format!(
                "type = {other:?} is not a channel type; use \"webhook\", \"slack\" or \"email\""
            )))
        }
    };
    let timeout = duration(file.timeout.as_deref(), default_timeout, "timeout").map_err(wrong)?;
    if timeout.is_zero() {
        return Err(wrong("timeout must be above zero".into()));
    }
    Ok(ChannelConfig {
        name: name.to_owned(),
        kind,
        timeout,
    })
}

/// Resolves the `index`th `[[routes]]` table.
fn route_config(
    index: usize,
    file: RouteFile,
    channels: &BTreeMap<String, ChannelConfig>,
    default_throttle: Duration,
) -> Result<Route, AlertError> {
    let wrong = |reason: String| AlertError::Route { index, reason };
    if file.channels.is_empty() {
        return Err(wrong("channels is empty; name at least one channel".into()));
    }
    if let Some(unknown) = file.channels.iter().find(|c| !channels.contains_key(*c)) {
        let known: Vec<&str> = channels.keys().map(String::as_str).collect();
        return Err(wrong(format!(
            "channel {unknown:?} is not defined; the defined ones: {known:?}"
        )));
    }
    let events = match file.events {
        None => default_kinds(),
        Some(names) => {
            let mut kinds = HashSet::new();
            for name in names {
                let kind = AlertKind::parse(&name).ok_or_else(|| {
                    let all: Vec<&str> = AlertKind::ALL.iter().map(|k| k.as_str()).collect();
                    wrong(format!(
                        "events: {name:?} is not an event kind; the kinds: {all:?}"
                    ))
                })?;
                kinds.insert(kind);
            }
            // Who is told of failures is told when they stop.
            if kinds.contains(&AlertKind::RunFailed) || kinds.contains(&AlertKind::RunDead) {
                kinds.insert(AlertKind::ScheduleRecovered);
            }
            kinds
        }
    };
    let throttle =
        duration(file.throttle.as_deref(), default_throttle, "throttle").map_err(wrong)?;
    Ok(Route {
        channels: file.channels,
        events,
        job_types: file.job_types,
        names: file
            .names
            .map(|names| names.iter().map(|n| NamePattern::new(n)).collect()),
        throttle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_ledger::AlertEvent;
    use chrono::Utc;
    use uuid::Uuid;

    fn event(kind: AlertKind, job: Option<&str>, job_type: Option<&str>) -> AlertEvent {
        AlertEvent {
            id: Uuid::now_v7(),
            kind: kind.as_str().into(),
            subject: job.unwrap_or("replica:r1").into(),
            job_name: job.map(Into::into),
            job_type: job_type.map(Into::into),
            run_id: None,
            run_key: None,
            count: 1,
            detail: String::new(),
            channel: None,
            occurred_at: Utc::now(),
            covers_from: None,
            covers_until: None,
        }
    }

    fn config() -> AlertsConfig {
        AlertsConfig::parse(
            "throttle = \"10m\"\n\
             [channels.hook]\ntype = \"webhook\"\nurl = \"https://h/x\"\nsecret_env = \"S\"\n\
             [channels.chat]\ntype = \"slack\"\nurl_env = \"SLACK\"\n\
             [[routes]]\nchannels = [\"hook\"]\nevents = [\"run.failed\"]\nnames = [\"nightly-*\"]\nthrottle = \"1m\"\n\
             [[routes]]\nchannels = [\"hook\", \"chat\"]\njob_types = [\"billing\"]\n",
            Path::new("t.toml"),
            &Settings::from_pairs([("S", "secret"), ("SLACK", "https://hooks.slack.com/x")]),
        )
        .unwrap()
    }

    #[test]
    fn routes_match_by_kind_name_and_type_with_the_smallest_window() {
        let c = config();
        let route = |e: &AlertEvent, named: &[&str]| {
            let named: Vec<String> = named.iter().map(|s| s.to_string()).collect();
            let mut r = c.routes_for(e, &named);
            r.sort_by(|a, b| a.channel.cmp(&b.channel));
            r.into_iter()
                .map(|r| (r.channel, r.window.as_secs()))
                .collect::<Vec<_>>()
        };
        // Both routes: hook at the smaller window.
        let both = event(AlertKind::RunFailed, Some("nightly-bill"), Some("billing"));
        assert_eq!(
            route(&both, &[]),
            vec![("chat".into(), 600), ("hook".into(), 60)]
        );
        // Only the name route; a recovery goes where failures go.
        let e = event(
            AlertKind::ScheduleRecovered,
            Some("nightly-x"),
            Some("report"),
        );
        assert_eq!(route(&e, &[]), vec![("hook".into(), 60)]);
        // Neither: nothing, unless the schedule names a channel itself
        // (the file's window; an unknown name kept, to fail visibly).
        let e = event(AlertKind::RunDead, Some("hourly"), Some("report"));
        assert!(route(&e, &[]).is_empty());
        assert_eq!(
            route(&e, &["chat", "gone"]),
            vec![("chat".into(), 600), ("gone".into(), 600)]
        );
        // A replica event has no name or type: routes with filters skip it.
        assert!(route(&event(AlertKind::ReplicaClockGuard, None, None), &[]).is_empty());
        // A test goes to its one channel only, unthrottled.
        let mut t = event(AlertKind::Test, None, None);
        t.channel = Some("chat".into());
        assert_eq!(route(&t, &["hook"]), vec![("chat".into(), 0)]);
    }
}
