//! Overlap policies: what happens to a fire of a schedule whose previous
//! run is unfinished, Temporal's set.
//!
//! | rule | the new fire | the unfinished run |
//! | --- | --- | --- |
//! | `skip` (alias `forbid`) | not run; recorded in `skipped_fires` | goes on |
//! | `buffer_one` | `buffered`, unless a fire is buffered already (then skipped) | goes on |
//! | `buffer_all` | `buffered`, in order behind earlier buffered fires | goes on |
//! | `cancel_other` | `buffered` until the cancelled run has ended | cancelled, with the grace period |
//! | `terminate_other` | claimed and started at once | cancelled without grace |
//! | `allow_all` (alias `allow`) | claimed at once (no decision) | goes on |
//!
//! The decision is taken under the same per-schedule serialization as the
//! `skip` policy always was (a transaction-scoped advisory lock on Postgres,
//! the one writer on SQLite), so racing replicas agree: one of them inserts
//! the run (or records the skip) and cancels what the rule cancels. A
//! buffered fire keeps its nominal run key and instant; it is released
//! ([`Ledger::release_buffered`], buffered → claimed, then the outbox
//! publishes it) by a replica's reconciler once nothing of its schedule is
//! unfinished, the oldest first. A run whose worker is gone (`running`
//! under an expired lease) does not hold a schedule back, as before.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::runs::RunRecord;
use crate::{ExclusiveClaim, Ledger, LedgerError, RunStatus};

/// Ran out: the fire of a schedule whose `remaining_runs` counter is at
/// zero is not claimed (and recorded as skipped).
pub(crate) const RAN_OUT: &str = "remaining_runs: no runs left";

/// The note a schedule is paused with when its last counted run is
/// claimed.
pub(crate) const RAN_OUT_NOTE: &str =
    "ran out: every run of its remaining_runs has fired; set a new remaining_runs and resume it to fire again";

/// The overlap rules that need a decision (see the module docs; `allow_all`
/// needs none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapRule {
    /// Skip the fire.
    Skip,
    /// Buffer at most one fire.
    BufferOne,
    /// Buffer every fire, in order.
    BufferAll,
    /// Cancel the unfinished run, start the fire when it has ended.
    CancelOther,
    /// Cancel the unfinished run without grace, start the fire now.
    TerminateOther,
}

impl OverlapRule {
    /// The rule's name, as schedules write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::BufferOne => "buffer_one",
            Self::BufferAll => "buffer_all",
            Self::CancelOther => "cancel_other",
            Self::TerminateOther => "terminate_other",
        }
    }
}

/// An unfinished earlier run of the schedule, as the decision sees it:
/// buffered, waiting or running.
#[derive(Debug, Clone)]
pub(crate) struct Earlier {
    pub(crate) id: Uuid,
    pub(crate) run_key: String,
    pub(crate) status: RunStatus,
    /// `running` under an expired lease: its worker is gone. It does not
    /// hold the schedule back, but a policy that cancels cancels it too
    /// (or a redelivery would take it over beside the new fire).
    pub(crate) expired: bool,
}

/// A row of the decision's read, as both backends return it: `(id,
/// run_key, status, lease expired, scheduled_at)`.
pub(crate) type EarlierRow = (Uuid, String, String, bool, DateTime<Utc>);

impl Earlier {
    /// The runs of `rows`, oldest fire first (the rows are read in id
    /// order, the order every batched statement locks `job_runs` rows in).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Corrupt`] for a status that is not a run status.
    pub(crate) fn parse(mut rows: Vec<EarlierRow>) -> Result<Vec<Self>, LedgerError> {
        rows.sort_by_key(|r| r.4);
        rows.into_iter()
            .map(|(id, run_key, status, expired, _)| {
                Ok(Self {
                    id,
                    run_key,
                    status: status.parse().map_err(LedgerError::Corrupt)?,
                    expired,
                })
            })
            .collect()
    }
}

