//! The storage seam: what the ledger asks of a database, as traits that
//! the Postgres backend (`postgres/`) and the embedded SQLite backend
//! (`sqlite/`) both implement, with the same arguments and the same return
//! types.
//!
//! [`crate::Ledger`] holds one `Arc<dyn Store>`, chosen once when it
//! connects; its public methods keep what is common to both backends
//! (making free text storable, telling an id conflict from an outage,
//! the order of [`crate::Ledger::begin_attempt`]'s steps) and hand the
//! SQL to the store. The traits follow the files of each backend (one
//! `impl` per file): runs and attempts, fire history, the outbox,
//! schedules, and the read-mostly views (dashboard, run lists,
//! retention, skipped ranges). They are private to the crate: callers
//! see [`crate::Ledger`] only.
//!
//! Each method means what the `Ledger` method it links to documents; the
//! per-backend notes (what SQLite does instead of advisory locks or
//! `FOR UPDATE SKIP LOCKED`, and why it is safe) are in `sqlite/`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use belfry_protocol::JobMessage;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::alerts::{
    AlertEvent, AlertRoute, DeliveryRecord, DeliveryResult, DueDelivery, NewAlertEvent,
};
use crate::attempt_batch::{BeginRequest, EndRequest, LeaseRenewal};
use crate::cancel::{CancelOutcome, CancelRequest};
use crate::change_listener::ChangeListener;
use crate::dashboard::{MinuteCount, Overview, RecentFire};
use crate::fire_history::{ExclusiveClaim, LateClaim};
use crate::follow_up::FollowUpPass;
use crate::missed_fire::MissedFire;
use crate::postgres::PgStore;
use crate::retention::PruneBatch;
use crate::run_limits::RunLimits;
use crate::run_log::{LogCursor, RunLogLine};
use crate::run_partitions::{PartitionDrop, RunPartition};
use crate::run_query::RunPage;
use crate::run_rows::{FromMessage, RunLookup};
use crate::runs::{AttemptStart, NewRun, RunRecord, RunState};
use crate::schedules::{IfStored, ScheduleLookup, ScheduleRow};
use crate::shards::{ShardLease, ShardPass};
use crate::skipped_range::SkippedRange;
use crate::sqlite::SqliteLedger;
use crate::{LedgerError, OverlapRule};

/// One database behind the ledger: every trait of the seam.
pub(crate) trait Store:
    Lifecycle
    + RunStore
    + FireHistoryStore
    + OutboxStore
    + ScheduleStore
    + ViewStore
    + AlertStore
    + ShardStore
    + LimitStore
    + RunPartitionStore
    + FollowUpStore
    + RunLogStore
    + std::fmt::Debug
    + Send
    + Sync
{
}

impl Store for PgStore {}

impl Store for SqliteLedger {}

/// This process's clock, as [`crate::Ledger::clock_probe`] reads it.
pub(crate) type LocalClock<'a> = dyn Fn() -> DateTime<Utc> + Send + Sync + 'a;

/// `(before, database, after)`: the database's clock, read between two
/// readings of this process's.
pub(crate) type ClockReading = (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>);

/// The database as a whole: schema, health, clock, change feed, shutdown.
#[async_trait]
pub(crate) trait Lifecycle {
    /// [`crate::Ledger::migrate`].
    async fn migrate(&self) -> Result<(), LedgerError>;

    /// [`crate::Ledger::ping`].
    async fn ping(&self) -> bool;

