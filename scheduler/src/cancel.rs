//! The operator's cancel of a run (`POST /v1/runs/{id}/cancel`, `belfry
//! runs cancel`, the web view's button): the ledger decides and stores it
//! (see `belfry_ledger`'s `cancel` module for what happens to a waiting and
//! to a running run, and how the worker holding a running one is told);
//! this writes the audit line and turns "not found" and "already finished"
//! into errors a front end can answer with.

use belfry_ledger::{CancelOutcome, CancelRequest};

use crate::ops::{audit, Ops, OpsError};

/// Longest reason kept (characters); a longer one is cut.
pub const MAX_REASON_CHARS: usize = 1000;

/// What a cancel did, and the run as stored just after (`None` if it
/// could not be read back: the cancel is made either way).
#[derive(Debug, Clone)]
pub struct CancelDone {
    /// What happened.
    pub cancelled: Cancelled,
    /// The run after the cancel.
    pub run: Option<belfry_ledger::RunRecord>,
}

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The run was not executing: it is `cancelled` now. `was` is the
    /// status it left.
    Now {
        /// The status it had.
        was: belfry_ledger::RunStatus,
    },
    /// Its worker was told; it ends the run within the grace period.
    Requested,
}

/// The run's `last_error` for a cancel by `actor` with an optional reason.
pub fn cancel_reason(actor: &str, reason: Option<&str>) -> String {
    match reason.map(str::trim).filter(|r| !r.is_empty()) {
        Some(r) => {
            let r: String = r.chars().take(MAX_REASON_CHARS).collect();
            format!("cancelled by {actor}: {r}")
        }
        None => format!("cancelled by {actor}"),
    }
}

impl Ops {
    /// Cancels run `id` on behalf of `actor` (the token's name), with an
    /// optional `reason`; `detail` goes into the audit line (`web view`,
    /// say).
    ///
    /// # Errors
    ///
    /// [`OpsError::RunNotFound`], [`OpsError::RunFinished`], or the
    /// ledger's.
    pub async fn cancel_run(
        &self,
        actor: &str,
        id: uuid::Uuid,
        reason: Option<&str>,
        detail: &str,
    ) -> Result<CancelDone, OpsError> {
        let text = cancel_reason(actor, reason);
        let outcome = self
            .replica()
            .ledger()
            .cancel_run(&CancelRequest {
                id,
                reason: &text,
                immediate: false,
            })
            .await?;
        let done = match outcome {
            CancelOutcome::NotFound => return Err(OpsError::RunNotFound { id }),
            CancelOutcome::Finished(status) => return Err(OpsError::RunFinished { id, status }),
            CancelOutcome::Cancelled { was } => Cancelled::Now { was },
            CancelOutcome::Requested => Cancelled::Requested,
        };
        let what = match done {
            Cancelled::Now { was } => format!("run {id} ({was}) cancelled: {text}"),
            Cancelled::Requested => format!("run {id} (running) cancel requested: {text}"),
        };
        let detail = if detail.is_empty() {
            what
        } else {
            format!("{what} ({detail})")
        };
        let run = self.replica().ledger().run(id).await.ok().flatten();
        let name = run.as_ref().map_or("", |r| r.job_name.as_str());
        audit(actor, "run.cancel", name, &detail);
        Ok(CancelDone {
            cancelled: done,
            run,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_names_the_actor_and_is_bounded() {
        assert_eq!(cancel_reason("ops", None), "cancelled by ops");
        assert_eq!(cancel_reason("ops", Some("  ")), "cancelled by ops");
        assert_eq!(
            cancel_reason("ops", Some("wrong payload")),
            "cancelled by ops: wrong payload"
        );
        let long = "x".repeat(5000);
        assert_eq!(
            cancel_reason("ops", Some(&long)).len(),
            "cancelled by ops: ".len() + MAX_REASON_CHARS
        );
    }
}
