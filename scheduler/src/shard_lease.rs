//! A replica's part in sharing the fires (`BELFRY_SHARDING`, on by
//! default with a Postgres ledger): the [`ShardKeeper`] holds this
//! replica's shard leases and tells its schedule follower which shards it
//! owns, so its timer holds only their schedules.
//!
//! Every `lease_ttl / 5` the keeper runs a lease pass
//! ([`belfry_ledger::Ledger::shard_pass`]): heartbeat, renewal, and taking
//! free, expired or excess shards up to an even share. It publishes the
//! owned set on a watch channel; [`crate::ScheduleSync`] loads the
//! schedules of newly owned shards (and drops those of lost ones), and the
//! replica runs misfire recovery for the schedules it takes, so instants a
//! previous owner did not make are made under their policy.
//!
//! What keeps "no fire lost, none twice" when leases misbehave:
//!
//! - the claim path is unchanged: an owner still takes the Redis lock and
//!   the unique insert, so two replicas that both believe they own a shard
//!   (a steal not yet seen by the old owner, a paused process that wakes)
//!   still make one run per instant;
//! - a lease is renewed only while the replica's timer loop moves
//!   ([`crate::timer_progress`]): a replica alive but stuck loses its
//!   shards like a dead one;
//! - a replica whose clock guard refuses claims (its clock is off) frees
//!   its shards at once rather than hold fires it will not make;
//! - a replica whose schedule follower has not loaded the shards it owns
//!   for longer than the stall bound (its loads keep failing, or the task
//!   is gone) stops renewing too: owning a shard whose schedules are not in
//!   the timer would fire nothing. A load in progress is progress, up to
//!   [`ShardKeeper::load_bound`] (the follower gives a read up after as
//!   long): reading a third of a million schedules from a database busy
//!   with a burst takes longer than the stall bound, and a replica that
//!   let its shards go for that would hand the same load to the next one;
//! - every pass and the leave are bounded in time, on this side and in
//!   the database, so a hung connection neither holds a lease nor blocks
//!   shutdown, and a pass given up on does not go on queueing for the pass
//!   lock ahead of the next ones;
//! - a busy replica is not a dead one: a replica started with
//!   [`crate::Replica::sharded_apart`] (as the binary is) runs this keeper
//!   on a thread and runtime of its own ([`crate::keeper_runtime`]), so
//!   the tasks of a burst on the replica's runtime do not delay a renewal;
//! - a slow database is not a dead replica: the lease a pass writes lasts
//!   [`SLOW_PASS_FACTOR`] times the slowest recent pass when that is longer
//!   than the configured lifetime (up to [`MAX_LEASE_STRETCH`] times it;
//!   see [`crate::pace`]). Renewals keep their pace, so a live owner
//!   whose passes take seconds on a saturated database still renews in
//!   time, rather than every replica's leases lapsing in turn and the
//!   shards churning between replicas that are all just as slow. The cost
//!   is failover time while the database is slow: a dead owner's shards
//!   are taken within the stretched lifetime;
//! - a replica keeps firing the shards it believes it owns while it cannot
//!   reach the database (nothing can be claimed then anyway, and it fires
//!   them the moment the database is back, before its next pass says
//!   otherwise);
//! - every shard taken is recovered from the ledger's record of its
//!   schedules' last fires, whoever held it before.
//!
//! At shutdown the keeper frees its shards at once (before in-flight fires
//! finish), so the others take them at their next pass instead of after
//! the lease expires.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use belfry_ledger::{Ledger, LedgerError, ShardPass};
use belfry_runtime::SharedClock;

use crate::clock_guard::ClockGuard;
use crate::pace::Pace;
use crate::timer_progress::TimerProgress;

/// Default shard count (`BELFRY_SHARDS`).
pub const DEFAULT_SHARDS: u32 = 256;
/// Default lease lifetime (`BELFRY_SHARD_LEASE_TTL`): a dead replica's
/// shards are taken within this plus one pass interval — inside the
/// default misfire threshold (10 s), so its fires are late, not skipped.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);
/// How many times the slowest recent lease pass a lease lasts at least:
/// the next renewal comes a pass and a renewal interval later, and may be
/// as slow again.
pub const SLOW_PASS_FACTOR: u32 = 4;
/// A lease never lasts more than this many times the configured lifetime.
pub const MAX_LEASE_STRETCH: u32 = 4;
/// Default bound on a busy timer loop before its leases are let go.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(15);

/// How a replica takes part in sharing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSettings {
    /// Shards the schedules are split into (the same on every replica).
    pub shards: u32,
    /// How long a lease lasts unless renewed.
    pub lease_ttl: Duration,
    /// A timer loop busy longer than this stops renewing.
    pub stall_after: Duration,
}

impl Default for ShardSettings {
    fn default() -> Self {
        Self {
            shards: DEFAULT_SHARDS,
            lease_ttl: DEFAULT_LEASE_TTL,
            stall_after: DEFAULT_STALL_AFTER,
        }
    }
}

