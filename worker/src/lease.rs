//! Attempt leases kept alive by a heartbeat.
//!
//! A running attempt owns its run until `job_runs.lease_until`; a delivery
//! of the same run arriving elsewhere waits until then, and takes the run
//! over once the lease has expired. The lease is short (`BELFRY_LEASE`, 20 s
//! by default) whatever the job's timeout, and this worker renews the leases
//! of all its running attempts every quarter of it, in one statement per
//! interval however many attempts run. So when a worker dies (`kill -9`, a
//! lost host), its runs are taken over about one lease after its death, not
//! after the attempt timeout.
//!
//! The other half of the bargain: a worker that cannot renew (Postgres
//! unreachable, this process stalled) must stop its handlers before their
//! leases can expire, or a run could execute on two workers at once. Each
//! attempt remembers when the statement of its last successful renewal was
//! sent (its begin, at first); the database set the lease from a later
//! instant, so the lease cannot end before `sent + lease`. Once
//! `sent + lease - interval` has passed without a newer success, the
//! attempt's interrupt token is cancelled: the handler is told through its
//! `JobContext` token, given 200 ms, then aborted (see `crate::attempt`),
//! and the run handed back. An attempt the heartbeat finds no longer holding
//! its run (its lease was taken over while this worker was stopped) is
//! interrupted the same way at once. What cannot be stopped is code that
//! never yields (a blocking call inside an async handler): it runs until it
//! returns, and its outcome is then refused by the attempt guard.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use belfry_ledger::Ledger;

/// Default lease of a running attempt.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(20);

/// One running attempt of this worker.
#[derive(Debug)]
struct Held {
    interrupt: CancellationToken,
    /// When the statement that last extended the lease was sent.
    renewed: Instant,
}

/// The leases of this worker's running attempts. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Leases {
    lease: Duration,
    held: Arc<Mutex<HashMap<(Uuid, i32), Held>>>,
}

/// Holds one attempt's lease while it runs; dropping it stops renewing.
#[derive(Debug)]
pub struct LeaseGuard {
    key: (Uuid, i32),
    held: Arc<Mutex<HashMap<(Uuid, i32), Held>>>,
    interrupt: CancellationToken,
}