    /// [`crate::Ledger::clock_probe`].
    async fn clock_probe(&self, local: &LocalClock<'_>) -> Result<ClockReading, LedgerError>;

    /// [`crate::Ledger::listen_schedules`].
    async fn listen_schedules(&self, channel: &str) -> Result<ChangeListener, LedgerError>;

    /// [`crate::Ledger::listen_cancels`].
    async fn listen_cancels(&self) -> Result<ChangeListener, LedgerError>;

    /// [`crate::Ledger::close`].
    async fn close(&self);

    /// The Postgres pool, for callers with queries of their own.
    fn pg_pool(&self) -> Option<&PgPool>;

    /// The embedded database, for its job queue.
    fn embedded(&self) -> Option<&SqliteLedger>;
}

#[async_trait]
/// Runs: claims, dispatch, attempts and their leases, lookups.
pub(crate) trait RunStore {
    /// [`crate::Ledger::mark_dispatched`].
    async fn mark_dispatched(&self, id: Uuid) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::mark_dead`].
    async fn mark_dead(&self, id: Uuid, reason: &str) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::hand_back`].
    async fn hand_back(&self, id: Uuid, attempt: i32, reason: &str) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::run`], [`crate::Ledger::run_by_key`] and
    /// [`crate::Ledger::runs_of`].
    async fn runs(&self, lookup: RunLookup<'_>) -> Result<Vec<RunRecord>, LedgerError>;

    /// [`crate::Ledger::claim_many`].
    async fn claim_many(&self, runs: &[NewRun]) -> Result<HashSet<Uuid>, LedgerError>;

    /// [`crate::Ledger::mark_dispatched_many`].
    async fn mark_dispatched_many(&self, ids: &[Uuid]) -> Result<u64, LedgerError>;

    /// [`crate::Ledger::begin_batch`] (a batch of one is how
    /// [`crate::Ledger::begin_attempt`] starts an attempt).
    async fn begin_batch(
        &self,
        batch: &[BeginRequest],
    ) -> Result<Vec<Option<(Uuid, i32)>>, LedgerError>;

    /// [`crate::Ledger::end_batch`] (a batch of one is
    /// [`crate::Ledger::end_attempt`]).
    async fn end_batch(&self, batch: &[EndRequest]) -> Result<Vec<bool>, LedgerError>;

    /// The state of the run `message` belongs to, with the database's
    /// `now`, for [`crate::Ledger::begin_attempt`]'s decision.
    async fn state_of(&self, message: &JobMessage) -> Result<Option<RunState>, LedgerError>;

    /// Inserts the row of a run known only from its message; the raw
    /// database error is kept so that [`crate::Ledger`] can tell an id
    /// conflict from an outage.
    async fn insert_from_message(&self, run: FromMessage<'_>) -> Result<u64, LedgerError>;

    /// [`crate::Ledger::renew_leases`].
    async fn renew_leases(
        &self,
        held: &[(Uuid, i32)],
        lease: Duration,
    ) -> Result<LeaseRenewal, LedgerError>;

    /// [`crate::Ledger::cancel_run`] (the reason already storable).
    async fn cancel_run(&self, request: &CancelRequest<'_>) -> Result<CancelOutcome, LedgerError>;

    /// Ends run `id` as `cancelled` if it is `running` under an expired
    /// lease with a cancel request (its worker died before acting on it);
    /// whether it moved.
    async fn finish_cancelled(&self, id: Uuid) -> Result<bool, LedgerError>;
}

#[async_trait]
/// What is known of a schedule's past fires: the latest, overlaps, late
/// claims, skips, stuck runs.
pub(crate) trait FireHistoryStore {
    /// [`crate::Ledger::last_fires`].
    async fn last_fires(
        &self,
        job_names: &[String],
    ) -> Result<HashMap<String, DateTime<Utc>>, LedgerError>;

    /// [`crate::Ledger::claim_exclusive_with`].
    async fn claim_exclusive_with(
        &self,
        run: &NewRun,
        rule: Option<OverlapRule>,
        record_skip: bool,
    ) -> Result<ExclusiveClaim, LedgerError>;

    /// [`crate::Ledger::release_buffered`].
    async fn release_buffered(&self, limit: i64) -> Result<Vec<RunRecord>, LedgerError>;

    /// [`crate::Ledger::late_claims`].
    async fn late_claims(
        &self,
        older_than: Duration,
        grace: Duration,
        limit: i64,
        after: Option<(&str, DateTime<Utc>)>,
    ) -> Result<Vec<LateClaim>, LedgerError>;

    /// [`crate::Ledger::skip_claimed`].
    async fn skip_claimed(
        &self,
        ids: &[Uuid],
        reason: &str,
        by: &str,
        grace: Duration,
    ) -> Result<u64, LedgerError>;

    /// [`crate::Ledger::record_missed_fires`].
    async fn record_missed_fires(&self, fires: &[MissedFire], by: &str) -> Result<(), LedgerError>;

    /// [`crate::Ledger::undecided_missed_fires`].
    async fn undecided_missed_fires(
        &self,
        job_names: &[String],
        limit: i64,
    ) -> Result<Vec<MissedFire>, LedgerError>;

    /// [`crate::Ledger::forget_missed_fires`].
    async fn forget_missed_fires(&self, fires: &[MissedFire]) -> Result<u64, LedgerError>;

    /// [`crate::Ledger::recorded_keys`].
    async fn recorded_keys(
        &self,
        keys: &[(String, String)],
    ) -> Result<HashSet<String>, LedgerError>;

    /// [`crate::Ledger::mark_stuck`].
    async fn mark_stuck(
        &self,
        after: Duration,
        limit: i64,
    ) -> Result<Vec<(String, String, String)>, LedgerError>;

    /// [`crate::Ledger::skipped_fires`].
    async fn skipped_fires(
        &self,
        job_name: &str,
        limit: i64,
    ) -> Result<Vec<(String, String)>, LedgerError>;
}

#[async_trait]
/// The outbox: claimed runs due to be published (again).
pub(crate) trait OutboxStore {
    /// [`crate::Ledger::take_due`].
    async fn take_due(&self, limit: i64, lease: Duration) -> Result<Vec<RunRecord>, LedgerError>;

    /// [`crate::Ledger::mark_republished`].
    async fn mark_republished(&self, id: Uuid, lease: DateTime<Utc>) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::postpone_dispatch`].
    async fn postpone_dispatch(
        &self,
        id: Uuid,
        lease: DateTime<Utc>,
        at: DateTime<Utc>,
    ) -> Result<bool, LedgerError>;
}

