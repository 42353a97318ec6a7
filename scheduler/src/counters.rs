//! Counters of what happened to fires on this replica, and how they are
//! exported as Prometheus metrics.
//!
//! Plain atomics: cheap on the hot path and readable by tests; the
//! [`Collector`] implementation reads them at scrape time, so nothing is
//! counted twice. The two latency histograms are `prometheus-client`
//! histograms.

use std::sync::atomic::{AtomicU64, Ordering};

use belfry_runtime::metrics::{
    encode_counter, encode_labeled_counter, encode_metric, latency_buckets,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::histogram::Histogram;

/// Per-replica fire counters. All counts only grow.
#[derive(Debug)]
pub struct FireCounters {
    /// Fires handed to claiming.
    pub fires: AtomicU64,
    /// Fires this replica won (row inserted).
    pub claims_won: AtomicU64,
    /// Fires lost at the Redis lock (another replica holds it).
    pub claims_lost_lock: AtomicU64,
    /// Fires lost at the ledger insert (row already there).
    pub claims_lost_ledger: AtomicU64,
    /// Lock errors that fell back to database-only claiming.
    pub lock_fallbacks: AtomicU64,
    /// Fires that could not be claimed at all (ledger unreachable).
    pub claim_errors: AtomicU64,
    /// Publishes the broker confirmed.
    pub published: AtomicU64,
    /// Publishes returned as unroutable (no group serves the type).
    pub unroutable: AtomicU64,
    /// Publishes that failed or were nacked; the run stays `claimed`.
    pub publish_errors: AtomicU64,
    /// Missed fires skipped by misfire policies.
    pub misfires_skipped: AtomicU64,
    /// Missed fires fired late by misfire policies (recovery).
    pub misfires_recovered: AtomicU64,
    /// Misfire recoveries finished (at start, of taken shards, of a
    /// resumed schedule).
    pub recoveries: AtomicU64,
    /// Timer fires that waited for their schedule's misfire recovery.
    pub waited_for_recovery: AtomicU64,
    /// Fires skipped because the previous run was unfinished (overlap =
    /// skip, or buffer_one with a fire already buffered).
    pub skipped_overlap: AtomicU64,
    /// Fires not claimed because their schedule has no `remaining_runs`
    /// left.
    pub skipped_ran_out: AtomicU64,
    /// Fires held `buffered` by their overlap policy.
    pub buffered: AtomicU64,
    /// Buffered runs released to the outbox once their schedule's previous
    /// run ended.
    pub released: AtomicU64,
    /// Follow-up runs enqueued once their parent ended.
    pub follow_ups: AtomicU64,
    /// Fires not claimed because this replica's clock is skewed.
    pub skipped_clock_skew: AtomicU64,
    /// Runs reported stuck (no progress past the deadline).
    pub stuck_runs: AtomicU64,
    /// Runs the outbox reconciler published again (same message id).
    pub republished: AtomicU64,
    /// Seconds from claim to the broker's confirm of a fire's publish.
    pub publish_seconds: Histogram,
    /// Seconds from a fire's scheduled instant to its confirmed publish.
    pub lateness_seconds: Histogram,
}

impl Default for FireCounters {
    fn default() -> Self {
        Self {
            fires: AtomicU64::default(),
            claims_won: AtomicU64::default(),
            claims_lost_lock: AtomicU64::default(),
            claims_lost_ledger: AtomicU64::default(),
            lock_fallbacks: AtomicU64::default(),
            claim_errors: AtomicU64::default(),
            published: AtomicU64::default(),
            unroutable: AtomicU64::default(),
            publish_errors: AtomicU64::default(),
            misfires_skipped: AtomicU64::default(),
            misfires_recovered: AtomicU64::default(),
            recoveries: AtomicU64::default(),
            waited_for_recovery: AtomicU64::default(),
            skipped_overlap: AtomicU64::default(),
            skipped_ran_out: AtomicU64::default(),
            buffered: AtomicU64::default(),
            released: AtomicU64::default(),
            follow_ups: AtomicU64::default(),
            skipped_clock_skew: AtomicU64::default(),
            stuck_runs: AtomicU64::default(),
            republished: AtomicU64::default(),
            publish_seconds: Histogram::new(latency_buckets()),
            lateness_seconds: Histogram::new(latency_buckets()),
        }
    }
}

/// The replica's metrics, as `belfry_*` Prometheus series.
impl Collector for FireCounters {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let get = Self::get;
        encode_counter(
            &mut e,
            "belfry_fires",
            "Fires due on this replica (each is claimed, lost or skipped)",
            get(&self.fires),
        )?;
        encode_labeled_counter(
            &mut e,
            "belfry_claims",
            "Claim results: won (row inserted), lost at the Redis lock, lost at the ledger",
            "result",
            &[
                ("won", get(&self.claims_won)),
                ("lost_lock", get(&self.claims_lost_lock)),
                ("lost_ledger", get(&self.claims_lost_ledger)),
            ],
        )?;
        encode_counter(
            &mut e,
            "belfry_lock_errors",
            "Redis lock errors; each such fire was claimed through the database alone (fallback)",
            get(&self.lock_fallbacks),
        )?;
        encode_counter(&mut e, "belfry_claim_errors", "Fires that could not be claimed (ledger unreachable); the misfire policy decides later", get(&self.claim_errors))?;
        encode_labeled_counter(
            &mut e,
            "belfry_publishes",
            "Publishes of won fires by result",
            "result",
            &[
                ("confirmed", get(&self.published)),
                ("unroutable", get(&self.unroutable)),
                ("failed", get(&self.publish_errors)),
            ],
        )?;
        encode_labeled_counter(
            &mut e,
            "belfry_fires_skipped",
            "Fires not made, by reason",
            "reason",
            &[
                ("misfire", get(&self.misfires_skipped)),
                ("overlap", get(&self.skipped_overlap)),
                ("clock_skew", get(&self.skipped_clock_skew)),
                ("ran_out", get(&self.skipped_ran_out)),
            ],
        )?;
        encode_counter(
            &mut e,
            "belfry_fires_buffered",
            "Fires held by their overlap policy until the previous run ended",
            get(&self.buffered),
        )?;
        encode_counter(
            &mut e,
            "belfry_buffered_released",
            "Buffered runs released once their schedule's previous run ended",
            get(&self.released),
        )?;
        encode_counter(
            &mut e,
            "belfry_follow_ups_enqueued",
            "Follow-up runs enqueued once their parent ended",
            get(&self.follow_ups),
        )?;
        encode_counter(
            &mut e,
            "belfry_misfires_recovered",
            "Missed fires made late by a misfire policy",
            get(&self.misfires_recovered),
        )?;
        encode_counter(
            &mut e,
            "belfry_misfire_recoveries",
            "Misfire recoveries finished (at start, of taken shards, of a resumed schedule)",
            get(&self.recoveries),
        )?;
        encode_counter(
            &mut e,
            "belfry_fires_waited_for_recovery",
            "Timer fires that waited for their schedule's misfire recovery, then were decided with it",
            get(&self.waited_for_recovery),
        )?;
        encode_counter(
            &mut e,
            "belfry_reconciler_republished",
            "Claimed runs the outbox reconciler published again",
            get(&self.republished),
        )?;
        encode_counter(
            &mut e,
            "belfry_stuck_runs",
            "Runs reported stuck (no progress past BELFRY_STUCK_AFTER)",
            get(&self.stuck_runs),
        )?;
        encode_metric(
            &mut e,
            "belfry_publish_latency_seconds",
            "Claim to broker confirm of a fire's publish",
            &self.publish_seconds,
        )?;
        encode_metric(
            &mut e,
            "belfry_fire_lateness_seconds",
            "Scheduled instant to broker confirm of a fire's publish",
            &self.lateness_seconds,
        )?;
        Ok(())
    }
}

impl FireCounters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads one counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