impl ShardSettings {
    /// How often leases are renewed: five times per lifetime, so four
    /// passes in a row can fail before a lease lapses.
    pub fn renew_every(&self) -> Duration {
        (self.lease_ttl / 5).max(Duration::from_millis(50))
    }
}

/// The shards a replica owns, out of how many.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnedShards {
    /// The shard count.
    pub shards: u32,
    /// The shards owned.
    pub owned: BTreeSet<u32>,
}

impl OwnedShards {
    /// Whether the schedule `name` is in an owned shard.
    pub fn has(&self, name: &str) -> bool {
        self.owned
            .contains(&belfry_protocol::shard_of(name, self.shards))
    }
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassOutcome {
    /// The leases were renewed and shares settled.
    Settled(ShardPass),
    /// The timer loop is stuck: nothing was renewed.
    Stalled(Duration),
    /// The clock guard refuses claims: this replica freed its shards.
    ClockSkewed,
    /// The schedule follower has not loaded the owned shards for this
    /// long: nothing was renewed.
    FollowerBehind(Duration),
}

/// What the schedule follower has loaded, against what was published.
#[derive(Debug, Default)]
struct Followed {
    /// Whether a follower reports at all (a keeper without one, as in a
    /// benchmark that hands its timer the owned schedules itself, is never
    /// judged by it).
    reporting: bool,
    /// The owned set whose schedules are loaded.
    loaded: BTreeSet<u32>,
    /// Since when a load of taken shards has been running, if one is.
    loading_since: Option<std::time::Instant>,
    /// Since when the published set and the loaded one differ with no
    /// load running.
    behind_since: Option<std::time::Instant>,
}

/// Holds one replica's shard leases.
#[derive(Debug)]
pub struct ShardKeeper {
    ledger: Ledger,
    instance: String,
    settings: ShardSettings,
    owned: watch::Sender<Arc<OwnedShards>>,
    progress: Arc<TimerProgress>,
    clock: SharedClock,
    guard: Option<Arc<ClockGuard>>,
    followed: std::sync::Mutex<Followed>,
    /// How long recent passes took (a pass given up on counts as long as
    /// it was given).
    passes: Pace,
}

/// The longest a leave may take before the leases are left to expire.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

impl ShardKeeper {
    /// A keeper for replica `instance`, judging its timer loop by
    /// `progress` read at `clock`'s time. It owns nothing until its first
    /// pass.
    pub fn new(
        ledger: Ledger,
        instance: &str,
        settings: ShardSettings,
        progress: Arc<TimerProgress>,
        clock: SharedClock,
    ) -> Self {
        let (owned, _) = watch::channel(Arc::new(OwnedShards {
            shards: settings.shards,
            owned: BTreeSet::new(),
        }));
        Self {
            ledger,
            instance: instance.to_owned(),
            settings,
            owned,
            progress,
            clock,
            guard: None,
            followed: std::sync::Mutex::default(),
            passes: Pace::default(),
        }
    }

    /// The schedule follower has loaded the schedules of `loaded` (see
    /// [`crate::ScheduleSync::with_shards`]).
    pub fn report_loaded(&self, loaded: &OwnedShards) {
        let mut followed = self.followed.lock().unwrap_or_else(|p| p.into_inner());
        followed.reporting = true;
        followed.loaded = loaded.owned.clone();
        followed.loading_since = None;
        // A load that went through is progress, whatever was taken since.
        followed.behind_since = None;
    }

    /// The schedule follower started reading the schedules of shards it
    /// took: until it reports them loaded (or the read failed), or for at
    /// most [`ShardKeeper::load_bound`], it is not behind.
    pub fn report_loading(&self) {
        let mut followed = self.followed.lock().unwrap_or_else(|p| p.into_inner());
        followed.loading_since = Some(std::time::Instant::now());
    }

    /// The follower's read of taken shards failed: it is behind from here
    /// (or from when it was last seen behind with no read running).
    pub fn report_load_failed(&self) {
        let mut followed = self.followed.lock().unwrap_or_else(|p| p.into_inner());
        followed.loading_since = None;
    }

    /// The longest a load of taken shards counts as progress (and the
    /// follower's bound on one read): [`MAX_STRETCH`] times the stall bound,
    /// as the timer loop's bound stretches at most that far.
    ///
    /// [`MAX_STRETCH`]: crate::timer_progress::MAX_STRETCH
    pub fn load_bound(&self) -> Duration {
        self.settings
            .stall_after
            .saturating_mul(crate::timer_progress::MAX_STRETCH)
    }

    /// How long the follower has been behind the published set, if it
    /// reports and is.
    fn follower_behind(&self) -> Option<Duration> {
        let owned = self.owned();
        let mut followed = self.followed.lock().unwrap_or_else(|p| p.into_inner());
        if !followed.reporting || followed.loaded == owned.owned {
            followed.behind_since = None;
            return None;
        }
        if followed
            .loading_since
            .is_some_and(|since| since.elapsed() < self.load_bound())
        {
            // Loading is catching up. The clock of a follower seen behind
            // before is kept: loads that keep failing add up.
            return None;
        }
        let since = *followed
            .behind_since
            .get_or_insert_with(std::time::Instant::now);
        Some(since.elapsed())
    }

