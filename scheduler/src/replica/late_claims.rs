//! The late-claim pass: fires claimed on time but never published (the
//! broker was unreachable, or the claiming replica died) are decided by
//! their schedule's misfire policy before the outbox reconciler republishes
//! them, a page at a time, so a pass ends whatever the backlog.

use chrono::{DateTime, Utc};

use belfry_ledger::LateClaim;
use belfry_protocol::ScheduleSpec;

use super::Replica;
use crate::counters::FireCounters;
use crate::misfire::DueInstants;
use crate::schedule::Schedule;
use crate::SchedulerError;

/// Consecutive late claims of one schedule, in page order.
fn by_schedule(page: Vec<LateClaim>) -> Vec<(String, Vec<LateClaim>)> {
    let mut groups: Vec<(String, Vec<LateClaim>)> = Vec::new();
    for claim in page {
        match groups.last_mut() {
            Some((name, runs)) if *name == claim.job_name => runs.push(claim),
            _ => groups.push((claim.job_name.clone(), vec![claim])),
        }
    }
    groups
}

/// Default number of late claims read per page by the late-claim pass. At
/// least the largest `catch_up` `max` (10,000): a policy's decision for a
/// schedule needs its newest `max` late claims on one page.
pub const DEFAULT_LATE_CLAIM_PAGE: usize = 10_000;

/// What one late-claim pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LateClaimPass {
    /// Claims skipped by misfire policies.
    pub skipped: u64,
    /// Pages read (a pass reads every late claim, page by page).
    pub pages: u64,
}

impl Replica {
    /// Applies misfire policies to fires that were claimed on time but never
    /// reached the broker (it was unreachable, or the claiming replica died)
    /// and are now late: the policy decides which of them the reconciler
    /// still publishes; the others become `dead` and are recorded in
    /// `skipped_fires`. Without this a ten-minute broker outage would
    /// publish six hundred fires of a one-second `fire_once` schedule at
    /// once.
    ///
    /// One pass reads every late claim, a page at a time, with a cursor:
    /// each page starts strictly after the last row decided, so a pass ends
    /// however many late claims there are (an hourly burst of thousands of
    /// schedules while the broker is down), and claims the policies keep do
    /// not make it read the same page again. A schedule is decided on the
    /// page holding its newest late claims, all of them when they fit; a
    /// schedule cut by the end of a page starts the next one instead. A
    /// schedule with more late claims than a page is decided on its newest
    /// page's worth, and its older claims on the following pages are skipped
    /// (no policy keeps more than the newest `max` ≤ a page). Returns how
    /// many were skipped.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached (what
    /// earlier pages decided stands).
    pub async fn skip_late_claims_once(
        &self,
        now: DateTime<Utc>,
    ) -> Result<LateClaimPass, SchedulerError> {
        let grace = self.timing.confirm_grace;
        let page_size = self.timing.late_claim_page.max(1);
        let limit = i64::try_from(page_size).unwrap_or(i64::MAX);
        let mut pass = LateClaimPass::default();
        let mut cursor: Option<(String, DateTime<Utc>)> = None;
        // The schedule whose newest claims were decided on an earlier page:
        // its rows on later pages are older than anything a policy keeps.
        let mut decided: Option<String> = None;
        loop {
            let page = self
                .ledger
                .late_claims(
                    self.timing.misfire_threshold,
                    grace,
                    limit,
                    cursor.as_ref().map(|(name, at)| (name.as_str(), *at)),
                )
                .await?;
            pass.pages += 1;
            let full = page.len() >= page_size;
            let mut groups = by_schedule(page);
            if full && groups.len() > 1 {
                // The last schedule may continue past the page: it starts
                // the next page, with its newest claims.
                groups.pop();
            }
            // Progress is a condition of looping: the next page starts after
            // the last row kept here, which is after the current cursor.
            let next = groups
                .last()
                .and_then(|(name, runs)| runs.last().map(|r| (name.clone(), r.scheduled_at)));
            // One statement per policy (the reason names it), not per
            // schedule: a burst of thousands of schedules costs a few.
            let mut drops: Vec<(crate::MisfirePolicy, Vec<uuid::Uuid>)> = Vec::new();
            for (name, runs) in &groups {
                let (policy, drop) = if decided.as_deref() == Some(name.as_str()) {
                    (
                        Self::schedule_of(runs).0,
                        runs.iter().map(|r| r.id).collect(),
                    )
                } else {
                    self.late_drops(runs, now)
                };
                match drops.iter_mut().find(|(p, _)| *p == policy) {
                    Some((_, ids)) => ids.extend(drop),
                    None => drops.push((policy, drop)),
                }
            }
            for (policy, ids) in drops {
                if ids.is_empty() {
                    continue;
                }
                let reason = format!("skipped by misfire policy {policy:?}: claimed on time but not published before it was late");
                let n = self
                    .ledger
                    .skip_claimed(&ids, &reason, &self.instance, grace)
                    .await?;
                if n > 0 {
                    FireCounters::add(&self.counters.misfires_skipped, n);
                    tracing::warn!(
                        ?policy,
                        skipped = n,
                        "late unpublished fires skipped by the misfire policy"
                    );
                }
                pass.skipped += n;
            }
            match next {
                Some(next) if full => {
                    decided = Some(next.0.clone());
                    cursor = Some(next);
                }
                _ => return Ok(pass),
            }
        }
    }

    /// The misfire policy and jitter of the schedule `runs` belong to, from
    /// the definition stored with them (the default policy when it cannot be
    /// read).
    fn schedule_of(runs: &[LateClaim]) -> (crate::MisfirePolicy, chrono::Duration) {
        runs.first()
            .and_then(|r| r.spec.clone())
            .and_then(|s| serde_json::from_value::<ScheduleSpec>(s).ok())
            .and_then(|s| Schedule::from_spec(&s).ok())
            .map_or(
                (crate::MisfirePolicy::default(), chrono::Duration::zero()),
                |s| (s.misfire, s.jitter_offset),
            )
    }

    /// Which of one schedule's newest late claims its policy skips.
    fn late_drops(
        &self,
        runs: &[LateClaim],
        now: DateTime<Utc>,
    ) -> (crate::MisfirePolicy, Vec<uuid::Uuid>) {
        let (policy, jitter) = Self::schedule_of(runs);
        let due = DueInstants {
            latest: runs.iter().rev().map(|r| r.scheduled_at).collect(),
            total: u64::try_from(runs.len()).unwrap_or(u64::MAX),
        };
        // Lateness counts from when the fire should have reached the broker
        // at the latest: its wake-up plus the confirm grace. A publish
        // retried right after the grace is on time.
        let grace = chrono::Duration::from_std(self.timing.confirm_grace).unwrap_or_default();
        let reference = now - grace - jitter;
        let mut keep = policy
            .decide(&due, reference, self.timing.misfire_threshold)
            .fire;
        if policy == crate::MisfirePolicy::FireOnce {
            // fire_once fires a missed instant only when no later fire made
            // it: a later published fire supersedes them all.
            keep.retain(|at| !runs.iter().any(|r| r.scheduled_at == *at && r.superseded));
        }
        let drop = runs
            .iter()
            .filter(|r| !keep.contains(&r.scheduled_at))
            .map(|r| r.id)
            .collect();
        (policy, drop)
    }
}
