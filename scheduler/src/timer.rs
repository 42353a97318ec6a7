//! One timer per replica: a min-heap of each schedule's next wake-up.
//!
//! The replica sleeps until the earliest entry, then asks [`Timer::due`]
//! which fires are due at the current time. The instants come from the
//! schedules, never from when the timer woke, so a late wake-up still
//! produces the nominal instants (and run keys). A schedule with jitter
//! wakes a fixed offset after its nominal instant (see
//! [`Schedule::wake_at`]). When a wake-up is so late that fires were missed,
//! the schedule's misfire policy decides which of them still fire
//! ([`crate::misfire`]); the rest are reported as skipped.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use belfry_runtime::SharedClock;
use chrono::{DateTime, Utc};

use crate::misfire::due_between;
use crate::schedule::{Schedule, ScheduleKind};

/// The longest single sleep. Sleeps run on the monotonic clock while wake-up
/// instants are wall-clock times; waking at least this often re-reads the
/// wall clock, so an NTP step or a suspended VM delays a far-away fire by at
/// most this much.
pub const MAX_SLEEP: Duration = Duration::from_secs(30);

/// Default lateness within which a fire counts as on time.
pub const DEFAULT_MISFIRE_THRESHOLD: Duration = Duration::from_secs(10);

/// One due fire.
#[derive(Debug, Clone)]
pub struct Fire {
    /// The schedule firing.
    pub schedule: Arc<Schedule>,
    /// The nominal fire instant.
    pub at: DateTime<Utc>,
}

/// Fires skipped by a schedule's misfire policy.
#[derive(Debug, Clone)]
pub struct Skipped {
    /// The schedule.
    pub schedule: Arc<Schedule>,
    /// How many fires were skipped.
    pub count: u64,
    /// The span `(after, until]` holding them, when known (see
    /// [`crate::misfire::MisfireDecision::skipped_span`]).
    pub span: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

/// What is due at one instant.
#[derive(Debug, Default)]
pub struct Due {
    /// Fires to claim, oldest first per schedule.
    pub fires: Vec<Fire>,
    /// Fires skipped by misfire policies.
    pub skipped: Vec<Skipped>,
}

/// A heap entry: (wake-up instant, slot, nominal instant, slot generation);
/// ordered by wake-up first. An entry whose generation is not its slot's
/// current one belongs to a replaced or removed definition and is dropped
/// when it comes up.
type Entry = (DateTime<Utc>, usize, DateTime<Utc>, u32);

/// One schedule's place in the timer.
#[derive(Debug)]
struct Slot {
    schedule: Option<Arc<Schedule>>,
    generation: u32,
    /// The latest nominal instant handed off for this schedule.
    last: Option<DateTime<Utc>>,
    /// The nominal instant queued in the heap, not yet handed off.
    queued: Option<DateTime<Utc>>,
}

/// The heap of next wake-ups.
#[derive(Debug, Default)]
pub struct Timer {
    slots: Vec<Slot>,
    by_name: HashMap<String, usize>,
    heap: BinaryHeap<Reverse<Entry>>,
    threshold: Duration,
    /// Slots fired by the last [`Timer::due`] whose next instant is not
    /// computed yet: it is computed after the fires were handed off (on the
    /// next call), so a burst of ten thousand fires is handed off first and
    /// rescheduled second.
    pending: Vec<(usize, DateTime<Utc>, u32)>,
}

impl Timer {
    /// A timer for `schedules`, whose first fires are those waking strictly
    /// after `now`.
    pub fn new(schedules: Vec<Arc<Schedule>>, now: DateTime<Utc>) -> Self {
        let mut timer = Self {
            heap: BinaryHeap::with_capacity(schedules.len()),
            slots: Vec::with_capacity(schedules.len()),
            by_name: HashMap::with_capacity(schedules.len()),
            threshold: DEFAULT_MISFIRE_THRESHOLD,
            pending: Vec::new(),
        };
        // Schedules sharing a parsed expression have the same first instant:
        // computed once per expression (a million schedules on a handful of
        // expressions load in a second).
        let mut memo: HashMap<(usize, DateTime<Utc>), Option<DateTime<Utc>>> = HashMap::new();
        for schedule in schedules {
            let from = now - schedule.jitter_offset;
            let first = match &schedule.kind {
                ScheduleKind::Cron(cron) => *memo
                    .entry((Arc::as_ptr(cron) as usize, from))
                    .or_insert_with(|| schedule.next_after(from)),
                _ => schedule.next_after(from),
            };
            if timer.by_name.contains_key(&schedule.name) {
                // (Only reachable with a repeated name in the input.)
                // A repeated name: the later definition replaces it.
                timer.upsert(schedule, now);
                continue;
            }
            let slot = timer.slots.len();
            if let Some(at) = first {
                timer
                    .heap
                    .push(Reverse((schedule.wake_at(at), slot, at, 1)));
            }
            timer.by_name.insert(schedule.name.clone(), slot);
            timer.slots.push(Slot {
                schedule: Some(schedule),
                generation: 1,
                last: None,
                queued: first,
            });
        }
        timer
    }

