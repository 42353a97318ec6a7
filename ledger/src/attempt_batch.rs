//! Group commit for the worker's hot path: many concurrent attempt starts
//! and ends become one statement each.
//!
//! A busy worker runs dozens of jobs at once, and each job writes to the
//! ledger twice (start of attempt, end of attempt). One statement per write
//! makes the database round trip the bottleneck. The batcher queues writes
//! and sends whatever is queued as one `UPDATE ... FROM unnest(...)`: an idle
//! worker's single write goes out at once (a batch of one, no added delay),
//! a busy worker's writes share round trips. Semantics are exactly those of
//! [`Ledger::begin_attempt`]'s common path and [`Ledger::end_attempt`]: the
//! same guards, row by row.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot, Semaphore};
use uuid::Uuid;

use crate::runs::AttemptEntry;
use crate::{Ledger, LedgerError, RunStatus};

/// Most writes in one statement.
const MAX_BATCH: usize = 256;
/// Statements of one kind in flight at once. Few, so that a busy worker's
/// writes gather into large batches: on the partitioned ledger a
/// statement's fixed cost (planning over the partitions it names) is most
/// of its cost, and with 4 in flight a noop worker sent batches of about
/// 4 rows (BENCHMARKS.md, "The worker on the partitioned ledger"). Two, not
/// one, so a statement waiting on a row lock does not hold up every other
/// start or end.
const IN_FLIGHT: usize = 2;

/// A request to start an attempt (the common path: the row exists and is
/// startable).
#[derive(Debug, Clone)]
pub struct BeginRequest {
    /// The run's job name.
    pub job_name: String,
    /// The run's key.
    pub run_key: String,
    /// The worker instance.
    pub worker: String,
    /// The attempt's lease.
    pub lease: Duration,
}

/// A request to end an attempt; see [`Ledger::end_attempt`].
#[derive(Debug, Clone)]
pub struct EndRequest {
    /// The run.
    pub id: Uuid,
    /// The status to move to.
    pub status: RunStatus,
    /// The finished attempt.
    pub entry: AttemptEntry,
    /// The run's latest error.
    pub last_error: Option<String>,
    /// When the reconciler should publish it again (deferred retries).
    pub redispatch_at: Option<DateTime<Utc>>,
}

type Reply<T> = oneshot::Sender<Result<T, Arc<LedgerError>>>;
/// `(id, attempt)` of a started attempt; `None` when the slow path must decide.
type Started = Option<(Uuid, i32)>;

/// Batches attempt writes to one ledger. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AttemptBatcher {
    begins: mpsc::UnboundedSender<(BeginRequest, Reply<Started>)>,
    ends: mpsc::UnboundedSender<(EndRequest, Reply<bool>)>,
}

impl AttemptBatcher {
    /// Starts the batching tasks for `ledger`; they end when every clone of
    /// the batcher is dropped.
    pub fn new(ledger: Ledger) -> Self {
        let (begins, begin_rx) = mpsc::unbounded_channel();
        let (ends, end_rx) = mpsc::unbounded_channel();
        let l = ledger.clone();
        tokio::spawn(flush_loop(
            begin_rx,
            move |batch: Arc<Vec<BeginRequest>>| {
                let l = l.clone();
                async move { l.begin_batch(&batch).await }
            },
        ));
        tokio::spawn(flush_loop(end_rx, move |batch: Arc<Vec<EndRequest>>| {
            let l = ledger.clone();
            async move { l.end_batch(&batch).await }
        }));
        Self { begins, ends }
    }

    /// Starts an attempt: `Some((id, attempt))` when the row was startable,
    /// `None` when it needs [`Ledger::begin_attempt`]'s slow path (no row
    /// yet, finished, or held by another attempt).
    ///
    /// # Errors
    ///
    /// The batch's [`LedgerError`] when the database failed.
    pub async fn begin(
        &self,
        request: BeginRequest,
    ) -> Result<Option<(Uuid, i32)>, Arc<LedgerError>> {
        let (tx, rx) = oneshot::channel();
        self.begins.send((request, tx)).map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }

    /// Ends an attempt; `false` when the attempt no longer owns the run.
    ///
    /// # Errors
    ///
    /// The batch's [`LedgerError`] when the database failed.
    pub async fn end(&self, request: EndRequest) -> Result<bool, Arc<LedgerError>> {
        // Free text is made storable before it joins a batch: a NUL in one
        // handler's error must not fail the statement it shares.
        let request = EndRequest {
            entry: request.entry.into_storable(),
            last_error: request.last_error.map(crate::stored_text::into_storable),
            ..request
        };
        let (tx, rx) = oneshot::channel();
        self.ends.send((request, tx)).map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }
}