    /// The same keeper, freeing its shards while `guard` refuses claims.
    pub fn with_clock_guard(self, guard: Arc<ClockGuard>) -> Self {
        Self {
            guard: Some(guard),
            ..self
        }
    }

    /// How long the lease the next pass writes lasts: the configured
    /// lifetime, stretched to the pace of recent passes (see the module
    /// header). The pass is given as long, here and in the database.
    pub fn lease_ttl(&self) -> Duration {
        self.passes
            .stretch(self.settings.lease_ttl, SLOW_PASS_FACTOR, MAX_LEASE_STRETCH)
    }

    /// The owned shards as they change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<OwnedShards>> {
        self.owned.subscribe()
    }

    /// The shards owned now.
    pub fn owned(&self) -> Arc<OwnedShards> {
        self.owned.borrow().clone()
    }

    /// The settings.
    pub fn settings(&self) -> &ShardSettings {
        &self.settings
    }

    /// One lease pass, unless the timer loop is stalled (then nothing is
    /// renewed and the leases run out). Publishes the owned set when it
    /// changed.
    ///
    /// # Errors
    ///
    /// [`LedgerError::ShardCount`] when the live replicas use another
    /// shard count (this replica then owns nothing);
    /// [`LedgerError::Query`] when the database cannot be reached (the
    /// owned set is kept).
    pub async fn pass_once(&self) -> Result<PassOutcome, LedgerError> {
        if let Some(busy) = self
            .progress
            .stalled(self.clock.now(), self.settings.stall_after)
        {
            tracing::error!(
                busy_ms = busy.as_millis() as u64,
                "timer loop stuck; not renewing shard leases, so other replicas take its shards"
            );
            return Ok(PassOutcome::Stalled(busy));
        }
        if let Some(behind) = self
            .follower_behind()
            .filter(|b| *b > self.settings.stall_after)
        {
            tracing::error!(behind_ms = behind.as_millis() as u64,
                "the schedules of owned shards are not loaded; not renewing shard leases, so other replicas take them");
            return Ok(PassOutcome::FollowerBehind(behind));
        }
        if self.guard.as_ref().is_some_and(|g| !g.allows_claims()) {
            // Its fires would only be remembered as missed: better made
            // by another replica now. It joins again once the clock agrees.
            if !self.owned().owned.is_empty() {
                tracing::warn!("clock skewed: freeing this replica's shards for the others");
            }
            self.leave().await;
            return Ok(PassOutcome::ClockSkewed);
        }
        // Bounded by the lease's life: a pass that takes longer could only
        // renew leases already expired.
        let ttl = self.lease_ttl();
        let started = std::time::Instant::now();
        let pass = tokio::time::timeout(
            ttl,
            self.ledger
                .shard_pass(&self.instance, self.settings.shards, ttl),
        )
        .await
        .unwrap_or(Err(LedgerError::TimedOut {
            what: "a shard lease pass",
            after: ttl,
        }));
        self.passes.record(started.elapsed());
        let pass = match pass {
            Ok(pass) => pass,
            Err(e @ LedgerError::ShardCount { .. }) => {
                self.publish(BTreeSet::new());
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if !pass.taken.is_empty() {
            tracing::info!(
                taken = pass.taken.len(),
                owned = pass.owned.len(),
                live = pass.live,
                "took shards; recovering their schedules' missed fires"
            );
        }
        self.publish(pass.owned.iter().copied().collect());
        Ok(PassOutcome::Settled(pass))
    }

    fn publish(&self, owned: BTreeSet<u32>) {
        let shards = self.settings.shards;
        self.owned.send_if_modified(|current| {
            if current.owned == owned {
                return false;
            }
            let lost = current.owned.difference(&owned).count();
            if lost > 0 {
                tracing::info!(lost, owned = owned.len(), "shards moved to other replicas");
            }
            *current = Arc::new(OwnedShards { shards, owned });
            true
        });
    }

    /// Passes every [`ShardSettings::renew_every`] until `cancel`, then
    /// frees this replica's shards for the others.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            if let Err(e) = self.pass_once().await {
                tracing::warn!(error = %e, "shard lease pass failed; retrying");
            }
            // Either wakes the loop; a cancel between passes ends it.
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(self.settings.renew_every()) => {}
            }
        }
        self.leave().await;
    }

    /// Frees this replica's shards and stops firing them (graceful leave).
    pub async fn leave(&self) {
        // Owned nothing from here on: a fire still in flight finishes, no
        // new one of these shards starts.
        self.publish(BTreeSet::new());
        let left = tokio::time::timeout(LEAVE_TIMEOUT, self.ledger.leave_shards(&self.instance))
            .await
            .unwrap_or(Err(LedgerError::TimedOut {
                what: "freeing this replica's shards",
                after: LEAVE_TIMEOUT,
            }));
        match left {
            Ok(0) => {}
            Ok(freed) => tracing::info!(freed, "shards freed for the other replicas"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot free shards; they pass on when their leases expire")
            }
        }
    }
}
