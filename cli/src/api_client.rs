//! HTTP to the API, and what its answers mean for the exit code.

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::exit;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The API answered with its error shape.
    #[error("{message}{}", field.as_ref().map(|f| format!(" (field `{f}`)")).unwrap_or_default())]
    Api {
        /// HTTP status.
        status: u16,
        /// The API's error code.
        code: String,
        /// Its message.
        message: String,
        /// The offending field.
        field: Option<String>,
    },
    /// The API could not be reached.
    #[error("cannot reach the belfry API at {url}: {message}; is a belfry-scheduler running there (--api / BELFRY_API_URL)?")]
    Connect {
        /// The URL tried.
        url: String,
        /// Why.
        message: String,
    },
    /// The answer was not what the API sends.
    #[error("unexpected answer from {url}: {message}")]
    Response {
        /// The URL.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// Bad local input (a file, a JSON argument).
    #[error("{0}")]
    Usage(String),
    /// Some of the work failed (a backfill with unclaimed fires).
    #[error("{0}")]
    Partial(String),
}

impl CliError {
    /// The process exit code for this error (see [`crate::exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Api { status, .. } => match *status {
                404 => exit::NOT_FOUND,
                409 => exit::CONFLICT,
                400 | 413 | 422 => exit::INVALID,
                401 | 403 => exit::AUTH,
                503 => exit::UNAVAILABLE,
                _ => exit::OTHER,
            },
            CliError::Connect { .. } | CliError::Partial(_) => exit::UNAVAILABLE,
            CliError::Response { .. } => exit::OTHER,
            CliError::Usage(_) => exit::USAGE,
        }
    }
}

/// A client of one API base URL.
pub struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ApiClient {
    /// A client of `base` (e.g. `http://127.0.0.1:8080`) sending `token`.
    pub fn new(base: &str, token: Option<String>) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            token: token.filter(|t| !t.is_empty()),
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(120))
                .build()
                .unwrap_or_default(),
        }
    }

    /// Sends `method path` with an optional JSON body; the JSON answer
    /// (`null` for 204).
    ///
    /// # Errors
    ///
    /// [`CliError::Api`] for an error answer, [`CliError::Connect`] when
    /// nothing answers, [`CliError::Response`] for an answer that is not
    /// JSON.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, CliError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| CliError::Connect {
            url: self.base.clone(),
            message: e.to_string(),
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|e| CliError::Response {
            url: url.clone(),
            message: e.to_string(),
        })?;
        if status == StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        let value: Value = serde_json::from_str(&text).map_err(|e| CliError::Response {
            url: url.clone(),
            message: format!(
                "HTTP {status}, not JSON ({e}): {}",
                text.chars().take(200).collect::<String>()
            ),
        })?;
        if status.is_success() {
            return Ok(value);
        }
        let text_of = |k: &str| value.get(k).and_then(Value::as_str).map(str::to_owned);
        Err(CliError::Api {
            status: status.as_u16(),
            code: text_of("error").unwrap_or_else(|| "unknown".into()),
            message: text_of("message").unwrap_or_else(|| format!("HTTP {status}")),
            field: text_of("field"),
        })
    }
}

/// Percent-encodes one path segment or query value.
pub fn encode(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
