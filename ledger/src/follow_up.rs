//! Follow-up jobs: enqueuing the children of ended runs, exactly once.
//!
//! A run's follow-up lists travel in its options (see
//! [`belfry_protocol::follow_up`]). Nothing on the worker's hot path looks
//! at them: every scheduler replica's reconcile loop runs a *follow-up
//! pass* ([`Ledger::settle_follow_ups`]) that takes ended runs with
//! undecided follow-ups (a partial index holds only those), and in one
//! transaction per page:
//!
//! 1. locks the page's parents (`FOR UPDATE SKIP LOCKED` on Postgres, the
//!    one writer on SQLite), so two replicas never decide the same parent
//!    at once;
//! 2. looks up the other parents a joining follow-up waits for;
//! 3. inserts each decided child through the claim path's `INSERT ... ON
//!    CONFLICT DO NOTHING`, its run key derived from the parent's — so a
//!    child already enqueued (by another parent of a join, or a pass whose
//!    commit this one did not see) is not enqueued again;
//! 4. marks the parents decided (`follow_ups_done_at`), or, for a join
//!    still waiting for another parent, when to look again.
//!
//! Inserting the children and marking the parent happen in one commit: a
//! pass that dies before it leaves the parent undecided for the next pass,
//! which enqueues the same keys. Whatever ended the parent — a worker's
//! outcome, a dead letter, a cancel, the reconciler — the pass sees it the
//! same way, and a redelivered or retried outcome changes nothing (the run
//! ends once; its follow-ups are decided once). A child is `claimed` and
//! due at once, so the outbox pass right after publishes it.
//!
//! A join's child is recorded `cancelled`, with the reason, when another
//! parent ended without succeeding, or when that parent had not ended
//! [`JOIN_WAIT`] after this one.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use belfry_protocol::{FollowUp, JobOptions, ParentRun};

use crate::runs::NewRun;
use crate::{Ledger, LedgerError};

/// How long a joining follow-up waits for its other parents after the
/// parent that looked first ended; then it is recorded `cancelled`.
pub const JOIN_WAIT: chrono::Duration = chrono::Duration::hours(24);

/// An ended run with undecided follow-ups, as the pass reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct EndedParent {
    /// The run and how it ended.
    #[sqlx(flatten)]
    pub(crate) run: RelatedRun,
    pub(crate) options: serde_json::Value,
    pub(crate) trace_id: Option<String>,
    pub(crate) traceparent: Option<String>,
    pub(crate) finished_at: Option<DateTime<Utc>>,
    /// Whether an earlier pass looked at it already (a join waited).
    pub(crate) looked: bool,
}

/// The columns of [`EndedParent`] but its run's `result`, which each
/// backend adds in its own SQL ([`RESULT_COLUMN_PG`]).
/// (`finished_at` falls back on `updated_at`, so a join's wait always
/// ends.)
pub(crate) const ENDED_PARENT_COLUMNS: &str =
    "id, job_name, run_key, status, last_error, options, \
     trace_id, traceparent, COALESCE(finished_at, updated_at) AS finished_at, \
     follow_ups_next_at IS NOT NULL AS looked";

/// A parent as a follow-up sees it: the pass's own parent, or another
/// parent of a join as found in the ledger.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RelatedRun {
    pub(crate) id: Uuid,
    pub(crate) job_name: String,
    pub(crate) run_key: String,
    pub(crate) status: String,
    pub(crate) last_error: Option<String>,
    /// Its last attempt entry's `result`, as JSON text (each backend's
    /// [`RESULT_COLUMN_PG`]).
    pub(crate) result: Option<String>,
}

impl RelatedRun {
    /// The run as a child carries it in its options. A result that does
    /// not parse (a hand-edited row) is passed on as its text.
    fn as_parent(&self) -> ParentRun {
        ParentRun {
            id: self.id,
            job_name: self.job_name.clone(),
            run_key: self.run_key.clone(),
            status: self.status.clone(),
            error: self.last_error.clone(),
            result: self.result.as_ref().map(|t| {
                serde_json::from_str(t).unwrap_or_else(|_| serde_json::Value::String(t.clone()))
            }),
        }
    }
}

/// Each backend's expression of a run's result (its last attempt entry's
/// `result`, as JSON text, `NULL` when it has none), named `result`.
pub(crate) const RESULT_COLUMN_PG: &str = "(attempt_log -> -1 -> 'result')::text AS result";
/// SQLite's form of [`RESULT_COLUMN_PG`] (`->` always yields JSON text).
pub(crate) const RESULT_COLUMN_SQLITE: &str = "attempt_log -> '$[#-1].result' AS result";

