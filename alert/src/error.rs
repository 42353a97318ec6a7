//! What can be wrong with the alert configuration (the `BELFRY_ALERTS`
//! file and the secrets it names). Sending never fails with an error of
//! this type: a delivery that cannot be sent is retried or given up, and
//! the reason is stored with it (`belfry_ledger::DeliveryResult`).

use thiserror::Error;

/// An alert configuration that cannot be used: each names the file, the
/// channel or route, and what to change.
#[derive(Debug, Error)]
pub enum AlertError {
    /// The file cannot be read.
    #[error("cannot read the alerts file {path} (BELFRY_ALERTS): {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the documented shape.
    #[error("the alerts file {path} (BELFRY_ALERTS) is invalid: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong, with the line where the parser knows it.
        reason: String,
    },
    /// A channel's settings cannot be used.
    #[error("alert channel {channel:?}: {reason}")]
    Channel {
        /// The channel's name.
        channel: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A route cannot be used.
    #[error("alert route #{index} (the {index}th [[routes]] table): {reason}")]
    Route {
        /// Its position in the file, from 1.
        index: usize,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A test alert was asked for a channel that is not configured.
    #[error(
        "no alert channel is named {0:?}; the configured ones are listed by `belfry alerts ls`"
    )]
    UnknownChannel(String),
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] belfry_ledger::LedgerError),
}
