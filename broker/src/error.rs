//! Errors of the broker layer.

use thiserror::Error;

/// What went wrong talking to the broker (RabbitMQ, or the embedded queue).
#[derive(Debug, Error)]
pub enum BrokerError {
    /// The broker could not be reached at start.
    #[error("cannot connect to RabbitMQ at {url}: {source}")]
    Connect {
        /// The URL tried, password masked.
        url: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// The TLS settings (`BELFRY_AMQP_TLS_*`) cannot be used.
    #[error("RabbitMQ TLS settings: {0}")]
    Tls(#[from] crate::amqp_tls::TlsMaterialError),
    /// An AMQP operation failed (channel closed, connection lost, ...).
    #[error("RabbitMQ {operation} failed: {source}")]
    Amqp {
        /// What was being done.
        operation: &'static str,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// The connection is down and the last reconnect failed moments ago.
    #[error("RabbitMQ at {url} is not connected (reconnecting)")]
    Disconnected {
        /// The URL, password masked.
        url: String,
    },
    /// The broker did not confirm a publish in time.
    #[error("RabbitMQ did not confirm the publish within {0:?}")]
    ConfirmTimeout(std::time::Duration),
    /// A publish of a pipelined batch was not sent because an earlier one
    /// failed (its channel broke).
    #[error("publish not sent: an earlier publish of its batch failed ({0})")]
    NotSent(String),
    /// A delivery was settled after its consumer was closed: the broker
    /// gives the message back on its own (it is delivered again).
    #[error("RabbitMQ {0} not sent: the consumer was closed (the message is delivered again)")]
    ConsumerClosed(&'static str),
    /// The embedded queue (a table of the embedded database) failed.
    #[error("embedded queue: {0}")]
    Embedded(String),
}

impl BrokerError {
    pub(crate) fn amqp(operation: &'static str) -> impl FnOnce(lapin::Error) -> Self {
        move |source| Self::Amqp { operation, source }
    }
}

impl BrokerError {
    /// Whether waiting may help: not for unusable TLS settings, which a
    /// retry would only read again.
    pub fn is_transient(&self) -> bool {
        !matches!(self, BrokerError::Tls(_))
    }
}