fn closed() -> Arc<LedgerError> {
    Arc::new(LedgerError::Corrupt("the attempt batcher stopped".into()))
}

/// Takes whatever is queued (at least one request, at most `MAX_BATCH`),
/// runs it as one statement on a spawned task (at most `IN_FLIGHT` at once)
/// and answers every request of the batch.
///
/// A batch the database refuses for its data (see
/// [`LedgerError::is_data_error`]: one row with a value it cannot store) is
/// split at once and each request run on its own, so only the bad one gets
/// the error and the others are settled a few milliseconds later instead of
/// failing with it (and being handed back, and run again).
async fn flush_loop<Req, Resp, F, Fut>(
    mut rx: mpsc::UnboundedReceiver<(Req, Reply<Resp>)>,
    execute: F,
) where
    Req: Clone + Send + Sync + 'static,
    Resp: Send + 'static,
    F: Fn(Arc<Vec<Req>>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Vec<Resp>, LedgerError>> + Send + 'static,
{
    let execute = Arc::new(execute);
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // Waiting for a permit while requests queue up is what forms
        // batches under load.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let (requests, replies): (Vec<Req>, Vec<Reply<Resp>>) = batch.into_iter().unzip();
        let requests = Arc::new(requests);
        let fut = execute(requests.clone());
        let execute = execute.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match fut.await {
                Ok(results) => answer(replies, results),
                Err(e) if e.is_data_error() && requests.len() > 1 => {
                    tracing::warn!(error = %e, rows = requests.len(),
                        "a batched ledger write was refused for its data; settling its rows one by one");
                    // One at a time, under the batch's permit: the rows are
                    // few (at most MAX_BATCH) and each is a short statement.
                    for (request, reply) in requests.iter().zip(replies) {
                        let one = execute(Arc::new(vec![request.clone()])).await;
                        let _ = reply.send(
                            one.map_err(Arc::new)
                                .and_then(|mut r| r.pop().ok_or_else(closed)),
                        );
                    }
                }
                Err(e) => {
                    let e = Arc::new(e);
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}

fn answer<Resp>(replies: Vec<Reply<Resp>>, results: Vec<Resp>) {
    for (reply, result) in replies.into_iter().zip(results) {
        let _ = reply.send(Ok(result));
    }
}

impl Ledger {
    /// Starts every startable attempt of `batch` in one statement.
    pub(crate) async fn begin_batch(
        &self,
        batch: &[BeginRequest],
    ) -> Result<Vec<Option<(Uuid, i32)>>, LedgerError> {
        self.store.begin_batch(batch).await
    }

    /// Ends every attempt of `batch` that still holds its run, in one
    /// statement; each answer is for its own `(id, attempt)`, so a
    /// superseded attempt sharing a batch with its successor is told its
    /// outcome was not written.
    pub(crate) async fn end_batch(&self, batch: &[EndRequest]) -> Result<Vec<bool>, LedgerError> {
        self.store.end_batch(batch).await
    }

    /// Extends the lease of every attempt in `held` (`(run id, attempt)`)
    /// to `lease` from now, in one statement: the worker's heartbeat.
    /// Returns the attempts whose lease was extended; one missing from the
    /// answer no longer holds its run (it finished, or its lease expired and
    /// another attempt took the run over) and must stop. The answer also
    /// names the renewed runs that carry a cancel request, so a request
    /// whose announcement was missed still reaches the worker (see
    /// `crate::cancel`).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn renew_leases(
        &self,
        held: &[(Uuid, i32)],
        lease: Duration,
    ) -> Result<LeaseRenewal, LedgerError> {
        if held.is_empty() {
            return Ok(Default::default());
        }
        self.store.renew_leases(held, lease).await
    }
}

/// What one heartbeat learned ([`crate::Ledger::renew_leases`]).
#[derive(Debug, Clone, Default)]
pub struct LeaseRenewal {
    /// The attempts whose lease was extended.
    pub renewed: std::collections::HashSet<(Uuid, i32)>,
    /// The renewed runs with a cancel request.
    pub cancels: Vec<crate::cancel::CancelNotice>,
}

impl LeaseRenewal {
    /// The heartbeat's answer from its rows `(id, attempt, cancel
    /// requested, immediate)`: both backends read the same columns.
    pub(crate) fn from_rows(rows: Vec<(Uuid, i32, bool, bool)>) -> Self {
        let mut out = Self::default();
        for (id, attempt, cancel, immediate) in rows {
            out.renewed.insert((id, attempt));
            if cancel {
                out.cancels
                    .push(crate::cancel::CancelNotice { id, immediate });
            }
        }
        out
    }
}
