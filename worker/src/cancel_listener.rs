//! Following operators' cancels: a task per worker that listens for the
//! ledger's cancel announcements (`LISTEN belfry_cancel` on Postgres, the
//! embedded ledger's in-process announcements) and tells the attempt of a
//! cancelled run, if this worker holds one ([`Leases::request_cancel`]).
//!
//! The announcement is the fast path (a cancel reaches the handler within
//! milliseconds). It can be missed: the listening connection drops, the
//! database fails over, or the listener cannot connect at all (a pooler
//! without `BELFRY_DATABASE_DIRECT_URL`). The lease heartbeat reads the
//! cancel requests of the runs it renews, so a missed announcement delays a
//! cancel by one heartbeat (a quarter of `BELFRY_LEASE`), never loses it;
//! this task only has to keep trying.

use std::time::Duration;

use belfry_ledger::{CancelNotice, Ledger};
use tokio_util::sync::CancellationToken;

use crate::lease::Leases;

/// First pause before listening again after a failure; doubles to
/// [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Longest pause between attempts to listen.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Listens for cancels until `stop`, telling `leases` of each.
pub(crate) async fn follow_cancels(leases: Leases, ledger: Ledger, stop: CancellationToken) {
    let mut pause = FIRST_RETRY;
    loop {
        // Stop first: a worker being dropped must not reconnect.
        let listener = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            l = ledger.listen_cancels() => l,
        };
        let mut listener = match listener {
            // Kept for good: it reconnects by itself (see below).
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?pause,
                    "cannot listen for cancels; cancels reach this worker through the lease heartbeat until it can");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(MAX_RETRY);
                continue;
            }
        };
        loop {
            let next = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                n = listener.recv() => n,
            };
            match next {
                Ok(payload) => match CancelNotice::parse(&payload) {
                    Some(notice) => {
                        if leases.request_cancel(notice.id, notice.immediate) {
                            tracing::info!(run = %notice.id, immediate = notice.immediate,
                                "run cancelled by an operator; telling its handler");
                        }
                    }
                    None => {
                        tracing::debug!(%payload, "ignoring a cancel announcement that is not a run id")
                    }
                },
                // The Postgres listener reconnects by itself on the next
                // `recv`; what was announced meanwhile comes with the
                // heartbeat.
                Err(e) => {
                    tracing::warn!(error = %e, "cancel announcements interrupted; the lease heartbeat covers the gap");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(FIRST_RETRY) => {}
                    }
                }
            }
        }
    }
}
