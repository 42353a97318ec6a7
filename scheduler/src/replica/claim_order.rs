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
//! claims a fire of one of its schedules. The older batch's failed fires
//! are remembered by then, and the waiting batch stores them before it
//! claims anything (the claim path's first step). A batch waits only for
//! batches with an earlier turn, so waits cannot form a cycle; a batch
//! sharing no schedule with one in flight does not wait at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::schedule::Schedule;

/// The turns of the batches whose claims are not decided yet, per schedule.
#[derive(Debug, Default)]
pub(super) struct ClaimOrder {
    state: Mutex<State>,
    /// Woken whenever a batch's claims are decided.
    decided: Notify,
}

#[derive(Debug, Default)]
struct State {
    next_turn: u64,
    /// Schedule name → the turns of undecided batches holding a fire of it
    /// (usually one).
    pending: HashMap<String, Vec<u64>>,
}

/// One batch's place in the claim order, from its hand-off until its
/// claims are decided (or it is dropped).
#[derive(Debug)]
#[must_use = "the batch's place ends when the turn is dropped"]
pub(super) struct ClaimTurn {
    order: Arc<ClaimOrder>,
    turn: u64,
    /// The batch's schedules, each once.
    names: Vec<String>,
    released: bool,
}

impl ClaimOrder {
    /// Takes the next turn for a batch of `fires`: batches handed off later
    /// that share a schedule with it wait for its claims.
    pub(super) fn enter(self: &Arc<Self>, fires: &[(Arc<Schedule>, DateTime<Utc>)]) -> ClaimTurn {
        let mut names: Vec<String> = Vec::with_capacity(fires.len());
        for (schedule, _) in fires {
            // A batch rarely holds two fires of one schedule, and then next
            // to each other (the timer yields a schedule's instants in
            // order): comparing with the last name is enough to keep the
            // list short, and a repeated name is harmless.
            if names.last() != Some(&schedule.name) {
                names.push(schedule.name.clone());
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
            released: false,
        }
    }

    /// Whether a batch handed off before `turn` still claims a fire of one
    /// of `names`.
    fn earlier_pending(&self, turn: u64, names: &[String]) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        names.iter().any(|name| {
            state
                .pending
                .get(name)
                .is_some_and(|turns| turns.iter().any(|t| *t < turn))
        })
    }
}

impl ClaimTurn {
    /// Waits until no batch handed off before this one still claims a fire
    /// of one of this batch's schedules.
    pub(super) async fn wait(&self) {
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

    /// This batch's claims are decided (won, lost, or failed and
    /// remembered): later batches of its schedules may claim.
    pub(super) fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        {
            let mut state = self.order.state.lock().unwrap_or_else(|p| p.into_inner());
            for name in &self.names {
                if let Some(turns) = state.pending.get_mut(name) {
                    turns.retain(|t| *t != self.turn);
                    if turns.is_empty() {
                        state.pending.remove(name);
                    }
                }
            }
        }
        self.order.decided.notify_waiters();
    }
}

impl Drop for ClaimTurn {
    /// A batch dropped before its claims were decided (cancelled at
    /// shutdown, or a panic) no longer holds the batches after it back.
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;

    fn fires(names: &[&str], at: DateTime<Utc>) -> Vec<(Arc<Schedule>, DateTime<Utc>)> {
        names
            .iter()
            .map(|name| {
                let spec = belfry_protocol::ScheduleSpec {
                    name: (*name).into(),
                    every: Some("1s".into()),
                    job_type: "noop".into(),
                    ..Default::default()
                };
                (Arc::new(Schedule::from_spec(&spec).unwrap()), at)
            })
            .collect()
    }

    #[test]
    fn a_batch_waits_for_the_earlier_batches_of_its_schedules_only() {
        let order = Arc::new(ClaimOrder::default());
        let at = Utc::now();
        let mut older = order.enter(&fires(&["a"], at));
        let newer = order.enter(&fires(&["b", "a"], at + chrono::Duration::seconds(1)));
        let unrelated = order.enter(&fires(&["c"], at + chrono::Duration::seconds(1)));
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
        older.release();
        assert!(
            newer.wait().now_or_never().is_some(),
            "goes on once it is decided"
        );
    }

    #[tokio::test]
    async fn a_waiting_batch_is_woken_when_the_earlier_one_is_dropped() {
        let order = Arc::new(ClaimOrder::default());
        let at = Utc::now();
        let older = order.enter(&fires(&["a"], at));
        let newer = order.enter(&fires(&["a"], at + chrono::Duration::seconds(1)));
        let waiting = tokio::spawn(async move { newer.wait().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(older);
        assert!(waiting.await.is_ok());
    }
}