impl LeaseGuard {
    /// Cancelled when the attempt must stop: the worker's hard stop, or the
    /// lease could not be renewed in time or was taken over.
    pub fn interrupt(&self) -> &CancellationToken {
        &self.interrupt
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

impl Leases {
    /// Leases of `lease` each (at least 1 s).
    pub fn new(lease: Duration) -> Self {
        Self {
            lease: lease.max(Duration::from_secs(1)),
            held: Arc::default(),
        }
    }

    /// The lease an attempt is given at its start and at each renewal.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How often leases are renewed: a quarter of the lease, so three
    /// renewals in a row may fail before an attempt has to stop.
    pub fn interval(&self) -> Duration {
        self.lease / 4
    }

    /// Starts keeping attempt `attempt` of run `id`, whose lease was set by
    /// a statement sent at `sent`; its interrupt token is a child of
    /// `hard_stop`.
    pub fn hold(
        &self,
        id: Uuid,
        attempt: i32,
        sent: Instant,
        hard_stop: &CancellationToken,
    ) -> LeaseGuard {
        let interrupt = hard_stop.child_token();
        self.held.lock().unwrap_or_else(|p| p.into_inner()).insert(
            (id, attempt),
            Held {
                interrupt: interrupt.clone(),
                renewed: sent,
            },
        );
        LeaseGuard {
            key: (id, attempt),
            held: self.held.clone(),
            interrupt,
        }
    }

    /// Running attempts held now.
    pub fn len(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no attempt is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One heartbeat: renews every held lease in one statement, interrupts
    /// the attempts that no longer hold their run, then interrupts those
    /// whose lease could end before the next renewal. Returns how many were
    /// interrupted.
    pub async fn renew_once(&self, ledger: &Ledger) -> usize {
        let keys: Vec<(Uuid, i32)> = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        let mut interrupted = 0;
        if !keys.is_empty() {
            let sent = Instant::now();
            match ledger.renew_leases(&keys, self.lease).await {
                Ok(renewed) => {
                    let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                    for key in &keys {
                        // A key gone from `held` finished meanwhile.
                        let Some(h) = held.get_mut(key) else { continue };
                        if renewed.contains(key) {
                            h.renewed = sent;
                        } else if !h.interrupt.is_cancelled() {
                            tracing::warn!(id = %key.0, attempt = key.1,
                                "attempt no longer holds its run (its lease was taken over); interrupting it");
                            h.interrupt.cancel();
                            interrupted += 1;
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, attempts = keys.len(),
                    "cannot renew the leases of running attempts; they stop before the leases can expire"),
            }
        }
        interrupted + self.interrupt_expiring(Instant::now())
    }

    /// Interrupts every attempt whose lease may end within one interval of
    /// `now` (no renewal succeeded for `lease - interval`).
    fn interrupt_expiring(&self, now: Instant) -> usize {
        let deadline = self.lease.saturating_sub(self.interval());
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        for (key, h) in held.iter() {
            if now.saturating_duration_since(h.renewed) >= deadline && !h.interrupt.is_cancelled() {
                tracing::error!(id = %key.0, attempt = key.1, lease = ?self.lease,
                    "lease not renewed in time; interrupting the attempt so it never runs on two workers");
                h.interrupt.cancel();
                n += 1;
            }
        }
        n
    }

    /// Renews every [`Leases::interval`] until `stop`, and checks for
    /// leases that could expire four times as often. A renewal runs as its
    /// own task: a statement that hangs (Postgres unreachable, a held
    /// connection) must not hold up the check that stops handlers in time.
    pub async fn run(&self, ledger: Ledger, stop: CancellationToken) {
        let mut renew = tokio::time::interval(self.interval());
        let mut check = tokio::time::interval((self.interval() / 4).max(Duration::from_millis(50)));
        // A late tick (this process was stalled) runs at once, then keeps
        // the rhythm; a burst of ticks would only repeat the work.
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewing: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            // Stop first; then the expiry check, which must never wait
            // behind a renewal.
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = check.tick() => {
                    self.interrupt_expiring(Instant::now());
                }
                _ = renew.tick() => {
                    if renewing.as_ref().is_some_and(|h| !h.is_finished()) {
                        // The previous statement has not answered: one at a
                        // time, and the check above stops what it must.
                        continue;
                    }
                    let this = self.clone();
                    let ledger = ledger.clone();
                    renewing = Some(tokio::spawn(async move {
                        this.renew_once(&ledger).await;
                    }));
                }
            }
        }
        if let Some(h) = renewing {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_not_renewed_for_three_quarters_of_its_lease_is_interrupted() {
        let leases = Leases::new(Duration::from_secs(20));
        assert_eq!(leases.interval(), Duration::from_secs(5));
        let stop = CancellationToken::new();
        let start = Instant::now();
        let guard = leases.hold(Uuid::nil(), 1, start, &stop);
        assert_eq!(
            leases.interrupt_expiring(start + Duration::from_secs(14)),
            0
        );
        assert!(!guard.interrupt().is_cancelled());
        assert_eq!(
            leases.interrupt_expiring(start + Duration::from_secs(15)),
            1
        );
        assert!(guard.interrupt().is_cancelled());
        assert!(!stop.is_cancelled(), "only the attempt stops");
        drop(guard);
        assert!(leases.is_empty());
    }

    #[test]
    fn the_hard_stop_interrupts_every_attempt() {
        let leases = Leases::new(Duration::from_secs(20));
        let stop = CancellationToken::new();
        let a = leases.hold(Uuid::nil(), 1, Instant::now(), &stop);
        let b = leases.hold(Uuid::max(), 2, Instant::now(), &stop);
        stop.cancel();
        assert!(a.interrupt().is_cancelled() && b.interrupt().is_cancelled());
    }
}
