//! Consuming a worker group's queue: deliveries with manual
//! acknowledgement, from RabbitMQ or from the embedded queue, behind one
//! shape ([`Consumption`], [`Delivery`]).
//!
//! The guarantees the worker builds on are the same on both: a delivery is
//! gone from the queue only once acked; a requeued delivery comes back; a
//! rejected one goes to the dead letters; a consumer that disappears
//! (channel lost, process killed) gives its unacknowledged deliveries back
//! to the queue.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::BasicCancelOptions;
use lapin::Channel;

use crate::ack_window::{AckWindow, Nack};

use crate::embedded_queue::{JobQueue, QueuedMessage};
use belfry_protocol::topology::HEADER_TRACEPARENT;

use crate::BrokerError;

/// How often an idle embedded consumer looks at its queue when no publish
/// in this process woke it (messages requeued by a timer, say).
const EMBEDDED_POLL: Duration = Duration::from_millis(250);
/// How long an embedded ack, requeue or reject retries a failing database.
const SETTLE_FOR: Duration = Duration::from_secs(60);

/// One message delivered to a consumer, not yet acknowledged.
pub struct Delivery {
    /// The body, byte for byte.
    pub data: Vec<u8>,
    /// The routing key it was published with (its job type).
    pub routing_key: String,
    /// The W3C traceparent header it carried.
    pub traceparent: Option<String>,
    acker: Acker,
}

enum Acker {
    /// Settled through the consumer's window (acks in order share one
    /// `multiple` frame).
    Amqp { window: AckWindow, tag: u64 },
    Embedded {
        queue: JobQueue,
        seq: i64,
        consumer: String,
    },
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("routing_key", &self.routing_key)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl Delivery {
    fn from_amqp(d: lapin::message::Delivery, window: &AckWindow) -> Self {
        let traceparent = d
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(HEADER_TRACEPARENT))
            .and_then(|v| v.as_long_string())
            .map(|s| s.to_string());
        Self {
            routing_key: d.routing_key.to_string(),
            traceparent,
            data: d.data,
            acker: Acker::Amqp {
                window: window.clone(),
                tag: d.delivery_tag,
            },
        }
    }

    /// Acknowledges the delivery: the queue forgets the message.
    ///
    /// On RabbitMQ the ack is handed to the consumer's acknowledgement
    /// window and this returns at once: acks of deliveries that finished in
    /// order go out together as one `multiple` ack, and none is held longer
    /// than 20 ms behind a delivery still running. An ack that never reaches
    /// the broker (channel lost) is logged there; the message is delivered
    /// again, as after any lost ack.
    ///
    /// # Errors
    ///
    /// [`BrokerError`] when the ack could not be sent or queued (the message
    /// will be delivered again).
    pub async fn ack(&self) -> Result<(), BrokerError> {
        self.settle(Settlement::Ack).await
    }

    /// Gives the delivery back to its queue, to be delivered again.
    ///
    /// # Errors
    ///
    /// [`BrokerError`] when the requeue could not be sent (the message comes
    /// back when the consumer closes instead).
    pub async fn requeue(&self) -> Result<(), BrokerError> {
        self.settle(Settlement::Requeue).await
    }

    /// Rejects the delivery without requeueing: the queue's dead-letter
    /// route takes it (`reason` and `by` are recorded where the route keeps
    /// them: the embedded dead letters; RabbitMQ's dead-letter exchange adds
    /// its own `x-death` header instead).
    ///
    /// # Errors
    ///
    /// [`BrokerError`] when the reject could not be sent.
    pub async fn reject(&self, reason: &str, by: &str) -> Result<(), BrokerError> {
        self.settle(Settlement::Reject { reason, by }).await
    }

