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
//!
//! The heartbeat's check is a task like any other, so it cannot by itself
//! stop a handler that a stalled process (SIGSTOP, a VM paused, a long GC
//! pause of the host) resumes first: after the stall, the handler's task
//! and the check become ready together, and the handler could take its
//! next step (send the request it was about to send) after its lease had
//! expired and another worker had taken the run over. So the handler's
//! future is also [`Fenced`]: before every poll it reads the monotonic
//! clock and the attempt's last renewal, and once the lease may have ended
//! it is never polled again. Whatever the handler does after a stall, it
//! does only while its lease surely holds.
//!
//! The heartbeat also carries operators' cancels: a held attempt's
//! [`CancelSignal`] fires when the cancel's announcement arrives
//! ([`Leases::request_cancel`]), or at the next renewal that finds the
//! request on the run's row, if the announcement was missed.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use belfry_ledger::Ledger;

use crate::job::JobError;

/// Default lease of a running attempt.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(20);

/// When the statement that last extended an attempt's lease was sent, as
/// nanoseconds from a base instant (negative: before it): written by the
/// heartbeat, read before every poll of the handler, so an atomic rather
/// than a lock.
#[derive(Debug)]
struct RenewedAt {
    base: Instant,
    nanos: AtomicI64,
}

impl RenewedAt {
    fn new(base: Instant, at: Instant) -> Self {
        let this = Self {
            base,
            nanos: AtomicI64::new(0),
        };
        this.set(at);
        this
    }

    fn set(&self, at: Instant) {
        let nanos = match at.checked_duration_since(self.base) {
            Some(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
            None => -i64::try_from((self.base - at).as_nanos()).unwrap_or(i64::MAX),
        };
        // Relaxed: the value is a single word read on its own; no other
        // memory is published through it.
        self.nanos.store(nanos, Ordering::Relaxed);
    }

    fn get(&self) -> Instant {
        let nanos = self.nanos.load(Ordering::Relaxed);
        let offset = Duration::from_nanos(nanos.unsigned_abs());
        if nanos >= 0 {
            self.base + offset
        } else {
            // An instant before `base` that `set` was given, so it exists.
            self.base.checked_sub(offset).unwrap_or(self.base)
        }
    }
}

/// How long a cancel announcement for a run this worker does not hold (yet)
/// is remembered: the announcement can overtake the attempt it is for, in
/// the instant between the attempt's start in the ledger and its
/// [`Leases::hold`].
const PENDING_CANCEL: Duration = Duration::from_secs(60);

/// An operator's cancel of a running attempt (see `belfry_ledger`'s
/// `cancel` module): the token the attempt watches, and whether the
/// handler gets no grace period.
#[derive(Debug, Clone, Default)]
pub struct CancelSignal {
    token: CancellationToken,
    immediate: Arc<AtomicBool>,
    /// Fired by an immediate cancel: ends a grace already running.
    abandon: CancellationToken,
}

impl CancelSignal {
    /// Cancelled when an operator cancelled the run.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Whether the cancel asks for no grace period.
    pub fn immediate(&self) -> bool {
        self.immediate.load(Ordering::Relaxed)
    }

    /// Cancelled by an immediate cancel, even one that comes while the
    /// grace of an earlier cancel runs.
    pub fn abandon(&self) -> &CancellationToken {
        &self.abandon
    }

    fn fire(&self, immediate: bool) {
        // The flag first, then the tokens: whoever wakes on a token reads
        // the flag as set.
        if immediate {
            self.immediate.store(true, Ordering::Relaxed);
            self.abandon.cancel();
        }
        self.token.cancel();
    }
}

/// One running attempt of this worker.
#[derive(Debug)]
struct Held {
    interrupt: CancellationToken,
    cancel: CancelSignal,
    renewed: Arc<RenewedAt>,
    /// Set once the handler has returned: the attempt is recording its
    /// outcome, and a renewal that misses the row saw that record.
    ending: Arc<AtomicBool>,
}

/// The leases of this worker's running attempts. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Leases {
    lease: Duration,
    /// The instant renewal times are counted from.
    base: Instant,
    held: Arc<Mutex<HashMap<(Uuid, i32), Held>>>,
    /// Cancel announcements of runs not held (yet): run, when, immediate.
    pending_cancels: Arc<Mutex<HashMap<Uuid, (Instant, bool)>>>,
}

