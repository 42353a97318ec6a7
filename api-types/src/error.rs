//! The one error shape of every failed request.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

wire_enum! {
    /// What kind of failure; the HTTP status says the same (400
    /// `bad_request`, 401 `unauthorized`, 403 `forbidden`, 404 `not_found`,
    /// 405 `method_not_allowed`, 409 `conflict`, 413 `payload_too_large`,
    /// 422 `invalid`, 503 `unavailable`).
    pub enum ErrorCode {
        /// The request is malformed (JSON syntax, a query parameter, a cursor).
        BadRequest = "bad_request",
        /// No token, or an unknown one.
        Unauthorized = "unauthorized",
        /// The token may not do this.
        Forbidden = "forbidden",
        /// No such schedule, run or route.
        NotFound = "not_found",
        /// The route exists, the method does not.
        MethodNotAllowed = "method_not_allowed",
        /// Collides with the current state.
        Conflict = "conflict",
        /// The body is over the limit.
        PayloadTooLarge = "payload_too_large",
        /// Well-formed, but a field breaks the rules (`field` names it).
        Invalid = "invalid",
        /// A service cannot be reached; retry later.
        Unavailable = "unavailable",
    }
}

/// `{"error": code, "message": text, "field": name?}`: every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// Stable machine-readable code.
    pub error: ErrorCode,
    /// What was wrong and how to fix it.
    pub message: String,
    /// The offending field or parameter, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
