//! Following changes as soon as they happen: which schedule changed (for
//! the replicas' timers) and which run an operator cancelled (for the
//! worker running it). On Postgres the change's transaction sends `NOTIFY`
//! (a trigger for schedules, the cancel statement for runs) and each
//! process `LISTEN`s; the embedded ledger announces its own writes
//! in-process.

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::broadcast;

use crate::LedgerError;

/// A subscription to one kind of change; see the module docs.
#[derive(Debug)]
pub struct ChangeListener {
    source: Source,
}

#[derive(Debug)]
enum Source {
    Postgres(Box<PgListener>),
    Local(broadcast::Receiver<String>),
}

impl ChangeListener {
    pub(crate) async fn postgres(pool: &PgPool, channel: &str) -> Result<Self, LedgerError> {
        // A connection of its own, with the pool's options (TLS, host):
        // `PgListener` keeps the connection it listens on for as long as it
        // lives, and taken from `pool` that would be one fewer for the work
        // for good — with `BELFRY_DB_POOL=1`, none, and nothing would run.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(pool.options().get_acquire_timeout())
            .connect_lazy_with((*pool.connect_options()).clone());
        let mut listener = PgListener::connect_with(&own).await?;
        listener.listen(channel).await?;
        Ok(Self {
            source: Source::Postgres(Box::new(listener)),
        })
    }

    pub(crate) fn local(receiver: broadcast::Receiver<String>) -> Self {
        Self {
            source: Source::Local(receiver),
        }
    }

    /// The next change: the name of a schedule that changed, or the
    /// announcement of a cancelled run (see `crate::cancel`).
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when notifications were interrupted (the Postgres
    /// connection dropped, or this subscriber fell behind): some changes
    /// may have been missed, so the caller should compare everything (a
    /// worker's heartbeat does that for cancels). The listener goes on
    /// working after an error.
    pub async fn recv(&mut self) -> Result<String, LedgerError> {
        match &mut self.source {
            Source::Postgres(l) => Ok(l.recv().await?.payload().to_owned()),
            Source::Local(rx) => match rx.recv().await {
                Ok(name) => Ok(name),
                Err(broadcast::error::RecvError::Lagged(n)) => Err(LedgerError::Corrupt(format!(
                    "{n} change announcements were missed"
                ))),
                // The ledger is gone: nothing will change any more.
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            },
        }
    }
}