/// What the backend does for a fire (see [`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Record the fire as skipped, with this reason.
    Skip(String),
    /// Cancel `cancel` (with `reason`; without grace when `immediate`),
    /// then insert the run, `buffered` or claimed.
    Insert {
        buffered: bool,
        cancel: Vec<Uuid>,
        immediate: bool,
        reason: String,
    },
}

/// The reason a run cancelled by `rule` for the fire `run_key` ends with.
fn cancel_reason(rule: OverlapRule, run_key: &str) -> String {
    format!(
        "cancelled by overlap policy {}: fire {run_key} replaced it",
        rule.as_str()
    )
}

/// The decision for the fire `run_key` under `rule` (`None`: `allow_all`,
/// a fire decided here only because it counts down `remaining_runs`),
/// given the schedule's unfinished earlier runs, oldest first. The same on
/// both backends.
pub(crate) fn plan(rule: Option<OverlapRule>, run_key: &str, earlier: &[Earlier]) -> Plan {
    let insert = |buffered| Plan::Insert {
        buffered,
        cancel: Vec::new(),
        immediate: false,
        reason: String::new(),
    };
    let Some(rule) = rule else {
        return insert(false);
    };
    // Runs whose worker is gone hold nothing back.
    let live: Vec<&Earlier> = earlier.iter().filter(|e| !e.expired).collect();
    let Some(last) = live.last() else {
        return match rule {
            // Nothing live: start now, and end what a redelivery would
            // otherwise take over beside this fire.
            OverlapRule::CancelOther | OverlapRule::TerminateOther if !earlier.is_empty() => {
                Plan::Insert {
                    buffered: false,
                    cancel: earlier.iter().map(|e| e.id).collect(),
                    immediate: rule == OverlapRule::TerminateOther,
                    reason: cancel_reason(rule, run_key),
                }
            }
            _ => insert(false),
        };
    };
    match rule {
        OverlapRule::Skip => Plan::Skip(format!(
            "overlap: previous run {} is not finished",
            last.run_key
        )),
        OverlapRule::BufferOne => match live.iter().find(|e| e.status == RunStatus::Buffered) {
            Some(b) => Plan::Skip(format!(
                "overlap (buffer_one): run {} is already buffered",
                b.run_key
            )),
            None => insert(true),
        },
        OverlapRule::BufferAll => insert(true),
        OverlapRule::CancelOther | OverlapRule::TerminateOther => {
            let immediate = rule == OverlapRule::TerminateOther;
            // Cancelling a running run only asks its worker: the new fire
            // waits for it to end, unless the rule starts it at once.
            let running = live.iter().any(|e| e.status == RunStatus::Running);
            Plan::Insert {
                buffered: running && !immediate,
                cancel: earlier.iter().map(|e| e.id).collect(),
                immediate,
                reason: cancel_reason(rule, run_key),
            }
        }
    }
}

/// The decision for a fire of a schedule whose `remaining_runs` counter
/// is `left` (`None`: unbounded, or a fire that does not count): skipped
/// as ran out at zero, otherwise [`plan`].
pub(crate) fn decide(
    rule: Option<OverlapRule>,
    run_key: &str,
    left: Option<i64>,
    earlier: &[Earlier],
) -> Plan {
    if left == Some(0) {
        Plan::Skip(RAN_OUT.into())
    } else {
        plan(rule, run_key, earlier)
    }
}

/// What a skipped fire of a schedule with counter `left` answers.
pub(crate) fn skipped(left: Option<i64>) -> ExclusiveClaim {
    if left == Some(0) {
        ExclusiveClaim::RanOut
    } else {
        ExclusiveClaim::Overlapped
    }
}

/// What an insert answers: taken unless it `won`, held when `buffered`.
pub(crate) fn inserted(won: bool, buffered: bool) -> ExclusiveClaim {
    match (won, buffered) {
        (false, _) => ExclusiveClaim::Taken,
        (true, true) => ExclusiveClaim::Buffered,
        (true, false) => ExclusiveClaim::Won,
    }
}