/// Holds one attempt's lease while it runs; dropping it stops renewing.
#[derive(Debug)]
pub struct LeaseGuard {
    key: (Uuid, i32),
    held: Arc<Mutex<HashMap<(Uuid, i32), Held>>>,
    interrupt: CancellationToken,
    cancel: CancelSignal,
    renewed: Arc<RenewedAt>,
    ending: Arc<AtomicBool>,
    /// How long after its last renewal's statement the handler may still
    /// be polled (see [`Leases::fence_after`]).
    fence_after: Duration,
}

impl LeaseGuard {
    /// Cancelled when the attempt must stop: the worker's hard stop, or the
    /// lease could not be renewed in time or was taken over.
    pub fn interrupt(&self) -> &CancellationToken {
        &self.interrupt
    }

    /// Fired when an operator cancels the run.
    pub fn cancel(&self) -> &CancelSignal {
        &self.cancel
    }

    /// Marks the handler as returned: the lease is still renewed while the
    /// outcome is recorded, but a renewal that no longer finds the attempt
    /// running has seen that outcome (this worker's own end), not a
    /// takeover, and interrupts nothing.
    pub fn ending(&self) {
        self.ending.store(true, Ordering::Relaxed);
    }

    /// Wraps the attempt's handler future so that it is polled only while
    /// the lease surely holds (see [`Fenced`]).
    pub fn fence<F>(&self, handler: F) -> Fenced<F> {
        Fenced {
            handler,
            key: self.key,
            interrupt: self.interrupt.clone(),
            renewed: self.renewed.clone(),
            fence_after: self.fence_after,
        }
    }

    /// Makes the last renewal look `by` older, as a stalled process sees it
    /// when it resumes.
    #[cfg(test)]
    pub(crate) fn backdate(&self, by: Duration) {
        let at = self.renewed.get();
        if let Some(earlier) = at.checked_sub(by) {
            self.renewed.set(earlier);
        }
    }
}

/// A handler future polled only while its attempt's lease surely holds.
///
/// Before each poll it compares the monotonic clock with the attempt's last
/// renewal; once the lease is about to end ([`Leases::fence_after`]) it
/// interrupts the attempt and resolves to an error without polling the
/// handler again. The bound is later than the heartbeat's check plus the
/// handler's grace, so a process that was not stalled interrupts its
/// handlers first and lets them see their token; the fence only acts
/// after a stall. The check costs a clock read per poll.
#[derive(Debug)]
pub struct Fenced<F> {
    handler: F,
    key: (Uuid, i32),
    interrupt: CancellationToken,
    renewed: Arc<RenewedAt>,
    fence_after: Duration,
}

