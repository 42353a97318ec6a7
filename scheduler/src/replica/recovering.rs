//! Schedules whose misfire recovery is under way, and the timer fires that
//! wait for it.
//!
//! Recovery (at start, on taking a shard, on a resume) decides the
//! instants between a schedule's latest run and now. Were the timer to
//! claim a newer instant of the schedule meanwhile and the replica then
//! die before the recovery's decisions were stored, the newer run would be
//! the latest one the next recovery starts from, and the instants before
//! it would be lost. So a timer fire of a schedule under recovery is not
//! claimed: it is remembered as missed (and recorded in the ledger before
//! anything is claimed, see [`super::missed_fires`]), and decided by its
//! misfire policy as soon as the recovery ends, late by the recovery's
//! duration. A recovery marks its schedules with a [`RecoveryWait`] guard that
//! ends the wait when dropped, whether the recovery finished or gave up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use crate::schedule::Schedule;

/// What one recovery covers.
#[derive(Debug, Clone)]
pub(super) enum Scope {
    /// Every schedule this replica has (its first recovery, at start).
    All,
    /// These schedules.
    Named(Vec<String>),
}

impl Scope {
    /// The scope of a recovery of `schedules`.
    pub(super) fn of(schedules: &[Arc<Schedule>]) -> Self {
        Scope::Named(schedules.iter().map(|s| s.name.clone()).collect())
    }
}

#[derive(Debug, Default)]
struct Pending {
    /// Recoveries of every schedule under way.
    all: usize,
    /// Recoveries under way per schedule.
    named: HashMap<String, usize>,
}

/// The recoveries under way on one replica.
#[derive(Debug, Default)]
pub(super) struct Recovering {
    pending: Mutex<Pending>,
}

/// Marks a recovery's schedules as under recovery until dropped (see
/// [`crate::Replica::wait_for_recovery`]).
#[derive(Debug)]
#[must_use = "the wait ends when the guard is dropped"]
pub struct RecoveryWait {
    set: Arc<Recovering>,
    scope: Scope,
}

impl Recovering {
    /// Marks `scope` as under recovery until the guard is dropped.
    pub(super) fn begin(self: &Arc<Self>, scope: Scope) -> RecoveryWait {
        {
            let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            match &scope {
                Scope::All => p.all += 1,
                Scope::Named(names) => {
                    for name in names {
                        *p.named.entry(name.clone()).or_default() += 1;
                    }
                }
            }
        }
        RecoveryWait {
            set: self.clone(),
            scope,
        }
    }

    /// Which of `fires` wait for a recovery; `None` when none does (the
    /// usual case, one uncontended lock).
    pub(super) fn waiting(&self, fires: &[(Arc<Schedule>, DateTime<Utc>)]) -> Option<Vec<bool>> {
        let p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if p.all > 0 {
            return Some(vec![true; fires.len()]);
        }
        if p.named.is_empty() {
            return None;
        }
        let waits: Vec<bool> = fires
            .iter()
            .map(|(s, _)| p.named.contains_key(&s.name))
            .collect();
        waits.contains(&true).then_some(waits)
    }
}

impl Drop for RecoveryWait {
    fn drop(&mut self) {
        let mut p = self.set.pending.lock().unwrap_or_else(|p| p.into_inner());
        match &self.scope {
            Scope::All => p.all = p.all.saturating_sub(1),
            Scope::Named(names) => {
                for name in names {
                    if let Some(n) = p.named.get_mut(name) {
                        *n -= 1;
                        if *n == 0 {
                            p.named.remove(name);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fire(name: &str) -> (Arc<Schedule>, DateTime<Utc>) {
        (
            crate::schedule::every_second(name),
            DateTime::<Utc>::UNIX_EPOCH,
        )
    }

    #[test]
    fn fires_wait_while_their_schedules_recovery_is_under_way() {
        let set = Arc::new(Recovering::default());
        let fires = [fire("a"), fire("b")];
        assert_eq!(set.waiting(&fires), None);
        let a = set.begin(Scope::Named(vec!["a".into()]));
        let a_again = set.begin(Scope::Named(vec!["a".into()]));
        assert_eq!(set.waiting(&fires), Some(vec![true, false]));
        drop(a);
        assert_eq!(
            set.waiting(&fires),
            Some(vec![true, false]),
            "a second recovery of a is still under way"
        );
        let all = set.begin(Scope::All);
        assert_eq!(set.waiting(&fires), Some(vec![true, true]));
        drop(all);
        drop(a_again);
        assert_eq!(set.waiting(&fires), None);
    }
}