    /// Settles the delivery on the queue it came from.
    async fn settle(&self, how: Settlement<'_>) -> Result<(), BrokerError> {
        let what = how.name();
        match &self.acker {
            Acker::Amqp { window, tag } => match how {
                Settlement::Ack => window.ack(*tag),
                Settlement::Requeue | Settlement::Reject { .. } => {
                    let requeue = matches!(how, Settlement::Requeue);
                    window.nack(*tag, Nack { requeue }).await
                }
            },
            Acker::Embedded {
                queue,
                seq,
                consumer,
            } => {
                let seq = *seq;
                settle_embedded(what, move || async move {
                    match how {
                        Settlement::Ack => queue.ack(seq, consumer).await,
                        Settlement::Requeue => queue.requeue(seq, consumer).await,
                        Settlement::Reject { reason, by } => {
                            queue.reject(seq, consumer, reason, by).await
                        }
                    }
                })
                .await
            }
        }
    }
}

/// How a delivery is settled: the three ends of a delivery, the same on
/// RabbitMQ and on the embedded queue.
#[derive(Debug, Clone, Copy)]
enum Settlement<'a> {
    /// Done: the queue forgets it.
    Ack,
    /// Back to the queue, delivered again.
    Requeue,
    /// To the dead letters, with why and by whom.
    Reject { reason: &'a str, by: &'a str },
}

impl Settlement<'_> {
    /// The name in errors and logs.
    fn name(self) -> &'static str {
        match self {
            Settlement::Ack => "ack",
            Settlement::Requeue => "requeue",
            Settlement::Reject { .. } => "reject",
        }
    }
}

/// Runs an embedded acknowledgement, retrying while the database fails
/// (busy, pool exhausted) for up to [`SETTLE_FOR`]: unlike a broken AMQP
/// channel, nothing else would give the message back while this process
/// runs. `Ok(false)` from the queue means the consumer no longer held the
/// message (it was closed and the message given back).
async fn settle_embedded<F, Fut>(what: &'static str, op: F) -> Result<(), BrokerError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool, sqlx::Error>>,
{
    let deadline = tokio::time::Instant::now() + SETTLE_FOR;
    let mut pause = Duration::from_millis(100);
    loop {
        match op().await {
            Ok(true) => return Ok(()),
            Ok(false) => {
                return Err(BrokerError::Embedded(format!(
                    "{what}: the delivery is no longer held by this consumer (it was given \
                     back to the queue)"
                )))
            }
            Err(e) if tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(error = %e, retry_in = ?pause, "embedded queue {what} failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(BrokerError::Embedded(format!("{what}: {e}"))),
        }
    }
}

/// One queue's consumer: its channel, consumer, tag and ack window, and
/// the deliveries received but not yet handed out (with when they came).
struct AmqpConsumer {
    channel: Channel,
    consumer: lapin::Consumer,
    tag: String,
    window: AckWindow,
    held: std::collections::VecDeque<(std::time::Instant, lapin::message::Delivery)>,
}

/// Longest a delivery of a lower priority waits behind higher ones before
/// it is handed out anyway: no level starves, and no delivery stays
/// unacknowledged long enough for RabbitMQ's `consumer_timeout` (30 min by
/// default) to close its channel.
pub const LOWER_LEVEL_BOUND: Duration = Duration::from_secs(300);

/// The next delivery of the first of `consumers` that has one ready
/// (highest priority first); `None` when any of them was ended by the
/// broker (the caller consumes again).
async fn first_ready(
    consumers: &mut [AmqpConsumer],
    bound: Duration,
) -> Option<Result<Delivery, BrokerError>> {
    use std::task::Poll;
    std::future::poll_fn(|cx| {
        // Every consumer is drained of what has arrived, so each has
        // registered the waker when nothing is ready, and what is ready
        // at this moment is known for every level before one is chosen.
        for c in consumers.iter_mut() {
            loop {
                match c.consumer.poll_next_unpin(cx) {
                    Poll::Ready(Some(Ok(d))) => {
                        // Registered in arrival order (each channel has its
                        // own window, and a level is handed out in order):
                        // the window knows every unsettled tag before any
                        // later one is acked with `multiple`.
                        c.window.delivered(d.delivery_tag);
                        c.held.push_back((std::time::Instant::now(), d));
                    }
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Some(Err(BrokerError::amqp("consume")(e))))
                    }
                    Poll::Ready(None) => return Poll::Ready(None),
                    Poll::Pending => break,
                }
            }
        }
        // A lower level's oldest delivery past the bound goes first; then
        // the highest level that has one.
        let overdue = consumers
            .iter()
            .skip(1)
            .position(|c| c.held.front().is_some_and(|(at, _)| at.elapsed() > bound));
        let order = overdue.map(|i| i + 1).into_iter().chain(0..consumers.len());
        for i in order {
            let c = &mut consumers[i];
            if let Some((_, d)) = c.held.pop_front() {
                return Poll::Ready(Some(Ok(Delivery::from_amqp(d, &c.window))));
            }
        }
        Poll::Pending
    })
    .await
}

