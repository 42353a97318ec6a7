//! HTTP to the API, and what its answers mean for the exit code.
//!
//! Requests and answers are the types of `belfry-api-types`: a body is
//! serialized from one, an answer deserialized into one, an error answer
//! into [`ErrorBody`].

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use belfry_api_types::ErrorBody;

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
    /// True when asking again later may work: the API could not be reached
    /// or said it cannot serve now (502, 503, 504).
    pub fn is_transient(&self) -> bool {
        match self {
            CliError::Connect { .. } => true,
            CliError::Api { status, .. } => matches!(*status, 502..=504),
            _ => false,
        }
    }

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

/// A request without a query string or without a body.
pub const NONE: Option<&()> = None;

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

    /// Sends `method path?query` with an optional JSON body and reads the
    /// answer as a `T`.
    ///
    /// # Errors
    ///
    /// [`CliError::Api`] for an error answer, [`CliError::Connect`] when
    /// nothing answers, [`CliError::Response`] for an answer that is not a
    /// `T`.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: Option<&impl Serialize>,
        body: Option<&impl Serialize>,
    ) -> Result<T, CliError> {
        let (url, text) = self.send(method, path, query, body).await?;
        serde_json::from_str(&text).map_err(|e| CliError::Response {
            url,
            message: format!(
                "not the API's answer ({e}): {}",
                text.chars().take(200).collect::<String>()
            ),
        })
    }

    /// Sends a request whose success has no body (`204 No Content`).
    ///
    /// # Errors
    ///
    /// As [`ApiClient::call`].
    pub async fn call_no_content(&self, method: Method, path: &str) -> Result<(), CliError> {
        self.send(method, path, NONE, NONE).await.map(drop)
    }

    /// The URL and text of a successful answer.
    async fn send(
        &self,
        method: Method,
        path: &str,
        query: Option<&impl Serialize>,
        body: Option<&impl Serialize>,
    ) -> Result<(String, String), CliError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(query) = query {
            request = request.query(query);
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
        if status.is_success() {
            return Ok((url, text));
        }
        Err(match serde_json::from_str::<ErrorBody>(&text) {
            Ok(e) => CliError::Api {
                status: status.as_u16(),
                code: e.error.to_string(),
                message: e.message,
                field: e.field,
            },
            Err(_) => error_without_body(status, url, &text),
        })
    }
}

/// An error answer that is not the API's error shape.
fn error_without_body(status: StatusCode, url: String, text: &str) -> CliError {
    match serde_json::from_str::<serde_json::Value>(text) {
        // JSON, but not ours: still an error of the API's status.
        Ok(_) => CliError::Api {
            status: status.as_u16(),
            code: "unknown".into(),
            message: format!("HTTP {status}"),
            field: None,
        },
        Err(e) => CliError::Response {
            url,
            message: format!(
                "HTTP {status}, not JSON ({e}): {}",
                text.chars().take(200).collect::<String>()
            ),
        },
    }
}
