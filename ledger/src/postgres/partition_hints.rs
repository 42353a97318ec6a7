//! Which partition a run lives in, as the database said: the `key_instant`
//! of runs this process claimed or started, so the statements that find
//! them again by id can name their partition.
//!
//! A statement on the partitioned `job_runs` that finds rows by id alone
//! is planned over every partition (each one's indexes, constraints and
//! triggers) and probes each of them; Postgres plans such a statement
//! afresh at most executions (a generic plan over every partition looks
//! dearer to it), so the planning is paid every time: on a worker this
//! halved throughput (BENCHMARKS.md, "The worker on the partitioned
//! ledger"). With the ids' partition keys bound as values (`key_instant =
//! ANY($n)`), Postgres prunes every other partition while planning.
//!
//! A hint is only ever a value the database returned for that id (from the
//! claim's or the start's `RETURNING`), and a run's `key_instant` never
//! changes (a CHECK ties it to the run's key), so a hint cannot exclude the
//! row it names. A statement uses hints only when every id it touches has
//! one; otherwise it binds `NULL` and runs over all partitions as before.
//! The map is bounded: past [`MAX_HINTS`] it is emptied (hints are an
//! optimisation, losing them costs only planning time).

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Most hints kept. A worker holds a hint from an attempt's start to its
/// end, a scheduler from a claim to its dispatch: far fewer than this.
const MAX_HINTS: usize = 100_000;

/// Run id to `key_instant`, for runs this process claimed or started.
#[derive(Debug, Default)]
pub(crate) struct PartitionHints {
    known: Mutex<HashMap<Uuid, DateTime<Utc>>>,
}

impl PartitionHints {
    /// Remembers the partition keys the database returned for `rows`.
    pub(crate) fn remember(&self, rows: impl IntoIterator<Item = (Uuid, DateTime<Utc>)>) {
        // Held only for map operations, never across an await.
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        for (id, instant) in rows {
            if known.len() >= MAX_HINTS {
                known.clear();
            }
            known.insert(id, instant);
        }
    }

    /// The distinct partition keys of `ids` when every one is known; `None`
    /// (search every partition) otherwise.
    pub(crate) fn of(&self, ids: impl IntoIterator<Item = Uuid>) -> Option<Vec<DateTime<Utc>>> {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let instants = ids
            .into_iter()
            .map(|id| known.get(&id).copied())
            .collect::<Option<Vec<_>>>()?;
        Some(distinct(instants))
    }

    /// Forgets `ids` (their runs were dispatched or their attempt ended).
    pub(crate) fn forget(&self, ids: impl IntoIterator<Item = Uuid>) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            known.remove(&id);
        }
    }
}

/// `instants` once each: the values a statement binds as `key_instant =
/// ANY(...)`.
pub(crate) fn distinct(mut instants: Vec<DateTime<Utc>>) -> Vec<DateTime<Utc>> {
    instants.sort_unstable();
    instants.dedup();
    instants
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_only_when_every_id_is_known() {
        let hints = PartitionHints::default();
        let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let day = DateTime::from_timestamp(1_780_000_000, 0).unwrap();
        hints.remember([(a, day), (b, day)]);
        assert_eq!(hints.of([a, b]), Some(vec![day]), "distinct instants");
        assert_eq!(hints.of([a, c]), None, "one unknown id: no hint");
        hints.forget([a]);
        assert_eq!(hints.of([a]), None);
        assert_eq!(hints.of([b]), Some(vec![day]));
    }
}