/// What a page's pass writes, in one transaction.
#[derive(Debug, Default)]
pub(crate) struct FollowUpPlan {
    /// Children to claim, due at once (inserted with `skip`'s, in key
    /// order: see [`FollowUpPlan::all_children`]).
    pub(crate) enqueue: Vec<NewRun>,
    /// Children to record as `cancelled`, each with its reason.
    pub(crate) skip: Vec<(NewRun, String)>,
    /// Parents whose follow-ups are all decided.
    pub(crate) done: Vec<Uuid>,
    /// Parents with a join still waiting, and when to look again.
    pub(crate) later: Vec<(Uuid, DateTime<Utc>)>,
}

impl FollowUpPlan {
    /// `(job_name, run_key)` of the children to enqueue whose claim `won`
    /// holds (inserted by this pass, not found already there).
    pub(crate) fn enqueued(&self, won: &HashSet<Uuid>) -> Vec<(String, String)> {
        self.enqueue
            .iter()
            .filter(|c| won.contains(&c.id))
            .map(|c| (c.job_name.clone(), c.run_key.clone()))
            .collect()
    }

    /// Every child to insert, to enqueue or to record `cancelled`, in one
    /// order by key: one statement inserts them all, so two passes sharing
    /// keys (one to enqueue, the other to cancel) take them in the same
    /// order and never wait for each other in a cycle.
    pub(crate) fn all_children(&self) -> Vec<NewRun> {
        let mut all: Vec<NewRun> = self
            .enqueue
            .iter()
            .cloned()
            .chain(self.skip.iter().map(|(run, _)| run.clone()))
            .collect();
        all.sort_by(|a, b| (&a.job_name, &a.run_key).cmp(&(&b.job_name, &b.run_key)));
        all
    }

    /// `(id, reason)` of the children to record `cancelled` whose claim
    /// `won` holds.
    pub(crate) fn skipped(&self, won: &HashSet<Uuid>) -> Vec<(Uuid, String)> {
        self.skip
            .iter()
            .filter(|(run, _)| won.contains(&run.id))
            .map(|(run, reason)| (run.id, reason.clone()))
            .collect()
    }
}

/// What one follow-up pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FollowUpPass {
    /// Ended runs looked at.
    pub parents: usize,
    /// Children this pass inserted: `(job_name, run_key)`.
    pub enqueued: Vec<(String, String)>,
    /// Join children recorded `cancelled` (another parent did not succeed).
    pub skipped: usize,
    /// Parents with a join still waiting for another parent.
    pub waiting: usize,
}