impl Ledger {
    /// Releases buffered runs whose schedule has nothing unfinished and is
    /// not paused: the oldest buffered run of each such schedule becomes
    /// `claimed`, due at
    /// once, for the outbox to publish (its `claimed_at` is the release, so
    /// the misfire handling of late claims does not take it for a fire
    /// that never reached the broker). At most `limit` schedules per call;
    /// returns the runs released.
    ///
    /// Safe on every replica at once: a run is released by one guarded
    /// update, and a schedule is released only while none of its runs is
    /// claimed, dispatched, running or retrying.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn release_buffered(&self, limit: i64) -> Result<Vec<RunRecord>, LedgerError> {
        self.store.release_buffered(limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(status: RunStatus, key: &str) -> Earlier {
        Earlier {
            id: Uuid::now_v7(),
            run_key: key.into(),
            status,
            expired: false,
        }
    }

    #[test]
    fn every_rule_decides_as_documented() {
        let none: Vec<Earlier> = Vec::new();
        for rule in [
            OverlapRule::Skip,
            OverlapRule::BufferOne,
            OverlapRule::BufferAll,
            OverlapRule::CancelOther,
            OverlapRule::TerminateOther,
        ] {
            assert!(
                matches!(plan(Some(rule), "s@3", &none), Plan::Insert { buffered: false, ref cancel, .. } if cancel.is_empty()),
                "{rule:?} with nothing unfinished starts at once"
            );
        }
        let running = vec![run(RunStatus::Running, "s@1")];
        assert!(matches!(
            plan(None, "s@3", &running),
            Plan::Insert {
                buffered: false,
                ..
            }
        ));
        assert!(
            matches!(plan(Some(OverlapRule::Skip), "s@3", &running), Plan::Skip(r) if r.contains("s@1"))
        );
        assert!(matches!(
            plan(Some(OverlapRule::BufferOne), "s@3", &running),
            Plan::Insert { buffered: true, .. }
        ));
        let both = vec![
            run(RunStatus::Running, "s@1"),
            run(RunStatus::Buffered, "s@2"),
        ];
        assert!(
            matches!(plan(Some(OverlapRule::BufferOne), "s@3", &both), Plan::Skip(r) if r.contains("s@2"))
        );
        assert!(matches!(
            plan(Some(OverlapRule::BufferAll), "s@3", &both),
            Plan::Insert { buffered: true, .. }
        ));
        match plan(Some(OverlapRule::CancelOther), "s@3", &both) {
            Plan::Insert {
                buffered,
                cancel,
                immediate,
                reason,
            } => {
                assert!(buffered && !immediate && cancel.len() == 2);
                assert!(reason.contains("cancel_other") && reason.contains("s@3"));
            }
            other => panic!("{other:?}"),
        }
        match plan(Some(OverlapRule::TerminateOther), "s@3", &both) {
            Plan::Insert {
                buffered,
                cancel,
                immediate,
                ..
            } => {
                assert!(!buffered && immediate && cancel.len() == 2);
            }
            other => panic!("{other:?}"),
        }
        // A run whose worker is gone holds nothing back, but is cancelled.
        let gone = vec![Earlier {
            expired: true,
            ..run(RunStatus::Running, "s@1")
        }];
        assert!(matches!(
            plan(Some(OverlapRule::Skip), "s@3", &gone),
            Plan::Insert {
                buffered: false,
                ..
            }
        ));
        assert!(matches!(
            plan(Some(OverlapRule::CancelOther), "s@3", &gone),
            Plan::Insert { buffered: false, ref cancel, .. } if cancel.len() == 1
        ));
        // Only waiting runs to cancel: they end at once, the fire starts.
        let waiting = vec![run(RunStatus::Dispatched, "s@1")];
        assert!(matches!(
            plan(Some(OverlapRule::CancelOther), "s@3", &waiting),
            Plan::Insert {
                buffered: false,
                ..
            }
        ));
    }
}
