//! Counters of what this worker did with deliveries, and how they are
//! exported as Prometheus metrics.
//!
//! The totals are plain atomics (cheap, readable by tests) that the
//! [`Collector`] implementation reads at scrape time; per-job-type series
//! (jobs by outcome, attempts, durations) and the in-flight gauge are
//! `prometheus-client` families.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use belfry_runtime::metrics::{encode_counter, encode_metric, latency_buckets};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// Labels of a job series: its type, and for outcomes the outcome.
pub type JobLabels = Vec<(&'static str, String)>;

/// A histogram family keyed by job type.
pub type DurationFamily = Family<JobLabels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// Per-worker counters. All counts only grow.
#[derive(Debug)]
pub struct WorkerCounters {
    /// Deliveries taken from the queue.
    pub deliveries: AtomicU64,
    /// Handler attempts started.
    pub attempts: AtomicU64,
    /// Runs finished `succeeded`.
    pub succeeded: AtomicU64,
    /// Runs finished `failed`.
    pub failed: AtomicU64,
    /// Runs finished `dead`.
    pub dead: AtomicU64,
    /// Runs an operator cancelled while they ran here, finished
    /// `cancelled`.
    pub cancelled: AtomicU64,
    /// Messages published to the dead-letter queue.
    pub dead_lettered: AtomicU64,
    /// Deliveries of already finished runs, acked and dropped.
    pub duplicates: AtomicU64,
    /// Deliveries handed back to the broker (shutdown, ledger down, run
    /// held by another attempt).
    pub handed_back: AtomicU64,
    /// Retries whose back-off was handed to the ledger.
    pub deferred: AtomicU64,
    /// Deliveries of runs that found every slot of their concurrency
    /// limit taken (the runs wait in the ledger).
    pub limited: AtomicU64,
    /// Deliveries of runs that found their rate limit's window full (the
    /// runs wait in the ledger for their turn).
    pub rate_limited: AtomicU64,
    /// Attempts that lost their lease before recording.
    pub superseded: AtomicU64,
    /// Attempts interrupted because their lease could not be renewed in
    /// time or was taken over (see `crate::lease`).
    pub lease_lost: AtomicU64,
    /// Run log lines given up (the writer's queue was full, or a batch
    /// waited through a long outage): see `crate::run_log`.
    pub run_log_dropped: Arc<AtomicU64>,
    /// Run log lines written after their attempt's outcome (by a task the
    /// handler left running), not stored: see `crate::run_log`.
    pub run_log_late: Arc<AtomicU64>,
    /// Runs finished here, by job type and outcome (`succeeded`,
    /// `failed`, `dead`, `cancelled`, `deferred`, `handed_back`,
    /// `duplicate`, `superseded`, `waiting`).
    pub jobs: Family<JobLabels, Counter>,
    /// Attempts started, by job type.
    pub attempts_by_type: Family<JobLabels, Counter>,
    /// Attempt durations in seconds, by job type.
    pub durations: DurationFamily,
    /// Deliveries being processed now.
    pub in_flight: Gauge,
}

impl Default for WorkerCounters {
    fn default() -> Self {
        Self {
            deliveries: AtomicU64::default(),
            attempts: AtomicU64::default(),
            succeeded: AtomicU64::default(),
            failed: AtomicU64::default(),
            dead: AtomicU64::default(),
            cancelled: AtomicU64::default(),
            dead_lettered: AtomicU64::default(),
            duplicates: AtomicU64::default(),
            handed_back: AtomicU64::default(),
            deferred: AtomicU64::default(),
            limited: AtomicU64::default(),
            rate_limited: AtomicU64::default(),
            superseded: AtomicU64::default(),
            lease_lost: AtomicU64::default(),
            run_log_dropped: Arc::default(),
            run_log_late: Arc::default(),
            jobs: Family::default(),
            attempts_by_type: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            in_flight: Gauge::default(),
        }
    }
}

/// The worker's metrics, as `belfry_*` Prometheus series.
impl Collector for WorkerCounters {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let get = Self::get;
        encode_counter(
            &mut e,
            "belfry_deliveries",
            "Deliveries taken from the queue",
            get(&self.deliveries),
        )?;
        encode_counter(
            &mut e,
            "belfry_duplicate_deliveries_dropped",
            "Deliveries of runs already finished, acked without running",
            get(&self.duplicates),
        )?;
        encode_counter(
            &mut e,
            "belfry_dead_lettered",
            "Messages sent to the dead-letter queue",
            get(&self.dead_lettered),
        )?;
        encode_counter(
            &mut e,
            "belfry_handed_back",
            "Deliveries returned to the queue (shutdown, database down, run held elsewhere)",
            get(&self.handed_back),
        )?;
        encode_counter(
            &mut e,
            "belfry_concurrency_limit_waits",
            "Deliveries of runs whose concurrency limit was full; the runs wait in the ledger",
            get(&self.limited),
        )?;
        encode_counter(
            &mut e,
            "belfry_rate_limit_waits",
            "Deliveries of runs whose rate limit's window was full; the runs wait in the ledger for their turn",
            get(&self.rate_limited),
        )?;
        encode_counter(
            &mut e,
            "belfry_attempts_interrupted_lease_lost",
            "Attempts stopped because their lease could not be renewed in time or was taken over",
            get(&self.lease_lost),
        )?;
        encode_counter(
            &mut e,
            "belfry_run_log_lines_dropped",
            "Run log lines not stored: the writer's queue was full or a batch waited through a long outage",
            get(&self.run_log_dropped),
        )?;
        encode_counter(
            &mut e,
            "belfry_run_log_lines_late",
            "Run log lines written after their attempt's outcome (by a task the handler left running): not stored",
            get(&self.run_log_late),
        )?;
        encode_metric(
            &mut e,
            "belfry_jobs",
            "Runs processed, by job type and outcome",
            &self.jobs,
        )?;
        encode_metric(
            &mut e,
            "belfry_attempts",
            "Handler attempts started, by job type",
            &self.attempts_by_type,
        )?;
        encode_metric(
            &mut e,
            "belfry_attempt_duration_seconds",
            "Handler attempt durations, by job type",
            &self.durations,
        )?;
        encode_metric(
            &mut e,
            "belfry_jobs_in_flight",
            "Deliveries being processed now",
            &self.in_flight,
        )?;
        Ok(())
    }
}

impl WorkerCounters {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads one counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