/// The other parents' keys the page's joins wait for, to look up.
pub(crate) fn other_keys(parents: &[EndedParent]) -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = parents
        .iter()
        .flat_map(|p| {
            follow_ups_of(p)
                .into_iter()
                .flat_map(|f| f.other_parent_keys(&p.run.job_name, &p.run.run_key))
                .collect::<Vec<_>>()
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The follow-ups `parent`'s end enqueues (none if its options do not
/// read or its lists break the rules, as a hand-published message's may:
/// such a parent is marked decided, never looked at again).
fn follow_ups_of(parent: &EndedParent) -> Vec<FollowUp> {
    let options = serde_json::from_value::<JobOptions>(parent.options.clone())
        .map_err(|e| e.to_string())
        .and_then(|o| match o.follow_ups.validate(&parent.run.job_name) {
            Ok(()) => Ok(o),
            Err(e) => Err(e.to_string()),
        });
    match options {
        Ok(options) => options
            .follow_ups
            .for_status(&parent.run.status)
            .into_iter()
            .cloned()
            .collect(),
        Err(e) => {
            tracing::warn!(run_key = %parent.run.run_key, error = %e,
                "a run's follow-ups do not read or break a rule; they are not enqueued");
            Vec::new()
        }
    }
}

/// How long to wait before looking again at a parent whose join has
/// waited `waited`: a quarter of it, 1 s to 60 s (a quick sibling is seen
/// quickly, a parent hours behind costs a look a minute).
fn look_again_after(waited: chrono::Duration) -> chrono::Duration {
    (waited / 4).clamp(chrono::Duration::seconds(1), chrono::Duration::seconds(60))
}

/// Decides the page: for each parent, each follow-up its end enqueues is
/// enqueued, recorded `cancelled` (a join whose other parent did not
/// succeed, or did not end within [`JOIN_WAIT`]) or left waiting.
/// `others` holds the other parents found; `now` is the database's clock;
/// `by` the deciding replica.
pub(crate) fn plan(
    parents: &[EndedParent],
    others: &HashMap<(String, String), RelatedRun>,
    now: DateTime<Utc>,
    by: &str,
) -> FollowUpPlan {
    let mut out = FollowUpPlan::default();
    for parent in parents {
        let run = &parent.run;
        // When to look again, if a join still waits.
        let mut look_again: Option<DateTime<Utc>> = None;
        for f in follow_ups_of(parent) {
            // A later look is for the joins still waiting: the first look
            // decided every other follow-up in its commit (looking at them
            // again would enqueue a child retention has pruned since).
            if parent.looked && f.after.is_empty() {
                continue;
            }
            let Some(run_key) = f.child_run_key(&run.job_name, &run.run_key) else {
                continue;
            };
            let mut lineage = vec![run.as_parent()];
            let mut blocked: Option<String> = None;
            let mut missing: Option<String> = None;
            for (name, key) in f.other_parent_keys(&run.job_name, &run.run_key) {
                match others.get(&(name, key.clone())) {
                    Some(o) if o.status == "succeeded" => lineage.push(o.as_parent()),
                    Some(o) if is_end(&o.status) => {
                        blocked.get_or_insert(format!(
                            "not run: parent {} ended {}",
                            o.run_key, o.status
                        ));
                    }
                    _ => {
                        missing.get_or_insert(key);
                    }
                }
            }
            let waited = now - parent.finished_at.unwrap_or(now);
            let skip = match (blocked, missing) {
                (Some(reason), _) => Some(reason),
                (None, None) => None,
                (None, Some(key)) if waited > JOIN_WAIT => Some(format!(
                    "not run: parent {key} had not succeeded {} h after {} ended",
                    JOIN_WAIT.num_hours(),
                    run.run_key
                )),
                (None, Some(_)) => {
                    // Not inserted yet: the pass that sees every parent
                    // succeeded inserts it.
                    look_again = Some(now + look_again_after(waited));
                    continue;
                }
            };
            let child = child_run(parent, &f, run_key, lineage, now, by);
            match skip {
                Some(reason) => out.skip.push((child, reason)),
                None => out.enqueue.push(child),
            }
        }
        match look_again {
            Some(at) => out.later.push((run.id, at)),
            None => out.done.push(run.id),
        }
    }
    out
}

fn is_end(status: &str) -> bool {
    status
        .parse::<crate::RunStatus>()
        .is_ok_and(crate::RunStatus::is_terminal)
}

/// The child run of `f` for `parent`: claimed now by `by`, due at once,
/// in the parent's trace, carrying its parents' outcomes.
fn child_run(
    parent: &EndedParent,
    f: &FollowUp,
    run_key: String,
    parents: Vec<ParentRun>,
    now: DateTime<Utc>,
    by: &str,
) -> NewRun {
    let mut options = f.options.clone();
    options.parents = parents;
    NewRun {
        id: Uuid::now_v7(),
        job_name: f.job_name.clone(),
        run_key,
        job_type: f.job_type.clone(),
        payload: f.payload.clone(),
        scheduled_at: now,
        // Not a fire of a schedule's timetable (`fire_history::live_fire`):
        // misfire policies and retention's "newest fire" leave it alone.
        claimed_by: format!("follow-up:{by}"),
        trace_id: parent.trace_id.clone(),
        traceparent: parent.traceparent.clone(),
        options,
        next_dispatch_at: now,
    }
}

impl Ledger {
    /// One follow-up pass over at most `limit` ended runs with undecided
    /// follow-ups, by replica `by` (see the module notes): children
    /// enqueued, join children that cannot run recorded `cancelled`,
    /// parents marked decided, in one transaction.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached (nothing
    /// is written; the next pass decides the same parents).
    pub async fn settle_follow_ups(
        &self,
        limit: i64,
        by: &str,
    ) -> Result<FollowUpPass, LedgerError> {
        self.store.settle_follow_ups(limit, by).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_protocol::FollowUps;

    fn parent(name: &str, status: &str, follow_ups: FollowUps) -> EndedParent {
        let options = JobOptions {
            follow_ups,
            ..JobOptions::default()
        };
        EndedParent {
            run: RelatedRun {
                id: Uuid::now_v7(),
                job_name: name.into(),
                run_key: format!("{name}@2026-07-26T02:00:00Z"),
                status: status.into(),
                last_error: None,
                result: None,
            },
            options: serde_json::to_value(options).unwrap(),
            trace_id: Some("t".into()),
            traceparent: None,
            finished_at: Some(at(0)),
            looked: false,
        }
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + chrono::Duration::seconds(1_800_000_000 + secs)
    }

    fn join(child: &str, after: &str) -> FollowUps {
        FollowUps {
            on_success: vec![FollowUp {
                job_name: child.into(),
                job_type: "noop".into(),
                after: vec![after.into()],
                ..FollowUp::default()
            }],
            ..FollowUps::default()
        }
    }

    fn other(name: &str, status: &str) -> HashMap<(String, String), RelatedRun> {
        let key = format!("{name}@2026-07-26T02:00:00Z");
        HashMap::from([(
            (name.to_owned(), key.clone()),
            RelatedRun {
                id: Uuid::now_v7(),
                job_name: name.into(),
                run_key: key,
                status: status.into(),
                last_error: None,
                result: None,
            },
        )])
    }

    #[test]
    fn a_join_waits_runs_or_is_skipped_by_its_other_parent() {
        let a = parent("extract-a", "succeeded", join("load", "extract-b"));
        assert_eq!(
            other_keys(std::slice::from_ref(&a)),
            [("extract-b".into(), "extract-b@2026-07-26T02:00:00Z".into())]
        );
        // Not ended yet: the parent waits, nothing inserted.
        let p = plan(
            std::slice::from_ref(&a),
            &other("extract-b", "running"),
            at(8),
            "r1",
        );
        assert!(p.enqueue.is_empty() && p.skip.is_empty() && p.done.is_empty());
        assert_eq!(p.later, [(a.run.id, at(10))]);
        // Succeeded: the child, with both parents, in the parent's trace.
        let p = plan(
            std::slice::from_ref(&a),
            &other("extract-b", "succeeded"),
            at(8),
            "r1",
        );
        assert_eq!(p.done, [a.run.id]);
        let child = &p.enqueue[0];
        assert_eq!(child.run_key, "load@2026-07-26T02:00:00Z");
        assert_eq!(child.options.parents.len(), 2);
        assert_eq!(child.trace_id.as_deref(), Some("t"));
        // Failed: recorded cancelled with the reason.
        let p = plan(
            std::slice::from_ref(&a),
            &other("extract-b", "failed"),
            at(8),
            "r1",
        );
        assert_eq!(p.done, [a.run.id]);
        assert!(p.skip[0]
            .1
            .contains("extract-b@2026-07-26T02:00:00Z ended failed"));
        // Never ended within the wait: cancelled too.
        let late = at(0) + JOIN_WAIT + chrono::Duration::seconds(1);
        let p = plan(std::slice::from_ref(&a), &HashMap::new(), late, "r1");
        assert!(
            p.skip[0].1.contains("had not succeeded 24 h"),
            "{:?}",
            p.skip
        );
    }

    #[test]
    fn a_parent_that_failed_enqueues_its_failure_list_only() {
        let lists = FollowUps {
            on_success: vec![FollowUp {
                job_name: "report".into(),
                job_type: "noop".into(),
                ..FollowUp::default()
            }],
            on_failure: vec![FollowUp {
                job_name: "page-oncall".into(),
                job_type: "noop".into(),
                ..FollowUp::default()
            }],
            ..FollowUps::default()
        };
        let p = plan(
            &[parent("nightly", "dead", lists)],
            &HashMap::new(),
            at(1),
            "r1",
        );
        let keys: Vec<_> = p.enqueue.iter().map(|c| c.run_key.as_str()).collect();
        assert_eq!(keys, ["page-oncall@2026-07-26T02:00:00Z"]);
        assert_eq!(p.enqueue[0].options.parents[0].status, "dead");
    }

    #[test]
    fn unreadable_or_bad_lists_are_decided_with_nothing_enqueued() {
        let mut bad = parent("nightly", "succeeded", FollowUps::default());
        bad.options = serde_json::json!({"follow_ups": 7});
        let p = plan(std::slice::from_ref(&bad), &HashMap::new(), at(1), "r1");
        assert_eq!(p.done, [bad.run.id]);
        assert!(p.enqueue.is_empty());
        let lists = FollowUps {
            on_success: vec![FollowUp {
                job_name: "has space".into(),
                job_type: "noop".into(),
                ..FollowUp::default()
            }],
            ..FollowUps::default()
        };
        let bad = parent("nightly", "succeeded", lists);
        let p = plan(std::slice::from_ref(&bad), &HashMap::new(), at(1), "r1");
        assert_eq!((p.done.len(), p.enqueue.len()), (1, 0));
    }
}
