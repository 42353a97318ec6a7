//! Errors of the scheduler layer.

use thiserror::Error;

use crate::schedule::ScheduleError;
use crate::schedule_file::ScheduleFileError;

/// What can stop a scheduler replica from starting or a fire from being
/// handled.
#[derive(Debug, Error)]
pub enum SchedulerError {
    /// A setting is invalid.
    #[error(transparent)]
    Setting(#[from] belfry_runtime::SettingError),
    /// The schedule file could not be loaded.
    #[error(transparent)]
    ScheduleFile(#[from] ScheduleFileError),
    /// A schedule definition is invalid.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// The ledger (Postgres) failed.
    #[error(transparent)]
    Ledger(#[from] belfry_ledger::LedgerError),
    /// The broker (RabbitMQ) failed.
    #[error(transparent)]
    Broker(#[from] belfry_broker::BrokerError),
    /// Dispatching failed.
    #[error(transparent)]
    Dispatch(#[from] belfry_dispatch::DispatchError),
    /// The shard keeper's thread could not be started (the process is out
    /// of threads or file descriptors).
    #[error("cannot start the shard keeper's thread: {0}")]
    KeeperThread(#[source] std::io::Error),
    /// A name (namespace, job name) breaks the naming rule.
    #[error(transparent)]
    Name(#[from] belfry_protocol::NameError),
}

impl SchedulerError {
    /// Whether the error comes from a service (Postgres, RabbitMQ) that may
    /// come back, rather than from configuration or schedules.
    pub fn is_transient(&self) -> bool {
        match self {
            SchedulerError::Broker(e) => e.is_transient(),
            // Not an outage to wait out. (A shard count refused because
            // of replicas that were killed is: their heartbeats expire
            // within BELFRY_SHARD_LEASE_TTL, well inside the start-up
            // retries; a real mismatch is reported when those end.)
            SchedulerError::Ledger(belfry_ledger::LedgerError::Unsupported(_)) => false,
            SchedulerError::Ledger(_) | SchedulerError::Dispatch(_) => true,
            _ => false,
        }
    }
}
