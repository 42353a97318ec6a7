//! The clock-skew guard: a replica whose clock disagrees with the
//! database's by more than a threshold stops claiming until it agrees again.
//!
//! Run keys come from schedules, not clocks, so skew cannot create
//! duplicates; but a replica whose clock runs ahead would claim fires early
//! (its jobs run before their time) and one that runs behind fires late.
//! The database's `now()` is the common reference every replica can read.
//! The guard compares it with this replica's clock (correcting for the
//! round trip), and while the difference exceeds the threshold fires are not
//! claimed here (other replicas claim them; missed ones go through the
//! misfire policy once the clock is back). An error is logged at every check
//! while it lasts, and each time the guard starts refusing a
//! `replica.clock_guard` alert event is recorded (retried at the next check
//! while the ledger cannot take it).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use belfry_ledger::{AlertKind, Ledger, LedgerError, NewAlertEvent};
use belfry_runtime::SharedClock;

/// Compares this replica's clock with the database's.
#[derive(Debug)]
pub struct ClockGuard {
    threshold: chrono::Duration,
    skewed: AtomicBool,
    last_skew_ms: AtomicI64,
    /// The replica's name, for its alert.
    instance: String,
    /// A `replica.clock_guard` alert event is still to be recorded.
    alert_due: AtomicBool,
    /// When (this clock, ms) the refusal the event is about began: its
    /// dedupe key, so a retried insert whose first try did commit is
    /// recorded once.
    refused_since_ms: AtomicI64,
}

impl ClockGuard {
    /// A guard that stops claims past `threshold` of skew.
    pub fn new(threshold: Duration) -> Self {
        Self {
            threshold: chrono::Duration::from_std(threshold).unwrap_or(chrono::Duration::MAX),
            skewed: AtomicBool::new(false),
            last_skew_ms: AtomicI64::new(0),
            instance: String::new(),
            alert_due: AtomicBool::new(false),
            refused_since_ms: AtomicI64::new(0),
        }
    }

    /// The same guard, naming replica `instance` in its alerts.
    pub fn for_instance(self, instance: &str) -> Self {
        Self {
            instance: instance.to_owned(),
            ..self
        }
    }

    /// Whether claims are allowed (the last check was within the threshold).
    pub fn allows_claims(&self) -> bool {
        !self.skewed.load(Ordering::Relaxed)
    }

    /// The skew measured last (this clock minus the database's), in ms.
    pub fn last_skew_ms(&self) -> i64 {
        self.last_skew_ms.load(Ordering::Relaxed)
    }

    /// Measures the skew once and updates the guard.
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when the database cannot be asked; the guard keeps
    /// its previous state.
    pub async fn check_once(
        &self,
        ledger: &Ledger,
        clock: &SharedClock,
    ) -> Result<chrono::Duration, LedgerError> {
        let (before, db, after) = ledger.clock_probe(&|| clock.now()).await?;
        let round_trip = after - before;
        if round_trip > self.threshold / 2 {
            // Too slow to tell skew from latency: keep the last verdict.
            tracing::debug!(
                round_trip_ms = round_trip.num_milliseconds(),
                "clock check round trip too slow; ignored"
            );
            return Ok(chrono::Duration::milliseconds(self.last_skew_ms()));
        }
        // The database read its clock somewhere in the round trip: compare
        // with the middle of it.
        let skew = (before + round_trip / 2) - db;
        self.last_skew_ms
            .store(skew.num_milliseconds(), Ordering::Relaxed);
        let too_far = skew.abs() > self.threshold;
        let was = self.skewed.swap(too_far, Ordering::Relaxed);
        if too_far {
            tracing::error!(
                skew_ms = skew.num_milliseconds(),
                threshold_ms = self.threshold.num_milliseconds(),
                "this replica's clock differs from the database's beyond the threshold; not claiming fires until it is fixed (check NTP)"
            );
        } else if was {
            tracing::info!(
                skew_ms = skew.num_milliseconds(),
                "clock back within the threshold; claiming again"
            );
        }
        if too_far && !was {
            self.refused_since_ms
                .store(before.timestamp_millis(), Ordering::Relaxed);
            self.alert_due.store(true, Ordering::Relaxed);
        }
        if self.alert_due.load(Ordering::Relaxed) {
            self.record_alert(ledger, skew).await;
        }
        Ok(skew)
    }

    /// Records the `replica.clock_guard` event of the refusal that began;
    /// on failure it stays due for the next check.
    async fn record_alert(&self, ledger: &Ledger, skew: chrono::Duration) {
        let event = NewAlertEvent {
            kind: AlertKind::ReplicaClockGuard,
            subject: format!("replica:{}", self.instance),
            job_name: None,
            detail: format!(
                "replica {} stopped claiming fires: its clock differs from the database's by {} ms \
                 (threshold {} ms); other replicas claim them meanwhile (check NTP on its host)",
                self.instance,
                skew.num_milliseconds(),
                self.threshold.num_milliseconds()
            ),
            channel: None,
            dedupe_key: Some(format!(
                "replica.clock_guard:{}:{}",
                self.instance,
                self.refused_since_ms.load(Ordering::Relaxed)
            )),
        };
        match ledger.record_alert(&event).await {
            Ok(_) => self.alert_due.store(false, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(error = %e, "cannot record the clock guard's alert yet; retrying at the next check")
            }
        }
    }

    /// Checks every `interval` until `cancel`.
    pub async fn run(
        &self,
        ledger: &Ledger,
        clock: &SharedClock,
        interval: Duration,
        cancel: CancellationToken,
    ) {
        loop {
            if let Err(e) = self.check_once(ledger, clock).await {
                tracing::warn!(error = %e, "clock check failed; keeping the previous verdict");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}
