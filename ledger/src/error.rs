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
    /// This replica's shard count differs from the one the live replicas
    /// use (`BELFRY_SHARDS`).
    #[error(
        "BELFRY_SHARDS is {configured} but the running replicas split the schedules into {stored} \
         shards: set BELFRY_SHARDS={stored}, or stop every replica to change the count"
    )]
    ShardCount {
        /// This replica's setting.
        configured: u32,
        /// The ledger's.
        stored: u32,
    },
    /// The operation needs a Postgres ledger.
    #[error("{0} needs a Postgres ledger; the embedded ledger runs one process")]
    Unsupported(&'static str),
    /// An operation was given up on after its bound: the database is slow
    /// or unreachable (the server-side bound, where one is set, ends the
    /// statement there too).
    #[error("{what} took longer than {after:?}; given up (the database is slow or unreachable)")]
    TimedOut {
        /// What was given up on.
        what: &'static str,
        /// The bound.
        after: std::time::Duration,
    },
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
    /// True when the database refused the data itself, so the same request
    /// will fail again however often it is retried: Postgres SQLSTATE class
    /// 22 (data exception: NUL in text, invalid encoding, a value out of
    /// range), class 54 (program limit exceeded: a key too large for its
    /// index), check and not-null violations; SQLite's "too big", "datatype
    /// mismatch", "out of range", check and not-null constraint codes; a
    /// value the driver cannot encode; a message id owned by another run.
    ///
    /// A data error is not an outage: the worker dead-letters the message
    /// with this error as the reason instead of handing it back, and a
    /// batched statement that fails on data is split so that only the bad
    /// row fails.
    pub fn is_data_error(&self) -> bool {
        match self {
            Self::IdConflict { .. } | Self::Query(sqlx::Error::Encode(_)) => true,
            Self::Query(sqlx::Error::Database(db)) => {
                use sqlx::error::ErrorKind;
                if matches!(
                    db.kind(),
                    ErrorKind::CheckViolation | ErrorKind::NotNullViolation
                ) {
                    return true;
                }
                let Some(code) = db.code() else {
                    return false;
                };
                match code.parse::<i64>() {
                    // SQLite: the primary result code is the low byte of the
                    // extended one. 18 TOOBIG, 20 MISMATCH, 25 RANGE.
                    Ok(n) if code.len() != 5 => matches!(n & 0xff, 18 | 20 | 25),
                    // Postgres SQLSTATE: five characters, the class first.
                    _ => code.starts_with("22") || code.starts_with("54"),
                }
            }
            _ => false,
        }
    }

    /// The database's own words, when it refused a statement (what an
    /// operator should read, without the driver's wrapping).
    pub fn database_message(&self) -> Option<&str> {
        match self {
            Self::Query(sqlx::Error::Database(db)) => Some(db.message()),
            _ => None,
        }
    }

    /// True when the error is about reaching the database rather than about
    /// the data: the operation may succeed if retried later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Connect { .. }
                | Self::TimedOut { .. }
                | Self::Query(
                    sqlx::Error::Io(_)
                        | sqlx::Error::PoolTimedOut
                        | sqlx::Error::PoolClosed
                        | sqlx::Error::WorkerCrashed
                )
        )
    }
}
