//! The acknowledgement window of one AMQP consumer: acks of deliveries that
//! finished in order go out as one `basic.ack` with `multiple`, instead of
//! one frame (and one broker-side settlement) per delivery.
//!
//! A worker runs many deliveries at once and they finish in roughly the
//! order they came. Every ack the worker asks for is handed to this window
//! and the caller goes on at once (its permit is free for the next job).
//! The window's task keeps the channel's unsettled delivery tags in order;
//! whenever it has drained what is queued it acks the longest run of
//! finished tags at the head with one frame (`multiple` acks every unsettled
//! tag up to the one named, so it may only name a tag when every tag before
//! it is finished). An ack stuck behind a delivery that is still running is
//! sent on its own after [`ACK_HOLD`], so a long job never keeps finished
//! deliveries counted against the prefetch for longer than that.
//!
//! Requeues and rejects are sent on their own, at once and in order: a tag
//! leaves the unsettled set only once its frame is sent, so a later
//! multiple ack can never cover (and so ack) a delivery meant for the queue
//! or the dead letters.
//!
//! What an ack means is unchanged: the outcome is already in the ledger when
//! it is asked for, so an ack that never reaches the broker (channel lost,
//! process killed during the hold) only means a redelivery, which the worker
//! recognises as finished and acks.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::Channel;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::BrokerError;

/// Longest an ack waits behind an unfinished earlier delivery before it is
/// sent on its own.
pub(crate) const ACK_HOLD: Duration = Duration::from_millis(20);

/// Hands acks, requeues and rejects of one channel's deliveries to its
/// window task. Cheap to clone; the task ends when every clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct AckWindow {
    requests: mpsc::UnboundedSender<Request>,
}

/// A requeue or reject (`requeue = false`), sent on its own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Nack {
    pub(crate) requeue: bool,
}

#[derive(Debug)]
enum Request {
    /// A delivery was handed out (sent before the delivery is, so the window
    /// knows every unsettled tag before any of them is settled).
    Delivered(u64),
    /// Finished: to be acked with the others.
    Ack(u64),
    /// Back to the queue or to the dead letters, now; the reply says whether
    /// the frame was sent.
    Nack(u64, Nack, oneshot::Sender<Result<(), lapin::Error>>),
    /// Send every ack still held, then reply (before the channel closes).
    Flush(oneshot::Sender<()>),
}

/// Where a tag stands in the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    /// Handed out, not finished.
    Running,
    /// Finished, ack not sent yet; since when.
    Finished(Instant),
}

impl AckWindow {
    /// Starts the window task of `channel`.
    pub(crate) fn start(channel: Channel) -> Self {
        let (requests, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(channel, rx));
        Self { requests }
    }

    /// Records that `tag` was handed out. Called before the delivery is.
    pub(crate) fn delivered(&self, tag: u64) {
        // A closed window means the consumer is gone: the ack of this
        // delivery will fail and say so.
        let _ = self.requests.send(Request::Delivered(tag));
    }

    /// Asks for `tag` to be acked (with others when it can be).
    ///
    /// # Errors
    ///
    /// [`BrokerError::ConsumerClosed`] when the window is closed (the
    /// consumer was closed: the message is delivered again).
    pub(crate) fn ack(&self, tag: u64) -> Result<(), BrokerError> {
        self.requests
            .send(Request::Ack(tag))
            .map_err(|_| BrokerError::ConsumerClosed("ack"))
    }

    /// Requeues or rejects `tag` now.
    ///
    /// # Errors
    ///
    /// [`BrokerError`] when the frame could not be sent.
    pub(crate) async fn nack(&self, tag: u64, how: Nack) -> Result<(), BrokerError> {
        let what = if how.requeue { "requeue" } else { "reject" };
        let (reply, sent) = oneshot::channel();
        self.requests
            .send(Request::Nack(tag, how, reply))
            .map_err(|_| BrokerError::ConsumerClosed(what))?;
        match sent.await {
            Ok(r) => r.map_err(BrokerError::amqp(what)),
            Err(_) => Err(BrokerError::ConsumerClosed(what)),
        }
    }

    /// Sends every held ack; returns once they are written (or the window is
    /// gone).
    pub(crate) async fn flush(&self) {
        let (reply, done) = oneshot::channel();
        if self.requests.send(Request::Flush(reply)).is_ok() {
            let _ = done.await;
        }
    }
}

