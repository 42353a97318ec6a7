//! Errors of the server layer: the replica's own, or an endpoint that
//! could not listen.

use thiserror::Error;

/// What can stop a `belfry-scheduler` process from starting.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The replica could not start.
    #[error(transparent)]
    Scheduler(#[from] belfry_scheduler::SchedulerError),
    /// The REST API could not listen.
    #[error(transparent)]
    Api(#[from] crate::api::ServeError),
    /// The metrics endpoint could not listen.
    #[error(transparent)]
    Metrics(#[from] belfry_runtime::metrics_server::MetricsError),
    /// An alert channel could not be set up.
    #[error(transparent)]
    Alerts(#[from] belfry_alert::AlertError),
}
