//! Keeping every replica's timer in step with the `schedules` table.
//!
//! The table is the source of truth: the schedule file is synced into it at
//! start, and later the API writes to it. A trigger bumps `updated_at` and
//! sends `NOTIFY belfry_schedules, '<name>'` on every change, by belfry or
//! by hand (the embedded ledger announces its own writes in-process
//! instead); each replica listens and reloads the named schedule, so a
//! created, changed, paused or deleted schedule reaches every timer within
//! moments. Notifications are lost while a listener reconnects, so a full
//! comparison of `updated_at` runs every resync interval as well.
//!
//! A stored definition that no longer validates (edited by hand) is logged
//! with its error and not fired; the other schedules keep running.
//!
//! With sharding ([`ScheduleSync::with_shards`]) the follower keeps only the
//! schedules of the shards its replica owns: it loads a shard's schedules
//! when the replica takes it (one [`ScheduleChange::Taken`], so the replica
//! recovers their missed fires together), drops them when the shard moves
//! away, and ignores changes to schedules of other shards.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use belfry_ledger::{ChangeListener, Ledger, LedgerError, ScheduleRow};
use belfry_protocol::ScheduleSpec;

use crate::schedule::Schedule;
use crate::shard_lease::{OwnedShards, ShardKeeper};
use crate::zoned_cron::CronCache;

/// The notification channel the `schedules` trigger sends on.
pub const CHANNEL: &str = "belfry_schedules";

/// A change for a timer.
#[derive(Debug, Clone)]
pub enum ScheduleChange {
    /// Add or replace this schedule.
    Upsert(Arc<Schedule>),
    /// Stop firing the schedule of this name (deleted, paused or invalid,
    /// or its shard moved to another replica).
    Remove(String),
    /// The schedules of shards this replica just took: add them, and apply
    /// their misfire policies to what they missed.
    Taken(Vec<Arc<Schedule>>),
}

/// The owned shards a sharded follower keeps schedules for.
#[derive(Debug)]
struct ShardFollow {
    /// The keeper, told what is loaded (it stops renewing when the
    /// follower falls behind for long: see [`ShardKeeper::report_loaded`]).
    keeper: Arc<ShardKeeper>,
    /// The replica's owned shards as its keeper publishes them.
    owned: watch::Receiver<Arc<OwnedShards>>,
    /// The owned set whose schedules are loaded.
    loaded: Arc<OwnedShards>,
    /// The last load failed: try again shortly, not at the next resync.
    retry: bool,
}

/// How soon a failed shard load is tried again.
const SHARD_LOAD_RETRY: Duration = Duration::from_secs(1);

/// Follows the `schedules` table for one replica.
#[derive(Debug)]
pub struct ScheduleSync {
    ledger: Ledger,
    known: HashMap<String, DateTime<Utc>>,
    shards: Option<ShardFollow>,
}

impl ScheduleSync {
    /// A follower of `ledger`'s `schedules`.
    pub fn new(ledger: Ledger) -> Self {
        Self {
            ledger,
            known: HashMap::new(),
            shards: None,
        }
    }

    /// The same follower keeping only the schedules of the shards
    /// `keeper` holds (see the module docs).
    pub fn with_shards(self, keeper: Arc<ShardKeeper>) -> Self {
        let owned = keeper.subscribe();
        let loaded = Arc::new(OwnedShards {
            shards: owned.borrow().shards,
            owned: Default::default(),
        });
        keeper.report_loaded(&loaded);
        Self {
            shards: Some(ShardFollow {
                keeper,
                owned,
                loaded,
                retry: false,
            }),
            ..self
        }
    }

    /// Whether the schedule `name` is this follower's to keep.
    fn wants(&self, name: &str) -> bool {
        self.shards.as_ref().is_none_or(|f| f.loaded.has(name))
    }