/// Up to `limit` messages of the first of `names` (highest priority first)
/// that has any free, each with the index of its queue in `names`.
async fn take_highest(
    queue: &JobQueue,
    names: &[String],
    tag: &str,
    limit: u16,
) -> Result<Vec<(usize, QueuedMessage)>, sqlx::Error> {
    for (level, name) in names.iter().enumerate() {
        let batch = queue.take(name, tag, limit).await?;
        if !batch.is_empty() {
            return Ok(batch.into_iter().map(|m| (level, m)).collect());
        }
    }
    Ok(Vec::new())
}

/// A running consumer of one queue, or of a worker group's queues of every
/// priority (highest first): [`Consumption::next`] hands out a ready
/// delivery of an earlier queue before any of a later one.
pub struct Consumption {
    kind: Kind,
}

enum Kind {
    /// One consumer per queue, highest priority first, each on a channel
    /// (and so with an ack window) of its own: a `multiple` ack of one
    /// queue's deliveries is never held behind a delivery of another
    /// queue waiting unstarted in the prefetch buffer.
    Amqp {
        consumers: Vec<AmqpConsumer>,
        /// How long a lower level's delivery may be held back
        /// ([`LOWER_LEVEL_BOUND`] unless a test shortens it).
        bound: Duration,
    },
    Embedded {
        queue: JobQueue,
        /// The queues, highest priority first.
        names: Vec<String>,
        tag: String,
        /// Most messages taken at once (the prefetch).
        prefetch: u16,
        /// Taken, not yet handed out: given back by `close`.
        /// With the index of its queue in `names`.
        taken: std::collections::VecDeque<(usize, QueuedMessage)>,
    },
}

impl std::fmt::Debug for Consumption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, tag) = match &self.kind {
            Kind::Amqp { consumers, .. } => {
                ("amqp", consumers.first().map_or("", |c| c.tag.as_str()))
            }
            Kind::Embedded { tag, .. } => ("embedded", tag.as_str()),
        };
        f.debug_struct("Consumption")
            .field("kind", &kind)
            .field("tag", &tag)
            .finish()
    }
}

impl Consumption {
    /// The consumers (one per queue, highest priority first), each with
    /// its channel and tag.
    pub(crate) fn amqp(consumers: Vec<(Channel, lapin::Consumer, String)>) -> Self {
        let consumers = consumers
            .into_iter()
            .map(|(channel, consumer, tag)| AmqpConsumer {
                window: AckWindow::start(channel.clone()),
                channel,
                consumer,
                tag,
                held: std::collections::VecDeque::new(),
            })
            .collect();
        Self {
            kind: Kind::Amqp {
                consumers,
                bound: LOWER_LEVEL_BOUND,
            },
        }
    }

    pub(crate) async fn embedded(
        queue: JobQueue,
        names: &[String],
        tag: &str,
        prefetch: u16,
    ) -> Result<Self, BrokerError> {
        for name in names {
            let freed = queue
                .open_consumer(name)
                .await
                .map_err(|e| BrokerError::Embedded(e.to_string()))?;
            if freed > 0 {
                tracing::info!(queue = %name, freed, "gave back deliveries a stopped consumer never acknowledged");
            }
        }
        Ok(Self {
            kind: Kind::Embedded {
                queue,
                names: names.to_vec(),
                tag: tag.to_owned(),
                prefetch: prefetch.max(1),
                taken: std::collections::VecDeque::new(),
            },
        })
    }

