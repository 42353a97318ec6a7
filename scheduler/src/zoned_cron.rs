//! A cron expression read in an IANA time zone, with one documented rule
//! for daylight-saving transitions (the Vixie cron / Cronos rule):
//!
//! - **Spring forward** (a local time that does not exist): a fire whose
//!   local time falls in the gap happens once, at the first instant after
//!   the gap (`0 30 2 * * *` in New York on 2026-03-08 fires at 03:00 EDT).
//! - **Fall back, fixed hour** (a local time that occurs twice): the fire
//!   happens once, at the first occurrence (`0 30 1 * * *` in New York on
//!   2026-11-01 fires at 01:30 EDT, not again at 01:30 EST).
//! - **Fall back, hour `*` or a step** (`*/15 * * * *`, `0 * * * *`,
//!   `0 */2 * * *`, `@hourly`): these count elapsed time, so they fire on
//!   both passes of the repeated hour.
//!
//! Interval schedules live in absolute time and are not affected.
//!
//! `croner` already does the first two (it works on wall-clock time and
//! maps a repeated local time to its first instant, a skipped one forward).
//! It never yields second-pass instants, and when asked from inside the
//! second pass it returns a first-pass instant that is already in the past.
//! [`ZonedCron::next_after`] corrects both: it finds a fall-back transition
//! near the start instant by bisecting the zone's UTC offset, resumes after
//! the repeated hour when croner answered with the past, and for `*`/step
//! hours evaluates the expression on the post-transition fixed offset to get
//! the second pass.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex};

