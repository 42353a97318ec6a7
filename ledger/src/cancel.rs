//! Cancelling a run.
//!
//! A run that waits for a worker (`claimed`, `dispatched`, `retrying`), or
//! whose worker is gone (`running` under an expired lease), becomes
//! `cancelled` at once, in one guarded statement: the outbox never
//! publishes it again and a worker that receives its message finds it
//! finished and drops it.
//!
//! A run a worker is executing stays `running` with a cancel request on
//! its row (`cancel_requested_at`, `cancel_reason`, `cancel_immediate`),
//! and the same transaction announces it on the [`CANCEL_CHANNEL`]
//! (`NOTIFY`, delivered on commit, so never before the request is stored).
//! Why Postgres rather than a RabbitMQ control exchange: the request and
//! its announcement commit together (a control message published after
//! the commit is lost if the API process dies in between), every worker
//! already holds a connection to the ledger, and the embedded mode has no
//! broker. A notification can still be missed (the worker's listening
//! connection dropped), so the worker's lease heartbeat also reads the
//! requests of the runs it holds ([`crate::Ledger::renew_leases`]): a
//! missed announcement delays the cancel by one heartbeat, never loses it.
//!
//! The worker then fires the handler's cancellation token, waits for the
//! grace period (none for an immediate cancel), abandons the attempt and
//! records `cancelled`. Whatever outcome an attempt of a run with a cancel
//! request records, the run does not continue: a retry becomes
//! `cancelled` instead (`end_batch`), and so does a hand-back at shutdown.
//! A handler that succeeded before it saw the request keeps its success
//! (its side effects happened).

use uuid::Uuid;

use crate::{Ledger, LedgerError, RunStatus};

/// The `LISTEN`/`NOTIFY` channel of cancel requests. The payload is the
/// run's id, followed by ` now` for an immediate cancel.
pub const CANCEL_CHANNEL: &str = "belfry_cancel";

/// A cancel request.
#[derive(Debug, Clone)]
pub struct CancelRequest<'a> {
    /// The run.
    pub id: Uuid,
    /// Who cancelled it and why, as the run's `last_error` will say
    /// (`cancelled by ops: wrong payload`).
    pub reason: &'a str,
    /// Abandon a running attempt at once, without the grace period.
    pub immediate: bool,
}

/// What a cancel request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The run was waiting (or its worker was gone): it is `cancelled`
    /// now. `was` is the status it had.
    Cancelled {
        /// The status the run left.
        was: RunStatus,
    },
    /// A worker is running it: the request is stored and announced; the
    /// worker records the end.
    Requested,
    /// The run had already finished with this status; nothing changed.
    Finished(RunStatus),
    /// No run has this id.
    NotFound,
}

/// A cancel announcement as a worker receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelNotice {
    /// The run.
    pub id: Uuid,
    /// No grace period.
    pub immediate: bool,
}

impl CancelNotice {
    /// The `NOTIFY` payload of this notice.
    pub fn payload(&self) -> String {
        if self.immediate {
            format!("{} now", self.id)
        } else {
            self.id.to_string()
        }
    }

    /// The notice a payload announces; `None` for anything else (a
    /// `NOTIFY` sent by hand, say), which the listener ignores.
    pub fn parse(payload: &str) -> Option<Self> {
        let (id, immediate) = match payload.strip_suffix(" now") {
            Some(id) => (id, true),
            None => (payload, false),
        };
        Some(Self {
            id: Uuid::parse_str(id).ok()?,
            immediate,
        })
    }
}

impl Ledger {
    /// Cancels a run; see the module docs for what happens to a waiting
    /// and to a running run.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn cancel_run(
        &self,
        request: &CancelRequest<'_>,
    ) -> Result<CancelOutcome, LedgerError> {
        let reason = crate::storable(request.reason);
        let request = CancelRequest {
            reason: &reason,
            ..request.clone()
        };
        self.store.cancel_run(&request).await
    }

    /// Follows cancel announcements ([`CANCEL_CHANNEL`], or the embedded
    /// ledger's in-process announcements); each item is a payload for
    /// [`CancelNotice::parse`].
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the listener cannot connect.
    pub async fn listen_cancels(&self) -> Result<crate::ChangeListener, LedgerError> {
        self.store.listen_cancels().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_round_trip_and_foreign_payloads_are_ignored() {
        for immediate in [false, true] {
            let n = CancelNotice {
                id: Uuid::now_v7(),
                immediate,
            };
            assert_eq!(CancelNotice::parse(&n.payload()), Some(n));
        }
        assert_eq!(CancelNotice::parse("hello"), None);
        assert_eq!(CancelNotice::parse(""), None);
    }
}
