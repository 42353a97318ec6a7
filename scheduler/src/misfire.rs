//! Misfire policies: what a schedule does about fires that were not made on
//! time — every replica was down, the timer woke late, or the ledger was
//! unreachable when they were due.
//!
//! A due instant no later than the misfire threshold (`BELFRY_MISFIRE_THRESHOLD`,
//! default 10 s) before now is *on time* and always fires. Older ones are
//! *missed*, and the schedule's policy decides:
//!
//! | policy | missed fires |
//! | --- | --- |
//! | `skip` | none fire |
//! | `fire_once` (default) | only the latest, and only when no on-time fire exists |
//! | `catch_up` | every one inside the catch-up window before now, at most `catch_up_max` (the latest ones) |
//!
//! Whatever is not fired is counted and logged as skipped, never silent.
//! Missed fires go through the same claim path as on-time ones, with their
//! nominal run keys, so replicas recovering together still fire each once.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::schedule::Schedule;

/// Default `catch_up` window.
pub const DEFAULT_CATCH_UP_WINDOW: Duration = Duration::from_secs(3600);
/// Default `catch_up` cap.
pub const DEFAULT_CATCH_UP_MAX: usize = 100;
/// Most instants walked one by one when counting what was missed.
pub const COUNT_LIMIT: u64 = 1_000_000;

/// What a schedule does with missed fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MisfirePolicy {
    /// Missed fires are skipped.
    Skip,
    /// Only the latest missed fire fires (when no fire is on time).
    #[default]
    FireOnce,
    /// Every missed fire inside `window` fires, at most `max` of them.
    CatchUp {
        /// How far back missed fires are caught up.
        window: Duration,
        /// At most this many (the latest).
        max: usize,
    },
}

/// Instants due for one schedule, as enumerated: the latest few kept, all
/// counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueInstants {
    /// The latest due instants, oldest first.
    pub latest: Vec<DateTime<Utc>>,
    /// How many instants were due in all (capped at [`COUNT_LIMIT`]).
    pub total: u64,
}

/// What to do for one schedule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MisfireDecision {
    /// Instants to fire, oldest first.
    pub fire: Vec<DateTime<Utc>>,
    /// Instants skipped.
    pub skipped: u64,
}

impl MisfireDecision {
    /// The span `(after, until]` of the instants skipped when the due
    /// instants were those of `(after, until]`. Every policy keeps the
    /// newest instants, so the skipped ones are the oldest: the span ends
    /// just before the first fired instant (instants are whole seconds),
    /// or at `until` when none fires. `None` when nothing was skipped.
    pub fn skipped_span(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        if self.skipped == 0 {
            return None;
        }
        let end = self
            .fire
            .first()
            .map_or(until, |first| *first - chrono::Duration::seconds(1));
        (end > after).then_some((after, end))
    }
}

impl MisfirePolicy {
    /// How many of the latest due instants the decision can need.
    pub fn keep(&self) -> usize {
        match self {
            // On-time instants are at most threshold/period + 1; 64 covers a
            // 10 s threshold for any schedule slower than 6 fires a second.
            Self::Skip | Self::FireOnce => 64,
            Self::CatchUp { max, .. } => (*max).max(64),
        }
    }

    /// Decides which of `due` fire at `now`.
    pub fn decide(
        &self,
        due: &DueInstants,
        now: DateTime<Utc>,
        threshold: Duration,
    ) -> MisfireDecision {
        let threshold = chrono::Duration::from_std(threshold).unwrap_or(chrono::Duration::MAX);
        let on_time: Vec<DateTime<Utc>> = due
            .latest
            .iter()
            .copied()
            .filter(|t| now - *t <= threshold)
            .collect();
        let missed: Vec<DateTime<Utc>> = due
            .latest
            .iter()
            .copied()
            .filter(|t| now - *t > threshold)
            .collect();
        let mut fire = match self {
            Self::Skip => Vec::new(),
            Self::FireOnce if on_time.is_empty() => missed.last().copied().into_iter().collect(),
            Self::FireOnce => Vec::new(),
            Self::CatchUp { window, max } => {
                let window = chrono::Duration::from_std(*window).unwrap_or(chrono::Duration::MAX);
                let inside: Vec<_> = missed.into_iter().filter(|t| now - *t <= window).collect();
                let from = inside.len().saturating_sub(*max);
                inside[from..].to_vec()
            }
        };
        fire.extend(on_time);
        let fired = u64::try_from(fire.len()).unwrap_or(u64::MAX);
        MisfireDecision {
            skipped: due.total.saturating_sub(fired),
            fire,
        }
    }
}