use chrono::{DateTime, Duration, FixedOffset, Offset, SubsecRound, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;

/// Longer than any repeated period in the tz database (2 h, Antarctica/Troll).
const FOLD_WINDOW: i64 = 3 * 3600;

/// Most parsed expressions kept in memory at once, process-wide.
const PARSED_CAPACITY: usize = 16_384;

/// Parsed expressions, shared by every schedule of the process and bounded.
///
/// croner's parsed form of one expression takes about 350 bytes. Keeping it
/// per schedule would make a million idle schedules with distinct
/// expressions cost 350 MB; instead a schedule keeps its text and the parsed
/// form lives here while it is in use. A schedule whose form was evicted
/// (more than 16,384 distinct expressions in use) is parsed again when it
/// next fires, a few microseconds.
struct Parsed {
    map: HashMap<Arc<str>, Arc<Cron>>,
    order: VecDeque<Arc<str>>,
}

static PARSED: LazyLock<Mutex<Parsed>> = LazyLock::new(|| {
    Mutex::new(Parsed {
        map: HashMap::new(),
        order: VecDeque::new(),
    })
});

fn parse(expr: &str) -> Result<Arc<Cron>, croner::errors::CronError> {
    {
        // Held only for the lookup; parsing happens outside the lock.
        let cache = PARSED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.map.get(expr) {
            return Ok(c.clone());
        }
    }
    let cron = Arc::new(Cron::new(expr).with_seconds_optional().parse()?);
    let mut cache = PARSED.lock().unwrap_or_else(|p| p.into_inner());
    if !cache.map.contains_key(expr) {
        if cache.order.len() >= PARSED_CAPACITY {
            if let Some(old) = cache.order.pop_front() {
                cache.map.remove(&old);
            }
        }
        let key: Arc<str> = Arc::from(expr);
        cache.order.push_back(key.clone());
        cache.map.insert(key, cron.clone());
    }
    Ok(cron)
}

/// A cron expression in a time zone. Holds the expression's text; its
/// parsed form comes from a process-wide bounded cache.
#[derive(Debug, Clone)]
pub struct ZonedCron {
    expr: Box<str>,
    tz: Tz,
    wild_hour: bool,
}

/// Parsed expressions by (expression, zone), shared between schedules.
#[derive(Debug, Default)]
pub struct CronCache {
    parsed: HashMap<(String, Tz), Arc<ZonedCron>>,
}

impl CronCache {
    /// The parsed form of `expr` in `tz`, parsing it on first use.
    ///
    /// # Errors
    ///
    /// croner's error when `expr` is not a valid cron expression.
    pub fn get_or_parse(
        &mut self,
        expr: &str,
        tz: Tz,
    ) -> Result<Arc<ZonedCron>, croner::errors::CronError> {
        self.get_or_parse_fresh(expr, tz).map(|(z, _)| z)
    }

    /// As [`CronCache::get_or_parse`], also saying whether this call parsed
    /// it (checks needed once per expression can be skipped otherwise).
    ///
    /// # Errors
    ///
    /// croner's error when `expr` is not a valid cron expression.
    pub fn get_or_parse_fresh(
        &mut self,
        expr: &str,
        tz: Tz,
    ) -> Result<(Arc<ZonedCron>, bool), croner::errors::CronError> {
        if let Some(z) = self.parsed.get(&(expr.to_owned(), tz)) {
            return Ok((z.clone(), false));
        }
        let zoned = Arc::new(ZonedCron::parse(expr, tz)?);
        self.parsed.insert((expr.to_owned(), tz), zoned.clone());
        Ok((zoned, true))
    }
}

impl ZonedCron {
    /// Parses `expr` (6 fields with seconds, or 5) in `tz`.
    ///
    /// # Errors
    ///
    /// croner's error when `expr` is not a valid cron expression.
    pub fn parse(expr: &str, tz: Tz) -> Result<Self, croner::errors::CronError> {
        let cron = parse(expr)?;
        Ok(Self {
            expr: expr.into(),
            tz,
            wild_hour: hour_is_wild(&cron),
        })
    }

    /// The expression as written.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// Whether the hour field is `*` or a step (fires on both passes of a
    /// repeated hour).
    pub fn wild_hour(&self) -> bool {
        self.wild_hour
    }

    /// The first fire instant strictly after `t` (whole seconds), or `None`
    /// when the expression never matches again.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let t = t.trunc_subsecs(0);
        let mut from = t;
        // A skipped period longer than croner's one-hour search (2 h at
        // Antarctica/Troll) makes it fail; searching again from later finds
        // the fire after the gap.
        for _ in 0..3 {
            match self.next_after_checked(from, t) {
                Ok(next) => return Some(next),
                Err(croner::errors::CronError::InvalidTime) => from += Duration::hours(1),
                Err(_) => return None,
            }
        }
        None
    }

    fn next_after_checked(
        &self,
        from: DateTime<Utc>,
        t: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, croner::errors::CronError> {
        let tz = self.tz;
        let cron = parse(&self.expr)?;
        let mut best = cron
            .find_next_occurrence(&from.with_timezone(&tz), false)?
            .with_timezone(&Utc);
        if let Some((second_pass, len)) = find_fold(
            tz,
            t - Duration::seconds(FOLD_WINDOW),
            t + Duration::seconds(FOLD_WINDOW),
        ) {
            let second_pass_end = second_pass + len;
            if t < second_pass_end {
                if best <= t {
                    // `t` is in the second pass and croner answered with the
                    // first pass, which is past: everything of the repeated
                    // hour already fired then; resume after it.
                    best = cron
                        .find_next_occurrence(&second_pass_end.with_timezone(&tz), true)?
                        .with_timezone(&Utc);
                }
                if self.wild_hour {
                    // Second-pass fires: the same wall-clock matches on the
                    // offset in force after the transition.
                    let after: FixedOffset =
                        tz.offset_from_utc_datetime(&second_pass.naive_utc()).fix();
                    let start = t
                        .max(second_pass - Duration::seconds(1))
                        .with_timezone(&after);
                    let x = cron
                        .find_next_occurrence(&start, false)?
                        .with_timezone(&Utc);
                    if x < second_pass_end && x < best {
                        best = x;
                    }
                }
            }
        }
        Ok(best)
    }
}

/// The Vixie rule's test: the hour field, as croner normalised it (macros
/// expanded, `?` → `*`), starts with `*` or is a step.
fn hour_is_wild(cron: &Cron) -> bool {
    let fields: Vec<&str> = cron.as_str().split_whitespace().collect();
    fields
        .len()
        .checked_sub(4)
        .and_then(|i| fields.get(i))
        .is_some_and(|h| h.starts_with('*') || h.contains('/'))
}

fn offset(tz: Tz, t: DateTime<Utc>) -> i32 {
    tz.offset_from_utc_datetime(&t.naive_utc())
        .fix()
        .local_minus_utc()
}

/// A fall-back transition in `[lo, hi]`: the first instant of the second
/// pass and the length of the repeated period.
fn find_fold(tz: Tz, lo: DateTime<Utc>, hi: DateTime<Utc>) -> Option<(DateTime<Utc>, Duration)> {
    let (before, after) = (offset(tz, lo), offset(tz, hi));
    if before <= after {
        return None;
    }
    // Bisect to the second at which the offset drops (about 14 lookups).
    let (mut a, mut b) = (lo, hi);
    while b - a > Duration::seconds(1) {
        let m = a + (b - a) / 2;
        if offset(tz, m) == before {
            a = m;
        } else {
            b = m;
        }
    }
    Some((b, Duration::seconds(i64::from(before - after))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zc(expr: &str, tz: &str) -> ZonedCron {
        ZonedCron::parse(expr, tz.parse().unwrap()).unwrap()
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn fires(c: &ZonedCron, from: &str, until: &str) -> Vec<String> {
        let (mut t, end) = (at(from), at(until));
        let mut out = Vec::new();
        while let Some(n) = c.next_after(t) {
            if n > end {
                break;
            }
            assert!(n > t, "{n} is not after {t}");
            out.push(n.format("%Y-%m-%dT%H:%M:%SZ").to_string());
            t = n;
        }
        out
    }

    #[test]
    fn hour_field_classification() {
        for (e, wild) in [
            ("0 */15 * * * *", true),
            ("0 0 * * * *", true),
            ("@hourly", true),
            ("0 0 */2 * * *", true),
            ("0 30 1 * * *", false),
            ("0 15 1-2 * * *", false),
            ("30 1 * * *", false),
            ("@daily", false),
        ] {
            assert_eq!(zc(e, "UTC").wild_hour(), wild, "{e}");
        }
    }

    #[test]
    fn new_york_fall_back_fixed_hour_fires_once_at_the_first_occurrence() {
        // 2026-11-01 02:00 EDT → 01:00 EST (06:00Z); 01:30 occurs twice.
        // (The fires of those days: the New York rows of TRANSITIONS.)
        let c = zc("0 30 1 * * *", "America/New_York");
        // Asked from inside the second pass (a restart at 01:10 EST): the
        // next fire is tomorrow's, never the past first-pass instant.
        assert_eq!(
            c.next_after(at("2026-11-01T06:10:00Z")),
            Some(at("2026-11-02T06:30:00Z"))
        );
    }

    #[test]
    fn new_york_fall_back_wild_hour_fires_on_both_passes() {
        let c = zc("0 */15 * * * *", "America/New_York");
        assert_eq!(
            fires(&c, "2026-11-01T04:50:00Z", "2026-11-01T07:00:00Z"),
            [
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:15:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T05:45:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:15:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-01T06:45:00Z",
                "2026-11-01T07:00:00Z",
            ]
        );
        // From inside the second pass, the next second-pass instant.
        assert_eq!(
            c.next_after(at("2026-11-01T06:10:00Z")),
            Some(at("2026-11-01T06:15:00Z"))
        );
        let hourly = zc("@hourly", "America/New_York");
        assert_eq!(
            fires(&hourly, "2026-11-01T04:30:00Z", "2026-11-01T07:30:00Z"),
            [
                "2026-11-01T05:00:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T07:00:00Z"
            ]
        );
    }

    /// Each row: a rule, its zone, a span, and every fire in that span.
    #[rustfmt::skip]
    const TRANSITIONS: &[(&str, &str, &str, &str, &[&str])] = &[
        // New York: spring forward 2026-03-08 02:00 EST → 03:00 EDT (07:00Z): a
        // fixed 02:30 fires once, after the gap; fall back 2026-11-01 02:00
        // EDT → 01:00 EST (06:00Z): a fixed 01:30 fires once, at the first pass.
        ("0 30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", "2026-03-09T12:00:00Z", &["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
        ("0 30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", "2026-11-02T12:00:00Z", &["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
        // London: 2026-03-29 01:00 GMT → 02:00 BST; 2026-10-25 02:00 BST → 01:00 GMT.
        ("0 30 1 * * *", "Europe/London", "2026-03-28T12:00:00Z", "2026-03-30T12:00:00Z", &["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
        ("0 30 1 * * *", "Europe/London", "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z", &["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]),
        ("0 30 * * * *", "Europe/London", "2026-10-24T23:45:00Z", "2026-10-25T02:00:00Z", &["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"]),
        // Sydney: 2026-04-05 03:00 AEDT → 02:00 AEST (16:00Z on the 4th);
        // 2026-10-04 02:00 AEST → 03:00 AEDT (16:00Z on the 3rd).
        ("0 30 2 * * *", "Australia/Sydney", "2026-04-04T00:00:00Z", "2026-04-05T23:00:00Z", &["2026-04-04T15:30:00Z", "2026-04-05T16:30:00Z"]),
        ("0 30 2 * * *", "Australia/Sydney", "2026-10-03T00:00:00Z", "2026-10-04T23:00:00Z", &["2026-10-03T16:00:00Z", "2026-10-04T15:30:00Z"]),
        ("0 30 */1 * * *", "Australia/Sydney", "2026-04-04T14:45:00Z", "2026-04-04T17:00:00Z", &["2026-04-04T15:30:00Z", "2026-04-04T16:30:00Z"]),
    ];

    #[test]
    fn fixed_and_wild_hours_across_transitions() {
        for &(expr, tz, from, until, want) in TRANSITIONS {
            assert_eq!(
                fires(&zc(expr, tz), from, until),
                want,
                "{expr} in {tz} from {from}"
            );
        }
    }
}