impl<F> Future for Fenced<F>
where
    F: Future<Output = Result<(), JobError>> + Unpin,
{
    type Output = Result<(), JobError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let since = Instant::now().saturating_duration_since(self.renewed.get());
        if since >= self.fence_after {
            if !self.interrupt.is_cancelled() {
                tracing::error!(id = %self.key.0, attempt = self.key.1, since_renewal = ?since,
                    "lease may have expired (this process was stalled); the handler is not run further");
                self.interrupt.cancel();
            }
            return Poll::Ready(Err(JobError::retryable(
                "the attempt's lease may have expired; handing the run back",
            )));
        }
        Pin::new(&mut self.handler).poll(cx)
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
            base: Instant::now(),
            held: Arc::default(),
            pending_cancels: Arc::default(),
        }
    }

    /// Acts on a cancel of run `id`: the attempt of it this worker holds is
    /// told (see [`LeaseGuard::cancel`]). A run not held is remembered for
    /// a minute, so an announcement that overtook its attempt's
    /// [`Leases::hold`] is not lost. Returns whether an attempt was told.
    pub fn request_cancel(&self, id: Uuid, immediate: bool) -> bool {
        // Lock order: `held`, then `pending_cancels` (as `hold` does).
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut told = false;
        for ((run, _), h) in held.iter() {
            if *run == id {
                h.cancel.fire(immediate);
                told = true;
            }
        }
        if !told {
            let now = Instant::now();
            let mut pending = self
                .pending_cancels
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            pending.retain(|_, (at, _)| now.saturating_duration_since(*at) < PENDING_CANCEL);
            let entry = pending.entry(id).or_insert((now, false));
            entry.1 |= immediate;
        }
        told
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

    /// How long after the statement of its last renewal an attempt's lease
    /// surely holds: the lease less one interval, so the check (four times
    /// an interval) stops a handler before the lease can end.
    fn deadline(&self) -> Duration {
        self.lease.saturating_sub(self.interval())
    }

    /// How often the heartbeat checks for leases past [`Self::deadline`].
    fn check_period(&self) -> Duration {
        (self.interval() / 4).max(Duration::from_millis(50))
    }

    /// How long after the statement of its last renewal a handler may
    /// still be polled: the lease less one check period. An on-time check
    /// interrupts at [`Self::deadline`] (at most one check period late) and
    /// the handler's grace is 200 ms, which ends before this with the
    /// default lease (20 s: interrupted by 16.25 s, aborted by 16.45 s,
    /// fenced from 18.75 s); with leases under about 2 s the fence may
    /// cut the grace short, in favour of never running past the lease.
    pub fn fence_after(&self) -> Duration {
        self.lease.saturating_sub(self.check_period())
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
        let cancel = CancelSignal::default();
        let renewed = Arc::new(RenewedAt::new(self.base, sent));
        let ending = Arc::new(AtomicBool::new(false));
        // Lock order: `held`, then `pending_cancels` (as `request_cancel`
        // does), so an announcement is either found pending here or finds
        // the attempt held.
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let pending = self
            .pending_cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some((at, immediate)) = pending {
            if at.elapsed() < PENDING_CANCEL {
                cancel.fire(immediate);
            }
        }
        held.insert(
            (id, attempt),
            Held {
                interrupt: interrupt.clone(),
                cancel: cancel.clone(),
                renewed: renewed.clone(),
                ending: ending.clone(),
            },
        );
        drop(held);
        LeaseGuard {
            key: (id, attempt),
            held: self.held.clone(),
            interrupt,
            cancel,
            renewed,
            ending,
            fence_after: self.fence_after(),
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
                Ok(renewal) => {
                    // A cancel whose announcement this worker missed.
                    for notice in &renewal.cancels {
                        self.request_cancel(notice.id, notice.immediate);
                    }
                    let renewed = renewal.renewed;
                    let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                    for key in &keys {
                        // A key gone from `held` finished meanwhile.
                        let Some(h) = held.get_mut(key) else { continue };
                        if renewed.contains(key) {
                            h.renewed.set(sent);
                        } else if !h.interrupt.is_cancelled() && !h.ending.load(Ordering::Relaxed) {
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
        let deadline = self.deadline();
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        for (key, h) in held.iter() {
            if now.saturating_duration_since(h.renewed.get()) >= deadline
                && !h.interrupt.is_cancelled()
            {
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
        let mut check = tokio::time::interval(self.check_period());
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

    /// With the default lease, an on-time heartbeat interrupts a handler
    /// and its grace ends before the fence would refuse to poll it: the
    /// fence acts only after a stall.
    #[test]
    fn the_fence_leaves_room_for_the_check_and_the_grace() {
        let leases = Leases::new(DEFAULT_LEASE);
        let latest_abort = leases.deadline() + leases.check_period() + crate::attempt::CANCEL_GRACE;
        assert!(latest_abort < leases.fence_after(), "{latest_abort:?}");
        assert!(leases.fence_after() < leases.lease());
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