#[async_trait]
/// The `schedules` table.
pub(crate) trait ScheduleStore {
    /// [`crate::Ledger::upsert_schedule`] and
    /// [`crate::Ledger::insert_schedule`]: inserts `row`, `if_stored`
    /// deciding what happens to a schedule of the same name; rows written.
    async fn write_schedule(
        &self,
        row: &ScheduleRow,
        if_stored: IfStored,
    ) -> Result<u64, LedgerError>;

    /// [`crate::Ledger::replace_schedule`].
    async fn replace_schedule(
        &self,
        row: &ScheduleRow,
        paused: Option<bool>,
    ) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::delete_schedule`].
    async fn delete_schedule(&self, name: &str) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::schedules`], [`crate::Ledger::schedules_page`] and
    /// [`crate::Ledger::schedule`].
    async fn schedules(&self, lookup: ScheduleLookup<'_>) -> Result<Vec<ScheduleRow>, LedgerError>;

    /// [`crate::Ledger::schedules_in_shards`] (`shards` at least 1,
    /// `wanted` not empty).
    async fn schedules_in_shards(
        &self,
        shards: u32,
        wanted: &[u32],
    ) -> Result<Vec<ScheduleRow>, LedgerError>;

    /// [`crate::Ledger::schedule_versions`].
    async fn schedule_versions(&self) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError>;

    /// [`crate::Ledger::schedule_versions_in_shards`] (`shards` at least 1,
    /// `wanted` not empty).
    async fn schedule_versions_in_shards(
        &self,
        shards: u32,
        wanted: &[u32],
    ) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError>;

    /// [`crate::Ledger::set_paused`].
    async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        note: Option<&str>,
    ) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::delete_schedules_except`].
    async fn delete_schedules_except(&self, keep: &[String]) -> Result<Vec<String>, LedgerError>;
}

#[async_trait]
/// Read-mostly views (dashboard, run lists) and retention.
pub(crate) trait ViewStore {
    /// [`crate::Ledger::runs_per_minute`].
    async fn runs_per_minute(&self, since: DateTime<Utc>) -> Result<Vec<MinuteCount>, LedgerError>;

    /// [`crate::Ledger::overview`].
    /// `(status, count)` of every status that has runs.
    async fn count_by_status(&self) -> Result<Vec<(String, i64)>, LedgerError>;

    /// [`crate::Ledger::overview`].
    async fn overview(&self, seen_since: DateTime<Utc>) -> Result<Overview, LedgerError>;

    /// [`crate::Ledger::recent_fires`].
    async fn recent_fires(
        &self,
        names: &[String],
        per: i64,
    ) -> Result<Vec<RecentFire>, LedgerError>;

    /// [`crate::Ledger::list_runs`].
    async fn list_runs(&self, page: RunPage<'_>) -> Result<Vec<RunRecord>, LedgerError>;

    /// [`crate::Ledger::prune_finished_runs`],
    /// [`crate::Ledger::prune_skipped_fires`] and
    /// [`crate::Ledger::prune_skipped_ranges`].
    async fn prune(&self, batch: PruneBatch) -> Result<u64, LedgerError>;

    /// [`crate::Ledger::record_skipped_ranges`].
    async fn record_skipped_ranges(&self, ranges: &[SkippedRange]) -> Result<(), LedgerError>;
}

#[async_trait]
/// Alert events and their deliveries (`crate::alerts`).
pub(crate) trait AlertStore {
    /// [`crate::Ledger::record_alert`] (the detail already storable).
    async fn record_alert(&self, event: &NewAlertEvent) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::unrouted_alerts`].
    async fn unrouted_alerts(&self, limit: i64) -> Result<Vec<AlertEvent>, LedgerError>;

    /// [`crate::Ledger::route_alert`], `routes` sorted by channel, unique,
    /// their windows already zero for unthrottled kinds.
    async fn route_alert(
        &self,
        event: Uuid,
        subject: &str,
        routes: &[AlertRoute],
    ) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::take_alert_deliveries`].
    async fn take_alert_deliveries(
        &self,
        owner: &str,
        channels: &[String],
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<DueDelivery>, LedgerError>;

    /// [`crate::Ledger::finish_alert_delivery`] (errors already storable).
    async fn finish_alert_delivery(
        &self,
        id: Uuid,
        owner: &str,
        attempt: i32,
        result: &DeliveryResult,
    ) -> Result<bool, LedgerError>;

    /// [`crate::Ledger::alert_deliveries`].
    async fn alert_deliveries(
        &self,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>, LedgerError>;

    /// [`crate::Ledger::alert_events`].
    async fn alert_events(&self, limit: i64) -> Result<Vec<AlertEvent>, LedgerError>;

    /// [`crate::Ledger::schedule_deadlines`].
    async fn schedule_deadlines(&self) -> Result<Vec<(String, String)>, LedgerError>;

    /// [`crate::Ledger::record_late_runs`] (never empty).
    async fn record_late_runs(&self, deadlines: &[(String, Duration)]) -> Result<u64, LedgerError>;

    /// [`crate::Ledger::prune_alerts`].
    async fn prune_alerts(&self, before: DateTime<Utc>, limit: i64) -> Result<u64, LedgerError>;
}

/// Cluster-wide concurrency limits (`crate::concurrency`).
#[async_trait]
pub(crate) trait LimitStore {
    /// Starts the run of `request` if it is startable and `limits` allow
    /// it (a free slot, a free start in the window); puts it back to wait
    /// (no attempt used) if not; `None` when the run is not startable
    /// (missing, finished or held), for the caller's full path to say
    /// which.
    async fn begin_limited(
        &self,
        request: &BeginRequest,
        limits: &RunLimits,
    ) -> Result<Option<AttemptStart>, LedgerError>;

    /// Deletes up to `limit` logged starts older than `before` (left by
    /// keys no run has asked for since), and every turn older than it;
    /// how many starts.
    async fn prune_rate_limits(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, LedgerError>;
}

/// Follow-up jobs (`crate::follow_up`).
#[async_trait]
pub(crate) trait FollowUpStore {
    /// [`crate::Ledger::settle_follow_ups`].
    async fn settle_follow_ups(&self, limit: i64, by: &str) -> Result<FollowUpPass, LedgerError>;
}

/// Run logs and progress (`crate::run_log`).
#[async_trait]
pub(crate) trait RunLogStore {
    /// [`crate::Ledger::append_run_logs`].
    async fn append_run_logs(&self, lines: &[RunLogLine]) -> Result<u64, LedgerError>;
    /// [`crate::Ledger::run_logs`].
    async fn run_logs(
        &self,
        run_id: Uuid,
        after: LogCursor,
        limit: i64,
    ) -> Result<Vec<RunLogLine>, LedgerError>;
    /// [`crate::Ledger::run_log_extent`].
    async fn run_log_extent(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<crate::run_log::AttemptLogExtent>, LedgerError>;
    /// [`crate::Ledger::latest_progress`].
    async fn latest_progress(&self, run_id: Uuid) -> Result<Option<RunLogLine>, LedgerError>;
    /// [`crate::Ledger::prune_run_logs`].
    async fn prune_run_logs(
        &self,
        older_than: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, LedgerError>;
}

/// Shard leases (`crate::shards`); Postgres only.
#[async_trait]
pub(crate) trait ShardStore {
    /// [`crate::Ledger::shard_pass`].
    async fn shard_pass(
        &self,
        instance: &str,
        shards: u32,
        ttl: Duration,
    ) -> Result<ShardPass, LedgerError>;

    /// [`crate::Ledger::leave_shards`].
    async fn leave_shards(&self, instance: &str) -> Result<u64, LedgerError>;

    /// [`crate::Ledger::shard_leases`].
    async fn shard_leases(&self) -> Result<Vec<ShardLease>, LedgerError>;
}

/// Time partitions of `job_runs` (`crate::run_partitions`); Postgres only,
/// nothing to do on the embedded ledger.
#[async_trait]
pub(crate) trait RunPartitionStore {
    /// [`crate::Ledger::prepare_run_partitions`].
    async fn prepare_run_partitions(
        &self,
        days: &[chrono::NaiveDate],
    ) -> Result<Vec<String>, LedgerError>;

    /// [`crate::Ledger::drop_expired_run_partitions`].
    async fn drop_expired_run_partitions(
        &self,
        cutoff: DateTime<Utc>,
    ) -> Result<PartitionDrop, LedgerError>;

    /// [`crate::Ledger::run_partitions`].
    async fn run_partitions(&self) -> Result<Vec<RunPartition>, LedgerError>;
}
