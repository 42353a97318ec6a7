//! The contract of belfry's REST API: every request body, response body
//! and query of `/v1/...`, `/healthz` and `/readyz` as Rust types, each with
//! its OpenAPI schema.
//!
//! Why a crate of its own: the server builds these answers, the web view
//! shows the same data and the `belfry` CLI reads them back. With one
//! definition they cannot drift apart, and the OpenAPI document
//! (`server/openapi.json`) is generated from these same types by utoipa,
//! so the document cannot drift from the code either. Nothing here talks
//! HTTP or to a database: serde, schemas and conversions from the
//! protocol's schedule definition only.
//!
//! The wire shapes are stable: a field that is optional here is left out
//! or `null` exactly as its doc says, and names follow
//! [`NAME_PATTERN`].

#[macro_use]
mod wire_enum;
pub mod alerts;
pub mod error;
pub mod health;
pub mod jobs;
pub mod runs;
pub mod schedules;
pub mod url_component;

pub use alerts::{
    AlertChannel, AlertDelivery, AlertList, AlertQuery, DeliveryStatus, TestAlert, TestAlertQueued,
};
pub use error::{ErrorBody, ErrorCode};
pub use health::{
    Liveness, LivenessStatus, Mode, Readiness, ReadinessStatus, RedisState, ServiceState,
};
pub use jobs::{Enqueued, JobRequest};
pub use runs::{
    Attempt, CancelAnswer, CancelResult, CancelRun, LogLine, LogLineKind, Origin, Run, RunDetail,
    RunLink, RunList, RunLogPage, RunLogQuery, RunPath, RunQuery, RunStatus, MAX_LOG_PAGE,
};
pub use schedules::{
    Backfill, BackfillOutcome, BackfillRequest, BackfilledFire, Misfire, Name, Overlap,
    PauseRequest, Preview, PreviewQuery, Schedule, ScheduleInput, ScheduleList, SchedulePath,
    ScheduleQuery, TriggerOutcome, TriggerRequest, Triggered,
};
pub use url_component::encode_url_component;

/// What a schedule name, job type or ad-hoc job name may be (the rule of
/// [`belfry_protocol::validate_name`]): 1 to 100 characters from
/// `A-Z a-z 0-9 . _ -`.
pub const NAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,100}$";

/// Largest page of a list (`limit`), schedules and runs alike.
pub const MAX_PAGE: u32 = 500;

/// Most instants a preview returns (`count`).
pub const MAX_PREVIEW: u32 = 100;

/// A page of a list: its items and the cursor of the next page.
pub trait Page: Sized {
    /// What the list holds.
    type Item;

    /// The items and `next_cursor` (`None` on the last page).
    fn into_parts(self) -> (Vec<Self::Item>, Option<String>);

    /// A page of `items` continued by `next_cursor`.
    fn from_parts(items: Vec<Self::Item>, next_cursor: Option<String>) -> Self;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts_are_serdes<T: serde::Serialize + std::fmt::Display>(all: &[T]) {
        for v in all {
            assert_eq!(
                serde_json::to_value(v).ok(),
                Some(serde_json::Value::String(v.to_string()))
            );
        }
    }

    #[test]
    fn every_wire_word_is_what_serde_writes() {
        texts_are_serdes(ErrorCode::ALL);
        texts_are_serdes(LivenessStatus::ALL);
        texts_are_serdes(ReadinessStatus::ALL);
        texts_are_serdes(Mode::ALL);
        texts_are_serdes(ServiceState::ALL);
        texts_are_serdes(RedisState::ALL);
        texts_are_serdes(Misfire::ALL);
        texts_are_serdes(Overlap::ALL);
        texts_are_serdes(TriggerOutcome::ALL);
        texts_are_serdes(BackfillOutcome::ALL);
        texts_are_serdes(RunStatus::ALL);
        texts_are_serdes(Origin::ALL);
        texts_are_serdes(CancelResult::ALL);
    }
}
