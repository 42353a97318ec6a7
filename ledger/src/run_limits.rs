//! The limits a run is started under: a concurrency limit
//! (`crate::concurrency`), a rate limit (`crate::rate_limit`), both, or
//! none. With both, a start needs a free slot *and* a free start in the
//! window; the slot is checked first, so a run that would wait for a slot
//! does not use up a start of the window.

use crate::concurrency::ConcurrencyLimit;
use crate::rate_limit::StartRate;
use crate::runs::AttemptStart;
use crate::LedgerError;

/// Which limit a waiting run waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// A slot of its concurrency key.
    Concurrency,
    /// A start in its rate key's window.
    Rate,
}

/// The limits of one run's start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunLimits {
    /// At most so many running at once.
    pub concurrency: Option<ConcurrencyLimit>,
    /// At most so many starts per window.
    pub rate: Option<StartRate>,
}

impl RunLimits {
    /// No limit: the start takes the batched path.
    pub fn is_empty(&self) -> bool {
        self.concurrency.is_none() && self.rate.is_none()
    }

    /// A concurrency limit alone.
    pub fn concurrency(limit: ConcurrencyLimit) -> Self {
        Self {
            concurrency: Some(limit),
            rate: None,
        }
    }

    /// A rate limit alone.
    pub fn rate(rate: StartRate) -> Self {
        Self {
            concurrency: None,
            rate: Some(rate),
        }
    }
}

/// Ends the transaction of a run put back to wait: commits it, or rolls it
/// back when the run was not startable after all (a duplicate delivery of
/// a running run), so nothing it did stays, not even the turn it took.
///
/// # Errors
///
/// The database's, when the commit or rollback fails.
pub(crate) async fn settle<DB: sqlx::Database>(
    tx: sqlx::Transaction<'static, DB>,
    waiting: Option<AttemptStart>,
) -> Result<Option<AttemptStart>, LedgerError> {
    if waiting.is_some() {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(waiting)
}