    /// Sets the lateness within which a fire is on time.
    pub fn with_misfire_threshold(mut self, threshold: Duration) -> Self {
        self.threshold = threshold;
        self
    }

    /// Adds a schedule, or replaces the definition of the one with its name.
    ///
    /// A replaced schedule continues after the latest instant it already
    /// handed off, or after `now` if that is later: an instant is never fired
    /// twice by this timer, and the next instant of the new definition is
    /// never lost. Returns whether the schedule was already in the timer
    /// (a change) rather than new or resumed.
    pub fn upsert(&mut self, schedule: Arc<Schedule>, now: DateTime<Utc>) -> bool {
        let known = self
            .by_name
            .get(&schedule.name)
            .is_some_and(|&i| self.slots[i].schedule.is_some());
        let slot = match self.by_name.get(&schedule.name) {
            Some(&i) => i,
            None => {
                self.slots.push(Slot {
                    schedule: None,
                    generation: 0,
                    last: None,
                    queued: None,
                });
                let i = self.slots.len() - 1;
                self.by_name.insert(schedule.name.clone(), i);
                i
            }
        };
        let entry = &mut self.slots[slot];
        entry.generation = entry.generation.wrapping_add(1);
        // An instant whose jittered wake-up is still ahead fires, under the
        // old jitter or the new one; an instant the old definition had
        // queued but not handed off is not skipped; nothing handed off fires
        // again.
        let old_offset = entry
            .schedule
            .as_ref()
            .map_or(chrono::Duration::zero(), |s| s.jitter_offset);
        let mut from = now - old_offset.max(schedule.jitter_offset);
        if let Some(queued) = entry.queued {
            from = from.min(queued - chrono::Duration::seconds(1));
        }
        if let Some(last) = entry.last {
            from = from.max(last);
        }
        entry.queued = schedule.next_after(from);
        if let Some(at) = entry.queued {
            self.heap
                .push(Reverse((schedule.wake_at(at), slot, at, entry.generation)));
        }
        entry.schedule = Some(schedule);
        known
    }

    /// Removes the schedule named `name` (deleted or paused). Returns
    /// whether it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        // The slot stays (with its last fired instant) for the name's return:
        // a resumed schedule reuses it and never refires what it fired.
        let Some(&slot) = self.by_name.get(name) else {
            return false;
        };
        let entry = &mut self.slots[slot];
        entry.generation = entry.generation.wrapping_add(1);
        entry.queued = None;
        entry.schedule.take().is_some()
    }

    /// The schedules this timer fires.
    pub fn schedules(&self) -> Vec<Arc<Schedule>> {
        self.slots
            .iter()
            .filter_map(|s| s.schedule.clone())
            .collect()
    }

    /// The live schedule of `slot` if `generation` is still current.
    fn live(&self, slot: usize, generation: u32) -> Option<Arc<Schedule>> {
        let entry = &self.slots[slot];
        if entry.generation == generation {
            entry.schedule.clone()
        } else {
            None
        }
    }

