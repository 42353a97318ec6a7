//! Claims of one schedule stored in the order of its instants.
//!
//! Recovery starts from a schedule's latest run: the instants after it are
//! decided, the ones before it are taken as decided. So a newer fire of a
//! schedule must never be stored while an older fire of it is still being
//! claimed on this replica: were the older claim to fail after the newer
//! one was stored, and the replica to die before it stored the older fire
//! as missed (see [`super::missed_fires`]), the newer run would hide the
//! older fire from every later recovery. Two timer batches in flight at
//! once (a one-second schedule whose claims take longer than a second) can
//! hold two fires of one schedule.
//!
//! So every batch takes a [`ClaimTurn`] when it is handed off, in the order
//! the timer hands batches off (which is each schedule's instant order),
//! and before claiming waits until no batch handed off before it still
//! claims a fire of one of its schedules. A timer or recovery batch's
//! failed fires are remembered by then, and the waiting batch stores them
//! before it claims anything (the claim path's first step). A batch waits
//! only for batches with an earlier turn, so waits cannot form a cycle; a
//! batch sharing no schedule with one in flight does not wait at all.
//!
//! This orders claims on one replica. Across replicas, a fire another
//! replica's claim holds at the lock is checked by the replica that lost it
//! (`verify_lock_losses`).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::schedule::Schedule;

/// The turns of the batches whose claims are not decided yet, per schedule.
#[derive(Debug, Default)]
pub(super) struct ClaimOrder {
    state: Mutex<State>,
    /// Woken whenever a batch's claims are decided and a batch waits.
    decided: Notify,
    /// Batches waiting for their turn: a release wakes nobody when none is.
    waiting: AtomicUsize,
}

/// A schedule as a key, by name (a changed schedule is the same one): a
/// clone costs a reference count, not a copy of the name.
#[derive(Debug, Clone)]
struct ByName(Arc<Schedule>);

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for ByName {}

impl Hash for ByName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

#[derive(Debug, Default)]
struct State {
    next_turn: u64,
    /// Schedule → the turns of undecided batches holding a fire of it
    /// (usually one).
    pending: HashMap<ByName, Vec<u64>>,
}

impl State {
    /// Takes `turn` off each of `names`.
    fn remove(&mut self, turn: u64, names: &[ByName]) {
        for name in names {
            if let Some(turns) = self.pending.get_mut(name) {
                turns.retain(|t| *t != turn);
                if turns.is_empty() {
                    self.pending.remove(name);
                }
            }
        }
    }
}

/// One batch's place in the claim order, from its hand-off until its
/// claims are decided (or it is dropped).
#[derive(Debug)]
#[must_use = "the batch's place ends when the turn is dropped"]
pub(super) struct ClaimTurn {
    order: Arc<ClaimOrder>,
    turn: u64,
    /// The batch's schedules (a name may repeat, harmlessly).
    names: Vec<ByName>,
}

impl ClaimOrder {
    /// Takes the next turn for a batch of `fires`: batches handed off later
    /// that share a schedule with it wait for its claims. An empty `fires`
    /// takes a turn that holds nothing back.
    pub(super) fn enter(self: &Arc<Self>, fires: &[(Arc<Schedule>, DateTime<Utc>)]) -> ClaimTurn {
        let mut names: Vec<ByName> = Vec::with_capacity(fires.len());
        for (schedule, _) in fires {
            // Comparing with the last name keeps the list short when a
            // schedule's fires sit together (the timer yields a schedule's
            // instants in order); a name listed twice costs nothing more.
            if names.last().map(|n| &n.0.name) != Some(&schedule.name) {
                names.push(ByName(schedule.clone()));
            }
        }
        // A poisoned lock only means another batch panicked while holding
        // it; the map is updated in single steps, so it is still whole.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let turn = state.next_turn;
        state.next_turn += 1;
        for name in &names {
            state.pending.entry(name.clone()).or_default().push(turn);
        }
        drop(state);
        ClaimTurn {
            order: self.clone(),
            turn,
            names,
        }
    }

    /// Whether a batch handed off before `turn` still claims a fire of one
    /// of `names`.
    fn earlier_pending(&self, turn: u64, names: &[ByName]) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        names.iter().any(|name| {
            state
                .pending
                .get(name)
                .is_some_and(|turns| turns.iter().any(|t| *t < turn))
        })
    }

    /// Takes `turn` off `names` and wakes the waiting batches, if any.
    fn release(&self, turn: u64, names: &[ByName]) {
        if names.is_empty() {
            return;
        }
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(turn, names);
        // A waiter counts itself before it checks (see `ClaimTurn::wait`),
        // so one that found this turn pending is counted here.
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.decided.notify_waiters();
        }
    }
}

