//! Which day partition of `job_runs` holds a partition key, so the
//! worker's batched statements can be written against that partition's
//! table instead of the partitioned parent.
//!
//! Even with its partition keys bound (`partition_hints`), a statement on
//! the parent costs Postgres its partition machinery at every execution:
//! planning an `UPDATE` of the parent with plan-time pruning took about
//! 1.5 ms where the same `UPDATE` of the day's table took 0.55 ms, and the
//! parent's plan ran slower too (0.8 vs 0.5 ms for five rows; measured
//! with `EXPLAIN ANALYZE` on this machine, BENCHMARKS.md "The worker
//! writes to the day's table"). On a plain table Postgres may also settle
//! on a generic plan and stop planning altogether, which the parent's
//! plans cannot do without locking every partition at each execution.
//!
//! The map is the catalog's list of day partitions, read at most once a
//! [`REFRESH`] and again after a statement named a table that no longer
//! exists. It can only be stale in ways that cost speed, never a result:
//! day partitions are created (for days no day partition covered) and
//! dropped whole, never re-bounded, so a table the map names for a key
//! either holds every row of that key or is gone; the callers re-run on
//! the parent what the day's table did not settle (a row not found, or
//! the table dropped), so even a wrong map could only slow a statement.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::run_partitions::RunPartition;

/// Longest a read of the catalog is used. Days are created days ahead, so
/// a day's table is in the map long before its runs are written; the
/// refresh only picks up days created while this process ran.
pub(crate) const REFRESH: Duration = Duration::from_secs(60);

/// The parent table: what a statement names when no single day's table
/// holds all its rows.
pub(crate) const PARENT: &str = "job_runs";

/// Day partitions by their bounds, as last read from the catalog.
#[derive(Debug, Default)]
pub(crate) struct PartitionMap {
    state: Mutex<Option<Loaded>>,
}

#[derive(Debug)]
struct Loaded {
    at: Instant,
    /// `(from, to, table)`, sorted by `from`; day partitions only.
    days: Vec<(DateTime<Utc>, DateTime<Utc>, String)>,
}

/// What the map says about a statement's partition keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Every key lies in this day's table.
    Table(String),
    /// The keys span several tables, or one no day partition covers: the
    /// statement names the parent.
    Parent,
    /// The map is older than [`REFRESH`] (or was never read): read the
    /// catalog, [`PartitionMap::store`] it and ask again.
    Stale,
}

impl PartitionMap {
    /// The one day table holding every key of `instants`, if there is one.
    pub(crate) fn lookup(&self, instants: &[DateTime<Utc>], now: Instant) -> Lookup {
        // Held only for the search, never across an await.
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(loaded) = state.as_ref() else {
            return Lookup::Stale;
        };
        if now.saturating_duration_since(loaded.at) >= REFRESH {
            return Lookup::Stale;
        }
        let mut found: Option<&str> = None;
        for at in instants {
            // The last day starting at or before `at`.
            let i = loaded.days.partition_point(|(from, _, _)| from <= at);
            let Some((_, to, table)) = i.checked_sub(1).and_then(|i| loaded.days.get(i)) else {
                return Lookup::Parent;
            };
            if at >= to || found.is_some_and(|f| f != table) {
                return Lookup::Parent;
            }
            found = Some(table);
        }
        found.map_or(Lookup::Parent, |t| Lookup::Table(t.to_owned()))
    }

    /// Keeps `partitions` (the catalog's list, read at `at`) as the map.
    /// Only day partitions whose name is a plain identifier are kept: the
    /// name is written into statements.
    pub(crate) fn store(&self, partitions: Vec<RunPartition>, at: Instant) {
        let mut days: Vec<_> = partitions
            .into_iter()
            .filter(|p| !p.default && is_plain_identifier(&p.name))
            .filter_map(|p| Some((p.from?, p.to?, p.name)))
            .collect();
        days.sort_by_key(|(from, _, _)| *from);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *state = Some(Loaded { at, days });
    }

    /// Forgets the map: a statement found a table it named gone.
    pub(crate) fn invalidate(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *state = None;
    }
}

/// Lower-case letters, digits and `_`, not starting with a digit: safe to
/// write into a statement unquoted (the day partitions are `job_runs_p`
/// and a date).
fn is_plain_identifier(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(d: u32, h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, d, h, 0, 0).unwrap()
    }

    fn day(d: u32) -> RunPartition {
        RunPartition {
            name: format!("job_runs_p202612{d:02}"),
            from: Some(at(d, 0)),
            to: Some(at(d + 1, 0)),
            default: false,
        }
    }

    fn map() -> (PartitionMap, Instant) {
        let m = PartitionMap::default();
        let now = Instant::now();
        let keyed = RunPartition {
            name: "job_runs_keyed".into(),
            from: None,
            to: Some(Utc.with_ymd_and_hms(1970, 1, 2, 0, 0, 0).unwrap()),
            default: false,
        };
        let default = RunPartition {
            name: "job_runs_default".into(),
            from: None,
            to: None,
            default: true,
        };
        let odd = RunPartition {
            name: "Job Runs; DROP".into(),
            ..day(9)
        };
        m.store(vec![day(4), keyed, day(3), default, odd, day(6)], now);
        (m, now)
    }

    #[test]
    fn one_day_table_only_when_every_key_is_in_it() {
        let (m, now) = map();
        let table = |t: &str| Lookup::Table(t.to_owned());
        assert_eq!(m.lookup(&[at(3, 0)], now), table("job_runs_p20261203"));
        assert_eq!(
            m.lookup(&[at(4, 1), at(4, 23)], now),
            table("job_runs_p20261204")
        );
        // Two days, a day without a table, before every day, the keyed
        // partition's range, a name that is not a plain identifier.
        assert_eq!(m.lookup(&[at(3, 23), at(4, 0)], now), Lookup::Parent);
        assert_eq!(m.lookup(&[at(5, 12)], now), Lookup::Parent);
        assert_eq!(m.lookup(&[at(2, 12)], now), Lookup::Parent);
        let ad_hoc = Utc.with_ymd_and_hms(1970, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(m.lookup(&[ad_hoc], now), Lookup::Parent);
        assert_eq!(m.lookup(&[at(9, 1)], now), Lookup::Parent);
        assert_eq!(m.lookup(&[], now), Lookup::Parent);
    }

    #[test]
    fn a_map_is_read_again_when_old_or_invalidated() {
        let (m, now) = map();
        assert_eq!(m.lookup(&[at(3, 0)], now + REFRESH), Lookup::Stale);
        m.invalidate();
        assert_eq!(m.lookup(&[at(3, 0)], now), Lookup::Stale);
        assert_eq!(
            PartitionMap::default().lookup(&[at(3, 0)], now),
            Lookup::Stale
        );
    }
}