/// The window task: drains what is queued, then acks.
async fn run(channel: Channel, mut rx: mpsc::UnboundedReceiver<Request>) {
    let mut window = Window {
        channel,
        tags: BTreeMap::new(),
    };
    loop {
        // The earliest held ack bounds the wait: either a request comes
        // (and may free the head) or the hold ends and the held acks go out
        // one by one. Both branches only ever send acks of finished tags.
        let next = match window.hold_deadline() {
            Some(deadline) => tokio::select! {
                r = rx.recv() => r,
                _ = tokio::time::sleep_until(deadline) => {
                    window.send_overdue(Instant::now()).await;
                    continue;
                }
            },
            None => rx.recv().await,
        };
        let Some(first) = next else { break };
        let mut flushes = Vec::new();
        window.take(first, &mut flushes).await;
        while let Ok(r) = rx.try_recv() {
            window.take(r, &mut flushes).await;
        }
        window.send_head().await;
        if !flushes.is_empty() {
            window.send_overdue(far_future()).await;
            for f in flushes {
                let _ = f.send(());
            }
        }
    }
    // Every sender is gone: nothing more will finish. Send what is held.
    window.send_head().await;
    window.send_overdue(far_future()).await;
}

/// An instant after every hold deadline.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

struct Window {
    channel: Channel,
    /// Unsettled tags, in delivery order.
    tags: BTreeMap<u64, Tag>,
}

impl Window {
    async fn take(&mut self, r: Request, flushes: &mut Vec<oneshot::Sender<()>>) {
        match r {
            Request::Delivered(tag) => {
                self.tags.insert(tag, Tag::Running);
            }
            Request::Ack(tag) => {
                // A tag the window never saw handed out (cannot happen: the
                // delivery is registered before it is returned) is still
                // acked, on its own, at the next send.
                self.tags.insert(tag, Tag::Finished(Instant::now()));
            }
            Request::Nack(tag, how, reply) => {
                // Sent before it leaves the window: until then it stops any
                // multiple ack at its place.
                let sent = self
                    .channel
                    .basic_nack(
                        tag,
                        BasicNackOptions {
                            requeue: how.requeue,
                            multiple: false,
                        },
                    )
                    .await;
                self.tags.remove(&tag);
                let _ = reply.send(sent);
            }
            Request::Flush(reply) => flushes.push(reply),
        }
    }

    /// Acks the finished run at the head with one frame.
    async fn send_head(&mut self) {
        let mut last = None;
        for (&tag, state) in &self.tags {
            match state {
                Tag::Finished(_) => last = Some(tag),
                Tag::Running => break,
            }
        }
        let Some(last) = last else { return };
        let first = self.tags.keys().next().copied().unwrap_or(last);
        let sent = self
            .channel
            .basic_ack(
                last,
                BasicAckOptions {
                    multiple: last != first,
                },
            )
            .await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, up_to = last, "ack failed; the broker will redeliver and the worker drop the duplicates");
        }
        // Acked or not, these tags are settled as far as this channel goes:
        // a failed frame means the channel is gone and the broker redelivers.
        self.tags.retain(|&t, _| t > last);
    }

    /// The earliest instant a held ack must go out on its own.
    fn hold_deadline(&self) -> Option<Instant> {
        self.tags
            .values()
            .filter_map(|s| match s {
                Tag::Finished(at) => Some(*at + ACK_HOLD),
                Tag::Running => None,
            })
            .min()
    }

    /// Acks, one frame each, the finished tags held since before
    /// `now - ACK_HOLD` (all of them when `now` is far ahead).
    async fn send_overdue(&mut self, now: Instant) {
        let overdue: Vec<u64> = self
            .tags
            .iter()
            .filter_map(|(&t, s)| match s {
                Tag::Finished(at) if *at + ACK_HOLD <= now => Some(t),
                _ => None,
            })
            .collect();
        for tag in overdue {
            if let Err(e) = self
                .channel
                .basic_ack(tag, BasicAckOptions { multiple: false })
                .await
            {
                tracing::warn!(error = %e, tag, "ack failed; the broker will redeliver and the worker drop the duplicate");
            }
            self.tags.remove(&tag);
        }
    }
}