    /// Every schedule that should fire (not paused, valid), remembering
    /// what was seen for later comparisons.
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when the table cannot be read.
    pub async fn load_all(&mut self) -> Result<Vec<Arc<Schedule>>, LedgerError> {
        let rows = match &mut self.shards {
            None => self.ledger.schedules().await?,
            Some(follow) => {
                let owned = follow.owned.borrow_and_update().clone();
                let wanted: Vec<u32> = owned.owned.iter().copied().collect();
                let rows = self
                    .ledger
                    .schedules_in_shards(owned.shards, &wanted)
                    .await?;
                follow.keeper.report_loaded(&owned);
                follow.loaded = owned;
                rows
            }
        };
        self.known.clear();
        let mut out = Vec::with_capacity(rows.len());
        // Shared within this load only: schedules on one expression share its
        // text; nothing is kept per schedule after the load.
        let mut cache = CronCache::default();
        for row in rows {
            if let Some(updated) = row.updated_at {
                self.known.insert(row.name.clone(), updated);
            }
            if let ScheduleChange::Upsert(s) = compile(row, &mut cache) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// The change for schedule `name`, read now.
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when the row cannot be read.
    pub async fn reload(&mut self, name: &str) -> Result<ScheduleChange, LedgerError> {
        match self.ledger.schedule(name).await? {
            Some(row) => {
                if let Some(updated) = row.updated_at {
                    self.known.insert(row.name.clone(), updated);
                }
                Ok(compile(row, &mut CronCache::default()))
            }
            None => {
                self.known.remove(name);
                Ok(ScheduleChange::Remove(name.to_owned()))
            }
        }
    }

    /// Every change since the last look, found by comparing `updated_at`.
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when the table cannot be read.
    pub async fn resync(&mut self) -> Result<Vec<ScheduleChange>, LedgerError> {
        // A sharded follower reads the versions of its loaded shards only:
        // the others' rows would be filtered out below anyway.
        let versions = match &self.shards {
            None => self.ledger.schedule_versions().await?,
            Some(follow) => {
                let wanted: Vec<u32> = follow.loaded.owned.iter().copied().collect();
                self.ledger
                    .schedule_versions_in_shards(follow.loaded.shards, &wanted)
                    .await?
            }
        };
        let mut changes = Vec::new();
        let mut present = std::collections::HashSet::with_capacity(versions.len());
        for (name, updated) in versions {
            if !self.wants(&name) {
                continue;
            }
            present.insert(name.clone());
            if self.known.get(&name) != Some(&updated) {
                changes.push(self.reload(&name).await?);
            }
        }
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.known.remove(&name);
            changes.push(ScheduleChange::Remove(name));
        }
        Ok(changes)
    }

    /// The changes a new owned set brings (sharded followers only): the
    /// schedules of lost shards removed, those of taken shards loaded as
    /// one [`ScheduleChange::Taken`]. Nothing when the set is unchanged.
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when the taken shards' schedules cannot be read
    /// (nothing changes; the next call tries again).
    pub async fn follow_shards(&mut self) -> Result<Vec<ScheduleChange>, LedgerError> {
        let Some(follow) = &mut self.shards else {
            return Ok(Vec::new());
        };
        let now = follow.owned.borrow_and_update().clone();
        if now.owned == follow.loaded.owned {
            return Ok(Vec::new());
        }
        let loaded = follow.loaded.clone();
        let added: Vec<u32> = now.owned.difference(&loaded.owned).copied().collect();
        // Read before anything changes, so a failed read leaves the
        // follower as it was (and it tries again shortly: the watch has
        // marked this set seen).
        follow.keeper.report_loading();
        // Bounded: a read that hangs (a dead connection) is a failed load,
        // tried again, and the keeper counts the follower behind.
        let bound = follow.keeper.load_bound();
        let read = tokio::time::timeout(bound, self.ledger.schedules_in_shards(now.shards, &added))
            .await
            .unwrap_or(Err(LedgerError::TimedOut {
                what: "reading the schedules of taken shards",
                after: bound,
            }));
        let rows = match read {
            Ok(rows) => rows,
            Err(e) => {
                follow.keeper.report_load_failed();
                follow.retry = true;
                return Err(e);
            }
        };
        let mut changes = Vec::new();
        let lost: Vec<String> = self
            .known
            .keys()
            .filter(|name| !now.has(name))
            .cloned()
            .collect();
        for name in lost {
            self.known.remove(&name);
            changes.push(ScheduleChange::Remove(name));
        }
        let mut cache = CronCache::default();
        let mut taken = Vec::new();
        for row in rows {
            if let Some(updated) = row.updated_at {
                self.known.insert(row.name.clone(), updated);
            }
            match compile(row, &mut cache) {
                ScheduleChange::Upsert(s) => taken.push(s),
                other => changes.push(other),
            }
        }
        if !taken.is_empty() {
            changes.push(ScheduleChange::Taken(taken));
        }
        if let Some(follow) = &mut self.shards {
            follow.keeper.report_loaded(&now);
            follow.loaded = now;
            follow.retry = false;
        }
        Ok(changes)
    }

    /// Sends changes to `changes` until `cancel`: on every notification,
    /// and from a full comparison every `resync_every`.
    pub async fn run(
        mut self,
        changes: mpsc::UnboundedSender<ScheduleChange>,
        resync_every: Duration,
        cancel: CancellationToken,
    ) {
        let mut listener = match self.ledger.listen_schedules(CHANNEL).await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "cannot LISTEN for schedule changes; relying on periodic resync");
                None
            }
        };
        let mut tick = tokio::time::interval(resync_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Three wake-ups: shutdown, a notification (one schedule), or
            // the resync tick (all of them). Each is handled completely
            // before the next wait, so changes reach the timer in order.
            // A fourth with sharding: the owned shards changed.
            let woken = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => Wake::Tick,
                Some(n) = recv(&mut listener) => Wake::Notified(n),
                _ = shards_changed(&mut self.shards) => Wake::Shards,
            };
            let found = match woken {
                Wake::Notified(Ok(name)) if !self.wants(&name) => Ok(Vec::new()),
                Wake::Notified(Ok(name)) => self.reload(name.as_str()).await.map(|c| vec![c]),
                Wake::Notified(Err(e)) => {
                    // The listener reconnects on its next receive; changes
                    // sent meanwhile are picked up by a resync now.
                    tracing::warn!(error = %e, "schedule notifications interrupted; resyncing");
                    self.resync().await
                }
                Wake::Shards => self.follow_shards().await,
                Wake::Tick => {
                    // Shard moves first, sent on their own: a resync that
                    // fails afterwards must not swallow them (the follower
                    // already counts them loaded).
                    let moved = self.follow_shards().await;
                    if !send_all(&changes, moved) {
                        return;
                    }
                    self.resync().await
                }
            };
            if !send_all(&changes, found) {
                return;
            }
        }
    }
}

