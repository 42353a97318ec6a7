//! Reading requests: JSON bodies and query strings into typed values, with
//! errors that name the field.
//!
//! Bodies are read as bytes (under the size limit) and parsed here rather
//! than by axum's `Json` extractor, whose rejections are plain text: every
//! failure must come back in the API's error shape, with the field.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The body bytes, or the API error for a body that could not be read.
///
/// # Errors
///
/// 413 when the body exceeds [`MAX_BODY_BYTES`]; 400 when it could not be
/// read.
pub fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(MAX_BODY_BYTES)
        } else {
            ApiError::bad_request(format!("request body could not be read: {e}"))
        }
    })
}

/// Parses a JSON object body (an empty body counts as `{}`).
///
/// # Errors
///
/// 400 for invalid JSON or a body that is not an object.
pub fn json_object(bytes: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad_request("the body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!(
            "the body is not valid JSON: {e}"
        ))),
    }
}

/// Deserializes `value` into `T`; a mismatch is a 422 naming the field
/// (`retry.max_attempts`), an unknown field is named as well.
///
/// # Errors
///
/// 422 when a field is missing, unknown or of the wrong type.
pub fn typed<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // The path already ends in an unknown field's name; a missing
        // field is reported against its parent.
        let field = match missing_field(&inner) {
            Some(name) if path == "." => name.to_owned(),
            Some(name) => format!("{path}.{name}"),
            None if path == "." => "body".to_owned(),
            None => path,
        };
        ApiError::invalid(field, inner)
    })
}

fn missing_field(message: &str) -> Option<&str> {
    message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
}

/// Query parameters, checked against the names a route accepts.
pub struct QueryParams(HashMap<String, String>);

impl QueryParams {
    /// The parameters of `query`, refusing names not in `allowed`.
    ///
    /// # Errors
    ///
    /// 400 naming an unknown or repeated parameter.
    pub fn parse(query: Option<&str>, allowed: &[&str]) -> Result<Self, ApiError> {
        let mut map = HashMap::new();
        for (k, v) in form_urlencoded_pairs(query.unwrap_or("")) {
            if !allowed.contains(&k.as_str()) {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {k:?}; this route accepts {}",
                    if allowed.is_empty() {
                        "none".to_owned()
                    } else {
                        allowed.join(", ")
                    }
                ))
                .field(k));
            }
            if v.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "query parameter {k:?} is empty; give a value or leave it out"
                ))
                .field(k));
            }
            if v.contains('\0') {
                return Err(ApiError::bad_request(format!(
                    "query parameter {k:?} contains a NUL character"
                ))
                .field(k));
            }
            if map.insert(k.clone(), v).is_some() {
                return Err(
                    ApiError::bad_request(format!("query parameter {k:?} is given twice")).field(k),
                );
            }
        }
        Ok(Self(map))
    }

    /// A string parameter, absent when empty.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A whole number in `min..=max`, `default` when absent.
    ///
    /// # Errors
    ///
    /// 400 naming the parameter when it is not a number in range.
    pub fn number(&self, name: &str, default: u32, min: u32, max: u32) -> Result<u32, ApiError> {
        match self.text(name) {
            None => Ok(default),
            Some(raw) => raw
                .parse::<u32>()
                .ok()
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "{name} must be a whole number from {min} to {max}, not {raw:?}"
                    ))
                    .field(name)
                }),
        }
    }

    /// An RFC 3339 instant.
    ///
    /// # Errors
    ///
    /// 400 naming the parameter when it does not parse.
    pub fn instant(&self, name: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
        self.text(name).map(|raw| instant(name, raw)).transpose()
    }
}

/// Parses an RFC 3339 instant named `name`.
///
/// # Errors
///
/// 400 naming `name`.
pub fn instant(name: &str, raw: &str) -> Result<DateTime<Utc>, ApiError> {
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            ApiError::bad_request(format!(
                "{name} {raw:?} is not an RFC 3339 instant ({e}); e.g. \"2026-07-26T03:00:00Z\""
            ))
            .field(name)
        })
}

fn form_urlencoded_pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Refuses a value Postgres could not store: a NUL character (`\u0000`) in
/// any string or key (`jsonb` and `text` reject it).
///
/// # Errors
///
/// 422 naming `field`.
pub fn storable(field: &str, value: &serde_json::Value) -> Result<(), ApiError> {
    fn has_nul(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::String(s) => s.contains('\0'),
            serde_json::Value::Array(items) => items.iter().any(has_nul),
            serde_json::Value::Object(map) => {
                map.iter().any(|(k, v)| k.contains('\0') || has_nul(v))
            }
            _ => false,
        }
    }
    if has_nul(value) {
        return Err(ApiError::invalid(
            field,
            format!(
                "{field} contains a NUL character (\\u0000), which cannot be stored; remove it"
            ),
        ));
    }
    Ok(())
}

/// A single path parameter (`{name}`, `{id}`) whose rejection (invalid
/// percent-encoding) is a 400 in the API's error shape, not axum's text.
pub struct PathParam(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for PathParam {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<String>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(e) => Err(ApiError::bad_request(format!("the path is not valid: {e}"))),
        }
    }
}
