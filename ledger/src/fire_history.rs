//! What the ledger knows about a schedule's past fires: the latest one (for
//! misfire recovery after downtime) and the decisions of overlap policies
//! (fires skipped or buffered because the previous run was still going; see
//! `crate::overlap`).

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::runs::NewRun;
use crate::{Ledger, LedgerError, OverlapRule};

/// A claimed run that never reached the broker and is now late.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LateClaim {
    /// The run.
    pub id: uuid::Uuid,
    /// Its schedule.
    pub job_name: String,
    /// Its fire instant.
    pub scheduled_at: DateTime<Utc>,
    /// Whether a later fire of the schedule reached the broker.
    pub superseded: bool,
    /// The schedule's stored definition.
    pub spec: Option<serde_json::Value>,
}

/// The result of a claim that must not overlap the previous run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExclusiveClaim {
    /// The run was inserted.
    Won,
    /// The run key was already claimed, or already recorded as skipped.
    Taken,
    /// A previous run of the schedule is unfinished: the fire was recorded
    /// as skipped.
    Overlapped,
    /// A previous run of the schedule is unfinished: the run was inserted
    /// `buffered`, to start when it has ended.
    Buffered,
    /// The schedule's `remaining_runs` counter is at zero: the fire was
    /// not claimed (recorded as skipped).
    RanOut,
}

/// SQL that is true when the run aliased `alias` is a fire of its schedule's
/// timetable (claimed by a replica's timer or misfire recovery), and false
/// for ad-hoc jobs (`claimed_by` `client:...`), manual triggers
/// (`manual:...`), backfills (`backfill:...`), follow-ups (`follow-up:...`)
/// and hand-published messages
/// (no `claimed_by`). Misfire policies, late-claim decisions and retention's
/// "newest fire" only look at these.
pub(crate) fn live_fire(alias: &str) -> String {
    format!(
        "({alias}.claimed_by NOT LIKE 'client:%' AND {alias}.claimed_by NOT LIKE 'manual:%' \
          AND {alias}.claimed_by NOT LIKE 'backfill:%' \
          AND {alias}.claimed_by NOT LIKE 'follow-up:%')"
    )
}

/// [`live_fire`] for a run about to be claimed by `claimed_by`.
pub(crate) fn is_live_claimer(claimed_by: &str) -> bool {
    !["client:", "manual:", "backfill:", "follow-up:"]
        .iter()
        .any(|p| claimed_by.starts_with(p))
}

/// The `SELECT` of [`Ledger::late_claims`], the same on both backends (SQLite
/// reads the `$n` placeholders as Postgres does) but for `late`, the
/// dialect's condition that the claimed run `r` is late: claimed more than
/// `$2` ago and due more than `$1` ago. `$3` is the page's size, `$4` and
/// `$5` the `(job_name, scheduled_at)` it starts after.
pub(crate) fn late_claims_sql(late: &str) -> String {
    format!(
        "SELECT r.id, r.job_name, r.scheduled_at, s.spec, \
             EXISTS (SELECT 1 FROM job_runs n WHERE n.job_name = r.job_name \
                     AND n.scheduled_at > r.scheduled_at AND n.status NOT IN ('claimed', 'buffered') \
                     AND {}) AS superseded \
         FROM job_runs r JOIN schedules s ON s.name = r.job_name \
         WHERE r.status = 'claimed' AND {} AND {late} \
           AND (CAST($4 AS TEXT) IS NULL OR r.job_name > $4 \
                OR (r.job_name = $4 AND r.scheduled_at < $5)) \
         ORDER BY r.job_name, r.scheduled_at DESC LIMIT $3",
        live_fire("n"),
        live_fire("r")
    )
}

