//! One timer per replica: a min-heap of each schedule's next fire instant.
//!
//! The replica sleeps until the earliest entry, then asks [`Timer::due`]
//! which fires are due at the current time. The instants come from the
//! schedules, never from the wake-up time, so a late wake-up still produces
//! the nominal instants (and run keys). When a wake-up is so late that
//! several fires of one schedule are due, only the latest fires and the
//! others are counted as skipped (the `fire_once` misfire rule).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::schedule::Schedule;

/// One due fire.
#[derive(Debug, Clone)]
pub struct Fire {
    /// The schedule firing.
    pub schedule: Arc<Schedule>,
    /// The nominal fire instant.
    pub at: DateTime<Utc>,
    /// Earlier fires of the same schedule that were due too and are skipped.
    pub skipped: u64,
}

/// The heap of next fires.
#[derive(Debug, Default)]
pub struct Timer {
    schedules: Vec<Arc<Schedule>>,
    heap: BinaryHeap<Reverse<(DateTime<Utc>, usize)>>,
}

impl Timer {
    /// A timer for `schedules`, whose first fires are the first instants
    /// strictly after `now`.
    pub fn new(schedules: Vec<Arc<Schedule>>, now: DateTime<Utc>) -> Self {
        let mut heap = BinaryHeap::with_capacity(schedules.len());
        for (i, s) in schedules.iter().enumerate() {
            if let Some(at) = s.next_after(now) {
                heap.push(Reverse((at, i)));
            }
        }
        Self { schedules, heap }
    }

    /// The earliest pending fire instant.
    pub fn next_at(&self) -> Option<DateTime<Utc>> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The number of schedules with a pending fire.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no schedule will fire again.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Removes and returns every fire due at `now` (instant ≤ `now`), and
    /// queues each schedule's next instant after `now`.
    pub fn due(&mut self, now: DateTime<Utc>) -> Vec<Fire> {
        let mut fires = Vec::new();
        while let Some(Reverse((at, i))) = self.heap.peek().copied() {
            if at > now {
                break;
            }
            self.heap.pop();
            let schedule = self.schedules[i].clone();
            let mut fire_at = at;
            let mut skipped = 0;
            loop {
                match schedule.next_after(fire_at) {
                    Some(next) if next <= now => {
                        skipped += 1;
                        fire_at = next;
                    }
                    Some(next) => {
                        self.heap.push(Reverse((next, i)));
                        break;
                    }
                    None => break,
                }
            }
            fires.push(Fire {
                schedule,
                at: fire_at,
                skipped,
            });
        }
        fires
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_protocol::ScheduleSpec;

    fn every(name: &str, period: &str) -> Arc<Schedule> {
        Arc::new(
            Schedule::from_spec(&ScheduleSpec {
                name: name.into(),
                cron: None,
                every: Some(period.into()),
                timezone: None,
                job_type: "noop".into(),
                ..Default::default()
            })
            .unwrap(),
        )
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn fires_nominal_instants_in_order() {
        let mut t = Timer::new(
            vec![every("a", "2s"), every("b", "3s")],
            at("2026-01-01T00:00:00.5Z"),
        );
        assert_eq!(t.next_at(), Some(at("2026-01-01T00:00:02Z")));
        assert!(t.due(at("2026-01-01T00:00:01.999Z")).is_empty());
        // A late wake-up still yields the nominal instant.
        let f = t.due(at("2026-01-01T00:00:02.400Z"));
        assert_eq!(f.len(), 1);
        assert_eq!(
            (f[0].schedule.name.as_str(), f[0].at),
            ("a", at("2026-01-01T00:00:02Z"))
        );
        let f = t.due(at("2026-01-01T00:00:04Z"));
        let names: Vec<_> = f.iter().map(|f| (f.schedule.name.as_str(), f.at)).collect();
        assert_eq!(
            names,
            [
                ("b", at("2026-01-01T00:00:03Z")),
                ("a", at("2026-01-01T00:00:04Z"))
            ]
        );
    }

    #[test]
    fn a_long_sleep_fires_once_and_counts_the_skipped() {
        let mut t = Timer::new(vec![every("a", "1s")], at("2026-01-01T00:00:00Z"));
        let f = t.due(at("2026-01-01T00:00:10.2Z"));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].at, at("2026-01-01T00:00:10Z"));
        assert_eq!(f[0].skipped, 9);
        assert_eq!(t.next_at(), Some(at("2026-01-01T00:00:11Z")));
    }

    #[test]
    fn replicas_with_skewed_clocks_agree_on_instants() {
        let s = vec![every("a", "1s")];
        let mut fast = Timer::new(s.clone(), at("2026-01-01T00:00:00.9Z"));
        let mut slow = Timer::new(s, at("2026-01-01T00:00:00.1Z"));
        let f1: Vec<_> = fast
            .due(at("2026-01-01T00:00:01.9Z"))
            .into_iter()
            .map(|f| f.at)
            .collect();
        let f2: Vec<_> = slow
            .due(at("2026-01-01T00:00:01.1Z"))
            .into_iter()
            .map(|f| f.at)
            .collect();
        assert_eq!(f1, f2);
    }
}