    /// With lower levels held back at most `bound` instead of
    /// [`LOWER_LEVEL_BOUND`] (for tests of the bound; the embedded queue
    /// has no held-back deliveries: it takes only when asked).
    #[must_use]
    pub fn with_lower_level_bound(mut self, bound: Duration) -> Self {
        if let Kind::Amqp { bound: b, .. } = &mut self.kind {
            *b = bound;
        }
        self
    }

    /// The next delivery; `None` when the broker ended the consumer, an
    /// error when its channel failed (consume again). The embedded queue
    /// waits out database failures here instead.
    pub async fn next(&mut self) -> Option<Result<Delivery, BrokerError>> {
        match &mut self.kind {
            Kind::Amqp { consumers, bound } => first_ready(consumers, *bound).await,
            Kind::Embedded {
                queue,
                names,
                tag,
                prefetch,
                taken,
            } => {
                let ready = queue.ready();
                let mut failing = Duration::ZERO;
                loop {
                    if let Some((level, m)) = taken.pop_front() {
                        // A message of a lower level taken in an earlier
                        // batch waits if a higher one has come meanwhile
                        // (one look per handed-out message, and only when
                        // higher levels exist).
                        let m = match take_highest(queue, &names[..level], tag, 1).await {
                            Ok(higher) => match higher.into_iter().next() {
                                Some((_, h)) => {
                                    taken.push_front((level, m));
                                    h
                                }
                                None => m,
                            },
                            // Handed out as it is; the next look may work.
                            Err(_) => m,
                        };
                        return Some(Ok(Delivery {
                            data: m.body,
                            routing_key: m.routing_key,
                            traceparent: m.traceparent,
                            acker: Acker::Embedded {
                                queue: queue.clone(),
                                seq: m.seq,
                                consumer: tag.clone(),
                            },
                        }));
                    }
                    // Registered before looking, so a publish between the
                    // look and the wait still wakes this consumer.
                    let notified = ready.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    // Up to a prefetch's worth in one statement: the caller
                    // asks only when it has room to run one, and what it has
                    // not asked for yet is given back by `close`.
                    match take_highest(queue, names, tag, *prefetch).await {
                        Ok(batch) if !batch.is_empty() => {
                            failing = Duration::ZERO;
                            taken.extend(batch);
                            continue;
                        }
                        Ok(_) => failing = Duration::ZERO,
                        Err(e) => {
                            // A busy or briefly failing database is waited
                            // out here: ending the consumer would give back
                            // every delivery in flight (a broker does that
                            // only when the channel is really gone).
                            failing = (failing * 2).clamp(EMBEDDED_POLL, Duration::from_secs(5));
                            tracing::warn!(error = %e, retry_in = ?failing, queues = ?names,
                                "cannot take from the embedded queue; retrying");
                            tokio::time::sleep(failing).await;
                            continue;
                        }
                    }
                    // Either wake-up is fine: both only lead to another look.
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep(EMBEDDED_POLL) => {}
                    }
                }
            }
        }
    }

    /// Stops new deliveries (`basic.cancel`); deliveries already received
    /// can still be acked until [`Consumption::close`].
    pub async fn cancel(&self) {
        match &self.kind {
            Kind::Amqp { consumers, .. } => {
                for c in consumers {
                    if c.channel.status().connected() {
                        if let Err(e) = c
                            .channel
                            .basic_cancel(&c.tag, BasicCancelOptions::default())
                            .await
                        {
                            tracing::warn!(error = %e, "consumer cancel failed");
                        }
                    }
                }
            }
            // An embedded consumer takes a message only when asked for one.
            Kind::Embedded { .. } => {}
        }
    }

    /// Closes the consumer: unacknowledged deliveries go back to the queue.
    pub async fn close(self) {
        match self.kind {
            Kind::Amqp { consumers, .. } => {
                for c in consumers {
                    // Held acks first: closing the channel would give their
                    // messages back to the queue (delivered again, though
                    // done).
                    c.window.flush().await;
                    let _ = c.channel.close(200, "consumer closed").await;
                }
            }
            Kind::Embedded { queue, tag, .. } => {
                if let Err(e) = queue.close_consumer(&tag).await {
                    tracing::warn!(error = %e, "cannot give back unacknowledged deliveries; the next consumer does");
                }
            }
        }
    }
}
