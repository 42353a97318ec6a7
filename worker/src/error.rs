//! Errors of the worker layer (not of jobs: see [`crate::JobError`]).

use thiserror::Error;

/// What can stop a worker from starting or consuming.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// A setting is invalid.
    #[error(transparent)]
    Setting(#[from] belfry_runtime::SettingError),
    /// The registry is invalid.
    #[error(transparent)]
    Registry(#[from] crate::RegistryError),
    /// The ledger (Postgres) failed.
    #[error(transparent)]
    Ledger(#[from] belfry_ledger::LedgerError),
    /// The broker (RabbitMQ) failed.
    #[error(transparent)]
    Broker(#[from] belfry_broker::BrokerError),
    /// A name (namespace, group) breaks the naming rule.
    #[error(transparent)]
    Name(#[from] belfry_protocol::NameError),
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Metrics(#[from] belfry_runtime::metrics_server::MetricsError),
    /// The broker closed the consumer.
    #[error("the broker closed the consumer of queue {0}")]
    ConsumerClosed(String),
}

impl WorkerError {
    /// Whether the error comes from a service (Postgres, RabbitMQ) that may
    /// come back, rather than from configuration or the registry.
    pub fn is_transient(&self) -> bool {
        match self {
            WorkerError::Broker(e) => e.is_transient(),
            WorkerError::Ledger(_) => true,
            _ => false,
        }
    }
}