/// Why a stored schedule row does not define a schedule (it was edited by
/// hand, or written by a version with other rules).
#[derive(Debug, thiserror::Error)]
pub enum StoredScheduleError {
    /// The `spec` column is not a schedule definition.
    #[error("stored definition of {name:?} is unreadable: {source}")]
    Unreadable {
        /// The schedule.
        name: String,
        /// Why it does not decode.
        source: serde_json::Error,
    },
    /// The definition decodes but breaks a rule.
    #[error(transparent)]
    Invalid(#[from] crate::schedule::ScheduleError),
}

/// The definition a stored row holds: its `spec` column, or (rows written
/// before specs were stored) one rebuilt from the summary columns.
///
/// # Errors
///
/// [`StoredScheduleError::Unreadable`] when the stored `spec` is not a
/// schedule definition.
pub fn spec_of_row(row: &ScheduleRow) -> Result<ScheduleSpec, StoredScheduleError> {
    match row.spec.clone() {
        Some(json) => serde_json::from_value::<ScheduleSpec>(json).map_err(|source| {
            StoredScheduleError::Unreadable {
                name: row.name.clone(),
                source,
            }
        }),
        None => Ok(spec_from_columns(row)),
    }
}

/// The schedule a stored row defines, paused or not.
///
/// # Errors
///
/// [`StoredScheduleError`] when the stored definition is unreadable or no
/// longer valid.
pub fn schedule_of_row(
    row: &ScheduleRow,
    cache: &mut CronCache,
) -> Result<Schedule, StoredScheduleError> {
    let spec = spec_of_row(row)?;
    Ok(Schedule::from_spec_cached(&spec, cache)?)
}

fn compile(row: ScheduleRow, cache: &mut CronCache) -> ScheduleChange {
    if row.paused {
        return ScheduleChange::Remove(row.name);
    }
    match schedule_of_row(&row, cache) {
        Ok(s) => ScheduleChange::Upsert(Arc::new(s)),
        Err(e) => {
            tracing::error!(schedule = %row.name, error = %e, "stored schedule is invalid; not firing it until it is fixed");
            ScheduleChange::Remove(row.name)
        }
    }
}

/// Sends what was `found` (or logs why nothing was: the current schedules
/// are kept, and a failed shard load is retried); false once the
/// receiver is gone.
fn send_all(
    changes: &mpsc::UnboundedSender<ScheduleChange>,
    found: Result<Vec<ScheduleChange>, LedgerError>,
) -> bool {
    match found {
        Ok(found) => found.into_iter().all(|change| changes.send(change).is_ok()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read schedules; keeping the current ones");
            true
        }
    }
}

/// What woke the follower.
enum Wake {
    Tick,
    Notified(Result<String, LedgerError>),
    Shards,
}

/// Resolves when the owned shards change, or shortly after a failed load;
/// never without sharding or once the keeper is gone.
async fn shards_changed(follow: &mut Option<ShardFollow>) {
    let changed = match follow {
        Some(f) if f.retry => {
            tokio::time::sleep(SHARD_LOAD_RETRY).await;
            true
        }
        Some(f) => f.owned.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

async fn recv(listener: &mut Option<ChangeListener>) -> Option<Result<String, LedgerError>> {
    // An absent listener never yields: the resync tick drives the loop.
    match listener {
        Some(l) => Some(l.recv().await),
        None => std::future::pending().await,
    }
}

fn spec_from_columns(row: &ScheduleRow) -> ScheduleSpec {
    ScheduleSpec {
        name: row.name.clone(),
        cron: row.cron.clone(),
        every: row.every_ms.map(|ms| format!("{}s", ms / 1000)),
        timezone: row.cron.as_ref().map(|_| row.timezone.clone()),
        job_type: row.job_type.clone(),
        payload: Some(row.payload.clone()).filter(|p| !p.is_null()),
        ..ScheduleSpec::default()
    }
}