/// Enumerates `schedule`'s instants in `(after, until]`, keeping the latest
/// `keep` and counting all (exactly for intervals; for cron schedules gaps
/// longer than six hours are counted exactly in their last six hours and
/// estimated before).
pub fn due_between(
    schedule: &Schedule,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
    keep: usize,
) -> DueInstants {
    if until <= after {
        return DueInstants::default();
    }
    let mut latest = VecDeque::with_capacity(keep.min(1024));
    let mut total = 0u64;
    let mut t = after;
    // Counting every instant of a long gap one by one would be slow (a day
    // of a one-second cron is 86,400 evaluations per schedule). Intervals
    // are counted arithmetically; cron schedules enumerate only the last
    // part of the gap — all a policy can fire — and the earlier part is
    // estimated from the schedule's spacing.
    let keep_i = i64::try_from(keep).unwrap_or(i64::MAX);
    match &schedule.kind {
        crate::schedule::ScheduleKind::Every { period, .. } => {
            let Some(first) = schedule.next_after(after).filter(|f| *f <= until) else {
                return DueInstants::default();
            };
            let p = period.num_seconds().max(1);
            let count = (until - first).num_seconds() / p + 1;
            let skip = (count - keep_i).max(0);
            t = first + chrono::Duration::seconds(skip * p) - chrono::Duration::seconds(1);
            total = u64::try_from(skip).unwrap_or(0);
        }
        crate::schedule::ScheduleKind::Cron(_) => {
            // Walk back from `until` in doubling windows until the window
            // holds `keep` instants or reaches `after`: a daily schedule
            // after an eight-hour outage still finds its one missed fire.
            let mut lookback = chrono::Duration::hours(6);
            loop {
                if until - after <= lookback {
                    break;
                }
                let start = until - lookback;
                let inside = (0..keep.max(1))
                    .scan(start, |t, _| {
                        let next = schedule.next_after(*t).filter(|n| *n <= until)?;
                        *t = next;
                        Some(next)
                    })
                    .count();
                if inside >= keep.max(1) {
                    if let (Some(a), Some(b)) =
                        (schedule.next_after(after), schedule.next_after(start))
                    {
                        let gap = schedule
                            .next_after(a)
                            .map_or(1, |n| (n - a).num_seconds().max(1));
                        total = u64::try_from(((b - a).num_seconds() / gap).max(0)).unwrap_or(0);
                        t = start;
                    }
                    break;
                }
                lookback = lookback * 2;
            }
        }
        crate::schedule::ScheduleKind::Once { .. } => {}
    }
    let mut walked = 0u64;
    while let Some(next) = schedule.next_after(t) {
        if next > until || walked >= COUNT_LIMIT {
            break;
        }
        walked += 1;
        total += 1;
        if latest.len() == keep {
            latest.pop_front();
        }
        if keep > 0 {
            latest.push_back(next);
        }
        t = next;
    }
    DueInstants {
        latest: latest.into(),
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn due(instants: &[&str]) -> DueInstants {
        DueInstants {
            latest: instants.iter().map(|s| at(s)).collect(),
            total: instants.len() as u64,
        }
    }

    /// A schedule of job type `noop` with a `cron` or an `every` rule.
    fn schedule(cron: Option<&str>, every: Option<&str>) -> crate::Schedule {
        crate::Schedule::from_spec(&belfry_protocol::ScheduleSpec {
            name: "s".into(),
            cron: cron.map(Into::into),
            every: every.map(Into::into),
            job_type: "noop".into(),
            ..Default::default()
        })
        .unwrap()
    }

    /// [`due_between`] with RFC 3339 bounds.
    fn due_in(s: &crate::Schedule, from: &str, to: &str, keep: usize) -> DueInstants {
        due_between(s, at(from), at(to), keep)
    }

    /// The decision that fires `instants` and skips `skipped`.
    fn decision(instants: &[&str], skipped: u64) -> MisfireDecision {
        MisfireDecision {
            fire: instants.iter().map(|s| at(s)).collect(),
            skipped,
        }
    }

    const NOW: &str = "2026-07-26T03:00:30Z";
    const T: Duration = Duration::from_secs(10);

    /// Asserts that `policy`, at `NOW` and with missed instants `due_at`,
    /// fires `fire` and skips `skipped` (instants as times of 2026-07-26 UTC).
    #[track_caller]
    fn assert_decides(policy: MisfirePolicy, due_at: &[&str], fire: &[&str], skipped: u64) {
        let day = |t: &&str| format!("2026-07-26T{t}Z");
        let due_at: Vec<String> = due_at.iter().map(day).collect();
        let fire: Vec<String> = fire.iter().map(day).collect();
        let d = due(&due_at.iter().map(String::as_str).collect::<Vec<_>>());
        let want = decision(
            &fire.iter().map(String::as_str).collect::<Vec<_>>(),
            skipped,
        );
        assert_eq!(policy.decide(&d, at(NOW), T), want);
    }

    #[test]
    fn skip_fires_only_on_time_instants() {
        let due_at = ["02:59:00", "03:00:00", "03:00:25"];
        assert_decides(MisfirePolicy::Skip, &due_at, &["03:00:25"], 2);
    }

    #[test]
    fn fire_once_fires_the_latest_missed_when_nothing_is_on_time() {
        let due_at = ["02:58:00", "02:59:00", "03:00:00"];
        assert_decides(MisfirePolicy::FireOnce, &due_at, &["03:00:00"], 2);
        let due_at = ["02:59:00", "03:00:25"];
        assert_decides(MisfirePolicy::FireOnce, &due_at, &["03:00:25"], 1);
    }

    #[test]
    fn catch_up_fires_inside_the_window_up_to_the_cap() {
        let policy = MisfirePolicy::CatchUp {
            window: Duration::from_secs(1800),
            max: 2,
        };
        let due_at = ["01:00:00", "02:40:00", "02:50:00", "02:59:00"];
        assert_decides(policy, &due_at, &["02:50:00", "02:59:00"], 2);
    }

    #[test]
    fn long_gaps_are_counted_without_walking_them() {
        let every = schedule(None, Some("1s"));
        let started = std::time::Instant::now();
        let d = due_in(&every, "2026-01-01T00:00:00Z", "2026-07-01T00:00:00Z", 3);
        assert_eq!(d.total, 181 * 86_400);
        assert_eq!(d.latest.last(), Some(&at("2026-07-01T00:00:00Z")));
        let cron = schedule(Some("* * * * * *"), None);
        let d = due_in(&cron, "2026-06-30T00:00:00Z", "2026-07-01T00:00:00Z", 3);
        assert_eq!(d.total, 86_400);
        assert_eq!(
            d.latest,
            [
                at("2026-06-30T23:59:58Z"),
                at("2026-06-30T23:59:59Z"),
                at("2026-07-01T00:00:00Z")
            ]
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn a_daily_fire_missed_long_ago_is_still_found() {
        let daily = schedule(Some("0 0 3 * * *"), None);
        let d = due_in(&daily, "2026-07-26T02:00:00Z", "2026-07-26T10:00:00Z", 64);
        assert_eq!(
            (d.total, d.latest.clone()),
            (1, vec![at("2026-07-26T03:00:00Z")])
        );
        let r = MisfirePolicy::FireOnce.decide(&d, at("2026-07-26T10:00:00Z"), T);
        assert_eq!(r.fire, [at("2026-07-26T03:00:00Z")]);
    }

    #[test]
    fn counts_beyond_what_is_kept() {
        let s = schedule(None, Some("1s"));
        let d = due_in(&s, "2026-07-26T00:00:00Z", "2026-07-26T01:00:00Z", 2);
        assert_eq!(d.total, 3600);
        assert_eq!(
            d.latest,
            [at("2026-07-26T00:59:59Z"), at("2026-07-26T01:00:00Z")]
        );
        let r = MisfirePolicy::FireOnce.decide(&d, at("2026-07-26T01:05:00Z"), T);
        assert_eq!((r.fire.len(), r.skipped), (1, 3599));
    }
}