impl ClaimTurn {
    /// Waits until no batch handed off before this one still claims a fire
    /// of one of this batch's schedules.
    pub(super) async fn wait(&self) {
        if !self.order.earlier_pending(self.turn, &self.names) {
            return;
        }
        self.order.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = WaitCount(&self.order.waiting);
        loop {
            // Registered before the check, so a release between the check
            // and the wait still wakes this batch.
            let decided = self.order.decided.notified();
            tokio::pin!(decided);
            decided.as_mut().enable();
            if !self.order.earlier_pending(self.turn, &self.names) {
                return;
            }
            decided.await;
        }
    }

    /// Keeps only the schedules of `fires` in this turn (the others' fires
    /// were set aside and remembered): later batches of the others need not
    /// wait for this one.
    pub(super) fn narrow(&mut self, fires: &[(Arc<Schedule>, DateTime<Utc>)]) {
        let (kept, dropped): (Vec<ByName>, Vec<ByName>) = std::mem::take(&mut self.names)
            .into_iter()
            .partition(|n| fires.iter().any(|(s, _)| s.name == n.0.name));
        self.names = kept;
        self.order.release(self.turn, &dropped);
    }

    /// This batch's claims are decided (won, lost, or failed and
    /// remembered): later batches of its schedules may claim.
    pub(super) fn release(&mut self) {
        let names = std::mem::take(&mut self.names);
        self.order.release(self.turn, &names);
    }
}

impl Drop for ClaimTurn {
    /// A batch dropped before its claims were decided (cancelled at
    /// shutdown, or a panic) no longer holds the batches after it back.
    fn drop(&mut self) {
        self.release();
    }
}

/// Uncounts a waiting batch however its wait ends (done or cancelled).
struct WaitCount<'a>(&'a AtomicUsize);

impl Drop for WaitCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::every_second;
    use futures::FutureExt as _;

    fn fires(names: &[&str], at: DateTime<Utc>) -> Vec<(Arc<Schedule>, DateTime<Utc>)> {
        names.iter().map(|name| (every_second(name), at)).collect()
    }

    #[test]
    fn a_batch_waits_for_the_earlier_batches_of_its_schedules_only() {
        let order = Arc::new(ClaimOrder::default());
        let at = Utc::now();
        let mut older = order.enter(&fires(&["a"], at));
        let newer = order.enter(&fires(&["b", "a"], at + chrono::Duration::seconds(1)));
        let unrelated = order.enter(&fires(&["c"], at + chrono::Duration::seconds(1)));
        let nothing = order.enter(&[]);
        assert!(
            newer.wait().now_or_never().is_none(),
            "waits for the older claim of a"
        );
        assert!(
            older.wait().now_or_never().is_some(),
            "never for a later batch"
        );
        assert!(
            unrelated.wait().now_or_never().is_some(),
            "no shared schedule, no wait"
        );
        assert!(nothing.wait().now_or_never().is_some());
        older.release();
        assert!(
            newer.wait().now_or_never().is_some(),
            "goes on once it is decided"
        );
    }

    #[test]
    fn a_narrowed_turn_holds_back_only_the_schedules_it_kept() {
        let order = Arc::new(ClaimOrder::default());
        let at = Utc::now();
        let mut older = order.enter(&fires(&["a", "b"], at));
        let of_a = order.enter(&fires(&["a"], at + chrono::Duration::seconds(1)));
        let of_b = order.enter(&fires(&["b"], at + chrono::Duration::seconds(1)));
        older.narrow(&fires(&["b"], at));
        assert!(of_a.wait().now_or_never().is_some());
        assert!(of_b.wait().now_or_never().is_none());
    }

    #[tokio::test]
    async fn a_waiting_batch_is_woken_when_the_earlier_one_is_dropped() {
        let order = Arc::new(ClaimOrder::default());
        let at = Utc::now();
        let older = order.enter(&fires(&["a"], at));
        let newer = order.enter(&fires(&["a"], at + chrono::Duration::seconds(1)));
        let waiting = newer.wait();
        tokio::pin!(waiting);
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "registered and waiting"
        );
        drop(older);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken by the drop, not left waiting");
    }
}