impl Ledger {
    /// The latest `scheduled_at` of each of `job_names` that has live fires
    /// (see [`live_fire`]: ad-hoc runs, manual triggers and backfills are not
    /// fires of the timetable).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn last_fires(
        &self,
        job_names: &[String],
    ) -> Result<HashMap<String, DateTime<Utc>>, LedgerError> {
        self.store.last_fires(job_names).await
    }

    /// Claims `run` unless an earlier run of the same schedule is
    /// unfinished, in which case the fire is recorded in `skipped_fires`.
    ///
    /// The decision is made under a transaction-scoped advisory lock on the
    /// schedule name, so replicas racing for the fire agree: exactly one of
    /// them inserts the run or records the skip, never both.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn claim_exclusive(&self, run: &NewRun) -> Result<ExclusiveClaim, LedgerError> {
        self.claim_exclusive_with(run, Some(OverlapRule::Skip), true)
            .await
    }

    /// Claims `run` under the overlap `rule` of its schedule (see
    /// `crate::overlap`; `None`: `allow_all`): inserted, inserted
    /// `buffered`, or skipped, after cancelling what the rule cancels; an
    /// overlapped fire is recorded in `skipped_fires` only with
    /// `record_skip` (a refused manual trigger is not a fire of the
    /// schedule and leaves nothing behind).
    ///
    /// A fire of the timetable (not a manual trigger, backfill or ad-hoc
    /// job) of a schedule with a `remaining_runs` counter counts it down in
    /// the same transaction as its winning claim, so only the winner
    /// counts; at zero the fire is not claimed ([`ExclusiveClaim::RanOut`]),
    /// and the claim that takes the last run pauses the schedule with a
    /// note saying why.
    ///
    /// # Errors
    ///
    /// As [`Ledger::claim_exclusive`].
    pub async fn claim_exclusive_with(
        &self,
        run: &NewRun,
        rule: Option<OverlapRule>,
        record_skip: bool,
    ) -> Result<ExclusiveClaim, LedgerError> {
        self.store
            .claim_exclusive_with(run, rule, record_skip)
            .await
    }

    /// Scheduled runs still `claimed` (never confirmed by the broker),
    /// claimed more than `grace` ago (database time) and due more than
    /// `older_than` ago: `(id, job_name, scheduled_at, superseded, spec)`,
    /// where `superseded` says a later fire of the schedule did reach the
    /// broker. The misfire policy decides which of them are still published.
    ///
    /// One page of at most `limit` rows, by schedule name and then newest
    /// instant first (so the first rows of a schedule are the ones a policy
    /// may keep), strictly after `after` (`(job_name, scheduled_at)` of the
    /// last row of the previous page) in that order.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn late_claims(
        &self,
        older_than: std::time::Duration,
        grace: std::time::Duration,
        limit: i64,
        after: Option<(&str, DateTime<Utc>)>,
    ) -> Result<Vec<LateClaim>, LedgerError> {
        self.store
            .late_claims(older_than, grace, limit, after)
            .await
    }

    /// Gives up claimed runs that their schedule's misfire policy skips:
    /// they become `dead` with `reason` and are recorded in `skipped_fires`
    /// (by `by`). Only rows still `claimed`, not being published right now
    /// (their `next_dispatch_at` has passed, so no reconciler holds them)
    /// and claimed more than `grace` ago change. Returns how many did.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn skip_claimed(
        &self,
        ids: &[uuid::Uuid],
        reason: &str,
        by: &str,
        grace: std::time::Duration,
    ) -> Result<u64, LedgerError> {
        self.store.skip_claimed(ids, reason, by, grace).await
    }

    /// Which of `keys` (job name, run key) are recorded, as a run or as a
    /// skipped fire: the run keys found.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn recorded_keys(
        &self,
        keys: &[(String, String)],
    ) -> Result<std::collections::HashSet<String>, LedgerError> {
        self.store.recorded_keys(keys).await
    }

    /// Finds runs that stopped moving: `dispatched` or `retrying` with no
    /// change for `after`, or `running` with an expired lease and no change
    /// for `after` (their worker died and no redelivery took them up: no
    /// worker alive for the type, the queue deleted). Each is reported once:
    /// its `last_error` becomes a `stuck: ...` reason (the status stays, so a
    /// late worker can still finish it). Returns `(run_key, status, reason)`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn mark_stuck(
        &self,
        after: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<(String, String, String)>, LedgerError> {
        self.store.mark_stuck(after, limit).await
    }

    /// The fires of `job_name` skipped for overlap, newest first.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn skipped_fires(
        &self,
        job_name: &str,
        limit: i64,
    ) -> Result<Vec<(String, String)>, LedgerError> {
        self.store.skipped_fires(job_name, limit).await
    }
}
