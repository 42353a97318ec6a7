//! The API's one error shape.
//!
//! Every failure is `{"error": code, "message": text, "field": name?}` with
//! a status used the same way everywhere:
//!
//! | status | code | when |
//! | --- | --- | --- |
//! | 400 | `bad_request` | the request itself is malformed: JSON syntax, a query parameter or cursor that does not parse |
//! | 401 | `unauthorized` | no token, or a token that is not configured |
//! | 403 | `forbidden` | a read-only token asked for a change |
//! | 404 | `not_found` | no such schedule, run or route |
//! | 405 | `method_not_allowed` | the route exists, the method does not |
//! | 409 | `conflict` | the change collides with the current state (a name taken, the previous run unfinished) |
//! | 413 | `payload_too_large` | a body over the limit |
//! | 422 | `invalid` | well-formed, but a field breaks the rules (`field` names it) |
//! | 503 | `unavailable` | a service (Postgres, RabbitMQ) cannot be reached; retry later |

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use belfry_api_types::{ErrorBody, ErrorCode};

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code (see the module table).
    pub code: ErrorCode,
    /// What was wrong and how to fix it.
    pub message: String,
    /// The offending field or parameter, when there is one.
    pub field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }

    /// Names the offending field.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
    }

    /// 401: no valid token.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, message)
    }

    /// 403: the token may not do this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, message)
    }

    /// 404: nothing there.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, message)
    }

    /// 405: wrong method for the route.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::MethodNotAllowed,
            "this path does not support that method; see /openapi.json",
        )
    }

    /// 409: collides with the current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, ErrorCode::Conflict, message)
    }

    /// 413: body too large.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!("request body is larger than {limit} bytes"),
        )
    }

    /// 422: a field breaks the rules.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::Invalid,
            message,
        )
        .field(field)
    }

    /// 503: a service is unreachable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            message,
        )
    }
}

impl From<belfry_ledger::LedgerError> for ApiError {
    fn from(e: belfry_ledger::LedgerError) -> Self {
        // A value the database refuses to store is the request's fault, not
        // the service's; the ledger's error type knows which is which.
        if e.is_data_error() {
            let why = e
                .database_message()
                .map_or_else(|| e.to_string(), str::to_owned);
            return Self::invalid("body", format!("a value cannot be stored: {why}"));
        }
        // The ledger's text names the failure without credentials; the
        // caller learns to retry.
        Self::unavailable(format!("the ledger could not answer: {e}; retry later"))
    }
}

impl From<belfry_scheduler::OpsError> for ApiError {
    fn from(e: belfry_scheduler::OpsError) -> Self {
        use belfry_scheduler::OpsError;
        match e {
            OpsError::BadName(n) => Self::bad_request(n.to_string()).field("name"),
            OpsError::NotFound { .. } => Self::not_found(e.to_string()),
            OpsError::Exists { ref name } => Self::conflict(format!(
                "{e}; replace it with PUT /v1/schedules/{name}"
            ))
            .field("name"),
            OpsError::StoredInvalid { name, source } => Self::conflict(format!(
                "the stored definition of {name:?} is not valid ({source}); fix it with PUT first"
            )),
            OpsError::Overlap { ref name } => Self::conflict(format!(
                "{name:?} forbids overlap and its previous run is not finished; send {{\"force\": true}} to run anyway"
            )),
            OpsError::BackfillOverlap { name, instants } => Self::conflict(format!(
                "{name:?} forbids overlap, and a backfill of {instants} instants would run them \
                 side by side; send \"force\": true to run them anyway, or backfill one instant \
                 at a time"
            )),
            OpsError::Invalid { field, message } => Self::invalid(field, message),
            OpsError::Schedule(e) => e.into(),
            OpsError::NotClaimed { .. } | OpsError::ClaimLost | OpsError::Stopped { .. } => {
                Self::unavailable(e.to_string())
            }
            OpsError::RunNotFound { .. } => Self::not_found(e.to_string()),
            OpsError::RunFinished { .. } => Self::conflict(e.to_string()),
            OpsError::Ledger(e) => e.into(),
        }
    }
}

impl From<belfry_scheduler::schedule::ScheduleError> for ApiError {
    fn from(e: belfry_scheduler::schedule::ScheduleError) -> Self {
        let field = e.field;
        Self::invalid(field, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // The one place an answer is logged: a service the API needs did not
        // answer (the message names it, without credentials). A refusal of
        // the request itself is the caller's to read.
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(error = %self.message, "API request failed: a service is unavailable");
        }
        let body = ErrorBody {
            error: self.code,
            message: self.message,
            field: self.field,
        };
        (self.status, axum::Json(body)).into_response()
    }
}