    /// The earliest pending wake-up.
    pub fn next_at(&mut self) -> Option<DateTime<Utc>> {
        self.settle();
        // Drop stale entries so the sleep is for a live schedule.
        while let Some(Reverse((wake, slot, _, generation))) = self.heap.peek().copied() {
            if self.live(slot, generation).is_some() {
                return Some(wake);
            }
            self.heap.pop();
        }
        None
    }

    /// The number of live schedules.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.schedule.is_some()).count()
    }

    /// Whether the timer has no schedule.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Computes the next instants of the schedules fired last.
    fn settle(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        // Schedules sharing a parsed cron expression (thousands of tenants
        // on `0 0 * * * *`) fired at the same instant have the same next
        // instant: compute it once per expression and instant.
        let mut memo: HashMap<(usize, DateTime<Utc>), Option<DateTime<Utc>>> = HashMap::new();
        for (slot, last, generation) in std::mem::take(&mut self.pending) {
            let Some(schedule) = self.live(slot, generation) else {
                continue;
            };
            let next = match &schedule.kind {
                ScheduleKind::Cron(cron) => *memo
                    .entry((Arc::as_ptr(cron) as usize, last))
                    .or_insert_with(|| schedule.next_after(last)),
                ScheduleKind::Every { .. } | ScheduleKind::Once { .. } => schedule.next_after(last),
            };
            self.slots[slot].queued = next;
            if let Some(next) = next {
                self.heap
                    .push(Reverse((schedule.wake_at(next), slot, next, generation)));
            }
        }
    }

    /// Sleeps until the earliest wake-up by `clock` (at most
    /// [`MAX_SLEEP`], so a stepped wall clock is noticed), or for
    /// [`MAX_SLEEP`] when nothing is scheduled.
    pub async fn wait(&mut self, clock: &SharedClock) {
        let wait = match self.next_at() {
            Some(next) => (next - clock.now()).to_std().unwrap_or(Duration::ZERO),
            None => MAX_SLEEP,
        };
        tokio::time::sleep(wait.min(MAX_SLEEP)).await;
    }

    /// Removes and returns every fire due at `now` (wake-up ≤ `now`) after
    /// applying each schedule's misfire policy, and queues each schedule's
    /// next instant.
    pub fn due(&mut self, now: DateTime<Utc>) -> Due {
        self.settle();
        let mut due = Due::default();
        while let Some(Reverse((wake, slot, first, generation))) = self.heap.peek().copied() {
            if wake > now {
                break;
            }
            self.heap.pop();
            let Some(schedule) = self.live(slot, generation) else {
                continue;
            };
            // Lateness is measured from the wake-up (this entry's own offset,
            // which `wake_at` may have shortened), so jitter never makes a
            // fire look missed.
            let reference = now - (wake - first);
            if reference - first < chrono::Duration::seconds(1) {
                // The common case: less than a second late, so exactly this
                // instant is due (instants are whole seconds apart) and it is
                // on time. Handed off now, rescheduled on the next call.
                self.slots[slot].last = Some(first);
                self.slots[slot].queued = None;
                due.fires.push(Fire {
                    schedule,
                    at: first,
                });
                self.pending.push((slot, first, generation));
                continue;
            }
            let span_after = first - chrono::Duration::seconds(1);
            let mut instants = due_between(
                &schedule,
                span_after,
                reference.max(first),
                schedule.misfire.keep(),
            );
            if instants.total == 0 {
                instants.latest.push(first);
                instants.total = 1;
            }
            let last = instants.latest.last().copied().unwrap_or(first);
            let decision = schedule
                .misfire
                .decide(&instants, reference.max(first), self.threshold);
            if decision.skipped > 0 {
                due.skipped.push(Skipped {
                    schedule: schedule.clone(),
                    count: decision.skipped,
                    span: decision.skipped_span(span_after, reference.max(first)),
                });
            }
            for at in decision.fire {
                due.fires.push(Fire {
                    schedule: schedule.clone(),
                    at,
                });
            }
            let resume = last.max(reference);
            self.slots[slot].last = Some(resume);
            self.slots[slot].queued = schedule.next_after(resume);
            if let Some(next) = self.slots[slot].queued {
                self.heap
                    .push(Reverse((schedule.wake_at(next), slot, next, generation)));
            }
        }
        due
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
        assert!(t.due(at("2026-01-01T00:00:01.999Z")).fires.is_empty());
        // A late wake-up still yields the nominal instant.
        let f = t.due(at("2026-01-01T00:00:02.400Z")).fires;
        assert_eq!(f.len(), 1);
        assert_eq!(
            (f[0].schedule.name.as_str(), f[0].at),
            ("a", at("2026-01-01T00:00:02Z"))
        );
        let f = t.due(at("2026-01-01T00:00:04Z")).fires;
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
        // 10 s late: the default fire_once policy with a 10 s threshold
        // fires the on-time instants only; nothing is skipped yet.
        let d = t.due(at("2026-01-01T00:00:10.2Z"));
        assert_eq!(d.fires.len(), 10);
        let mut t = Timer::new(vec![every("a", "1s")], at("2026-01-01T00:00:00Z"));
        let d = t.due(at("2026-01-01T00:01:00.2Z"));
        assert_eq!(d.fires.len(), 10, "the on-time ones (within 10 s)");
        assert_eq!(d.fires[0].at, at("2026-01-01T00:00:51Z"));
        assert_eq!(d.skipped[0].count, 50);
        assert_eq!(t.next_at(), Some(at("2026-01-01T00:01:01Z")));
    }

    #[test]
    fn skip_policy_drops_missed_fires_and_jitter_delays_the_wake_up() {
        let skip = Arc::new(
            Schedule::from_spec(&ScheduleSpec {
                name: "s".into(),
                every: Some("1m".into()),
                misfire: Some("skip".into()),
                jitter: Some("20s".into()),
                job_type: "noop".into(),
                ..Default::default()
            })
            .unwrap(),
        );
        let off = skip.jitter_offset;
        // Started 30 s after 00:00:00, whose jittered wake-up (< 20 s) has
        // passed: the first wake-up is the next minute's.
        let mut t = Timer::new(vec![skip.clone()], at("2026-01-01T00:00:30Z"));
        assert_eq!(t.next_at(), Some(at("2026-01-01T00:01:00Z") + off));
        // Started just after 00:00:00: its jittered wake-up is still ahead.
        let mut early = Timer::new(vec![skip.clone()], at("2026-01-01T00:00:00Z"));
        assert_eq!(early.next_at(), Some(at("2026-01-01T00:00:00Z") + off));
        // On time (at its jittered wake-up): fires with the nominal instant.
        let d = t.due(at("2026-01-01T00:01:00.5Z") + off);
        assert_eq!(
            d.fires.iter().map(|f| f.at).collect::<Vec<_>>(),
            [at("2026-01-01T00:01:00Z")]
        );
        // Ten minutes late: skip fires nothing and counts nine.
        let d = t.due(at("2026-01-01T00:10:30Z") + off);
        assert!(d.fires.is_empty());
        assert_eq!(d.skipped[0].count, 9);
    }

    #[test]
    fn replicas_with_skewed_clocks_agree_on_instants() {
        let s = vec![every("a", "1s")];
        let mut fast = Timer::new(s.clone(), at("2026-01-01T00:00:00.9Z"));
        let mut slow = Timer::new(s, at("2026-01-01T00:00:00.1Z"));
        let instants = |timer: &mut Timer, now: &str| -> Vec<_> {
            timer.due(at(now)).fires.into_iter().map(|f| f.at).collect()
        };
        assert_eq!(
            instants(&mut fast, "2026-01-01T00:00:01.9Z"),
            instants(&mut slow, "2026-01-01T00:00:01.1Z")
        );
    }
}
