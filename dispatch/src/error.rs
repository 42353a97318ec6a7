//! Errors of the dispatch layer.

use thiserror::Error;

/// What went wrong dispatching or enqueueing.
#[derive(Debug, Error)]
pub enum DispatchError {
    /// The ledger (Postgres) failed.
    #[error(transparent)]
    Ledger(#[from] belfry_ledger::LedgerError),
    /// The broker (RabbitMQ) failed at start.
    #[error(transparent)]
    Broker(#[from] belfry_broker::BrokerError),
    /// A name breaks the naming rule.
    #[error(transparent)]
    Name(#[from] belfry_protocol::NameError),
    /// A follow-up list breaks a rule (see `belfry_protocol::follow_up`).
    #[error("invalid follow-up {0}")]
    FollowUp(#[from] belfry_protocol::InvalidFollowUp),
    /// An idempotency key is unusable.
    #[error("idempotency key {key:?} is invalid: {reason}")]
    BadKey {
        /// The key given.
        key: String,
        /// What is allowed.
        reason: String,
    },
}
