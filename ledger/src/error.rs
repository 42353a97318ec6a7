//! Errors of the ledger layer.

use thiserror::Error;

/// What went wrong talking to the ledger.
#[derive(Debug, Error)]
pub enum LedgerError {
    /// The database could not be reached at start.
    #[error("cannot connect to Postgres at {url}: {source}")]
    Connect {
        /// The URL tried, password masked.
        url: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// The embedded database could not be opened.
    #[error("cannot open the embedded database {url}: {source}")]
    OpenEmbedded {
        /// The URL tried.
        url: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// The embedded database belongs to another process, or its lock file
    /// cannot be taken.
    #[error("cannot use the embedded database {path}: {detail}")]
    InUse {
        /// The database file.
        path: String,
        /// What is wrong and what to do.
        detail: String,
    },
    /// Applying migrations failed.
    #[error("applying database migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A query failed (connection lost, constraint violated, ...).
    #[error("ledger query failed: {0}")]
    Query(#[from] sqlx::Error),
    /// A stored value could not be understood (a status this build does not
    /// know, for example).
    #[error("ledger holds an unexpected value: {0}")]
    Corrupt(String),
    /// A message id is already used by a different run.
    #[error("message id {id} already belongs to another run; refusing to reuse it for {run_key}")]
    IdConflict {
        /// The reused id.
        id: uuid::Uuid,
        /// The run key of the message that tried to reuse it.
        run_key: String,
    },
}

impl LedgerError {
    /// True when the error is about reaching the database rather than about
    /// the data: the operation may succeed if retried later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Connect { .. }
                | Self::Query(
                    sqlx::Error::Io(_)
                        | sqlx::Error::PoolTimedOut
                        | sqlx::Error::PoolClosed
                        | sqlx::Error::WorkerCrashed
                )
        )
    }
}
