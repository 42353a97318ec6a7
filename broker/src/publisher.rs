//! Publishing job messages with publisher confirms.
//!
//! Every job message is persistent and published with `mandatory`: the
//! broker either confirms it into at least one queue, returns it as
//! unroutable (no worker group serves its job type), or nacks it. The caller
//! learns which, per message, and decides what the ledger records.

use std::time::Duration;

use chrono::Utc;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};

use belfry_protocol::topology::{
    CONTENT_TYPE_JSON, HEADER_DEAD_BY, HEADER_DEAD_REASON, HEADER_ORIGINAL_ROUTING_KEY,
    HEADER_TRACEPARENT, HEADER_TRACESTATE, HEADER_VERSION,
};
use belfry_protocol::{JobMessage, Topology, MESSAGE_VERSION};

use crate::embedded_queue::{EmbeddedLink, OutgoingMessage};
use crate::BrokerError;

/// How long to wait for the broker's confirm before giving up on a publish.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// What the broker said about one published message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// Stored in at least one queue.
    Confirmed,
    /// Returned: no queue is bound for its routing key.
    Unroutable,
    /// The broker refused it (internal error, queue limit).
    Nacked,
}

/// A message that can never be processed, on its way to the dead-letter
/// queue.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The original body, byte for byte (it may not even be JSON).
    pub body: &'a [u8],
    /// Why it is dead; becomes the `x-belfry-dead-reason` header.
    pub reason: &'a str,
    /// The routing key it arrived with.
    pub routing_key: &'a str,
    /// The worker instance giving up on it.
    pub by: &'a str,
    /// The original message id, when known.
    pub message_id: Option<String>,
    /// The original trace context headers, kept so the dead letter stays in
    /// the run's trace.
    pub traceparent: Option<String>,
}

/// A confirming publisher on its own RabbitMQ channel.
///
/// Publishes on one channel are serialised (publish, then wait for its
/// confirm): lapin hands a `basic.return` to whichever confirm completes
/// next, so with several publishes in flight on one channel an unroutable
/// message could be reported against another publish. One at a time per
/// channel makes every answer belong to its own message;
/// [`crate::PublisherSlot`] keeps several channels for concurrency.
///
/// A publish whose confirm does not arrive within the confirm timeout
/// closes the channel before the next publish may start: the broker may
/// still answer the abandoned publish (its `basic.return` included), and on
/// a channel kept open that late answer could be paired with the next
/// publish's confirm, reporting an unroutable message as confirmed. A closed
/// channel is replaced by [`crate::PublisherSlot`] on its next use.
#[derive(Debug)]
struct AmqpPublisher {
    channel: Channel,
    topology: Topology,
    // Held across a publish and its confirm; see the type's docs.
    serial: tokio::sync::Mutex<()>,
    confirm_timeout: Duration,
}

/// A confirming publisher: on its own RabbitMQ channel (see
/// `AmqpPublisher`), or on the embedded queue, where a publish is confirmed
/// once its rows are committed and is unroutable when no queue is bound to
/// its job type.
#[derive(Debug)]
pub struct Publisher {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Amqp(AmqpPublisher),
    Embedded(EmbeddedLink),
}

impl Publisher {
    pub(crate) async fn open(channel: Channel, topology: Topology) -> Result<Self, BrokerError> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(BrokerError::amqp("enable publisher confirms"))?;
        Ok(Self {
            kind: Kind::Amqp(AmqpPublisher {
                channel,
                topology,
                serial: tokio::sync::Mutex::new(()),
                confirm_timeout: CONFIRM_TIMEOUT,
            }),
        })
    }

    pub(crate) fn embedded(link: EmbeddedLink) -> Self {
        Self {
            kind: Kind::Embedded(link),
        }
    }

    /// The same publisher, waiting at most `timeout` for each confirm
    /// (default 10 s) before it reports [`BrokerError::ConfirmTimeout`] and
    /// closes its channel. The embedded queue confirms on commit and has no
    /// timeout.
    pub fn with_confirm_timeout(mut self, timeout: Duration) -> Self {
        if let Kind::Amqp(p) = &mut self.kind {
            p.confirm_timeout = timeout;
        }
        self
    }

    /// Whether the channel is still usable (embedded: always).
    pub fn is_open(&self) -> bool {
        match &self.kind {
            Kind::Amqp(p) => p.is_open(),
            Kind::Embedded(_) => true,
        }
    }

    /// Publishes `message` to the job exchange with its job type as routing
    /// key and waits for the broker's confirm.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when the channel or connection failed, and
    /// [`BrokerError::ConfirmTimeout`] when no confirm arrived in time. In
    /// both cases the message may or may not have been stored; the caller
    /// keeps the run `claimed` so it can be published again with the same
    /// message id. [`BrokerError::Embedded`] when the embedded database
    /// failed (nothing was stored).
    pub async fn publish(&self, message: &JobMessage) -> Result<PublishOutcome, BrokerError> {
        match &self.kind {
            Kind::Amqp(p) => p.publish(message).await,
            Kind::Embedded(link) => {
                let mut answers = embedded_publish(link, std::slice::from_ref(message)).await;
                answers
                    .pop()
                    .unwrap_or_else(|| Err(BrokerError::NotSent("empty batch".into())))
            }
        }
    }

    /// Publishes `messages` pipelined (embedded: in one transaction) and
    /// returns one answer per message, in order; see `AmqpPublisher` for
    /// how answers stay exact per message on RabbitMQ.
    pub async fn publish_many(
        &self,
        messages: &[JobMessage],
    ) -> Vec<Result<PublishOutcome, BrokerError>> {
        match &self.kind {
            Kind::Amqp(p) => p.publish_many(messages).await,
            Kind::Embedded(link) => embedded_publish(link, messages).await,
        }
    }

    /// Publishes a dead letter, keeping its body unchanged and recording
    /// why, from where and by whom.
    ///
    /// # Errors
    ///
    /// As [`Publisher::publish`].
    pub async fn dead_letter(&self, dead: &DeadLetter<'_>) -> Result<PublishOutcome, BrokerError> {
        match &self.kind {
            Kind::Amqp(p) => p.dead_letter(dead).await,
            Kind::Embedded(link) => {
                let message = OutgoingMessage {
                    routing_key: dead.routing_key,
                    body: dead.body,
                    message_id: dead.message_id.clone(),
                    traceparent: dead.traceparent.as_deref(),
                };
                link.queue
                    .dead_letter(&message, dead.reason, dead.by)
                    .await
                    .map_err(|e| BrokerError::Embedded(e.to_string()))?;
                Ok(PublishOutcome::Confirmed)
            }
        }
    }

    /// Closes the channel.
    pub async fn close(&self) {
        if let Kind::Amqp(p) = &self.kind {
            p.close().await;
        }
    }
}

/// Publishes `messages` to the embedded queue in one transaction: each is
/// confirmed once stored, unroutable when no queue is bound to its job type.
async fn embedded_publish(
    link: &EmbeddedLink,
    messages: &[JobMessage],
) -> Vec<Result<PublishOutcome, BrokerError>> {
    let bodies: Vec<Vec<u8>> = messages.iter().map(JobMessage::to_vec).collect();
    let keys: Vec<String> = messages.iter().map(routing_key).collect();
    let outgoing: Vec<OutgoingMessage<'_>> = messages
        .iter()
        .zip(&bodies)
        .zip(&keys)
        .map(|((m, body), key)| OutgoingMessage {
            routing_key: key,
            body,
            message_id: Some(m.message_id.to_string()),
            traceparent: m.trace.as_ref().map(|t| t.traceparent.as_str()),
        })
        .collect();
    match link.queue.publish(&outgoing).await {
        Ok(routed) => routed
            .into_iter()
            .map(|queues| {
                Ok(if queues == 0 {
                    PublishOutcome::Unroutable
                } else {
                    PublishOutcome::Confirmed
                })
            })
            .collect(),
        Err(e) => {
            let reason = e.to_string();
            messages
                .iter()
                .map(|_| Err(BrokerError::Embedded(reason.clone())))
                .collect()
        }
    }
}

impl AmqpPublisher {
    /// Whether the channel is still usable.
    pub fn is_open(&self) -> bool {
        self.channel.status().connected()
    }

    /// Publishes `message` to the job exchange with its job type as routing
    /// key and waits for the broker's confirm.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when the channel or connection failed, and
    /// [`BrokerError::ConfirmTimeout`] when no confirm arrived in time. In
    /// both cases the message may or may not have been stored; the caller
    /// keeps the run `claimed` so it can be published again with the same
    /// message id.
    pub async fn publish(&self, message: &JobMessage) -> Result<PublishOutcome, BrokerError> {
        self.send(
            &self.topology.jobs_exchange(),
            &routing_key(message),
            &message.to_vec(),
            job_properties(message),
        )
        .await
    }

    /// Publishes `messages` pipelined on this channel (every publish sent,
    /// then every confirm awaited, at most [`CONFIRM_TIMEOUT`] in all) and
    /// returns one answer per message, in order.
    ///
    /// Answers are exact per message although lapin attaches a returned
    /// (unroutable) message to whichever confirm completes next: the channel
    /// is held for the whole batch, the broker sends a message's return
    /// before its ack, and every ack takes one waiting return, so every
    /// return of the batch is handed out among the batch's own confirms.
    /// Returns are matched to messages by message id, never by position.
    ///
    /// A publish that could not be sent (the channel broke) and every
    /// message after it answer with the error; the caller keeps those runs
    /// `claimed` for the outbox, as for a single failed publish.
    pub async fn publish_many(
        &self,
        messages: &[JobMessage],
    ) -> Vec<Result<PublishOutcome, BrokerError>> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let exchange = self.topology.jobs_exchange();
        // Held until every confirm of the batch is in; see above.
        let _serial = self.serial.lock().await;
        let mut pending = Vec::with_capacity(messages.len());
        let mut broken: Option<String> = None;
        for message in messages {
            let sent = self
                .channel
                .basic_publish(
                    &exchange,
                    &routing_key(message),
                    options,
                    &message.to_vec(),
                    job_properties(message),
                )
                .await;
            match sent {
                Ok(confirm) => pending.push(confirm),
                Err(e) => {
                    broken = Some(e.to_string());
                    break;
                }
            }
        }
        let sent = pending.len();
        let confirmations =
            tokio::time::timeout(self.confirm_timeout, futures::future::join_all(pending)).await;
        let mut answers: Vec<Result<PublishOutcome, BrokerError>> = match confirmations {
            Err(_) => {
                // Still holding `serial`: no publish can follow on this
                // channel before it is closed (see the type's docs).
                self.abandon().await;
                (0..sent)
                    .map(|_| Err(BrokerError::ConfirmTimeout(self.confirm_timeout)))
                    .collect()
            }
            Ok(confirmations) => {
                let mut returned = std::collections::HashSet::new();
                let mut kinds = Vec::with_capacity(sent);
                for c in confirmations {
                    match c {
                        Ok(Confirmation::Ack(r)) => {
                            if let Some(r) = r {
                                returned.insert(r.properties.message_id().clone());
                            }
                            kinds.push(Ok(true));
                        }
                        Ok(Confirmation::Nack(r)) => {
                            if let Some(r) = r {
                                returned.insert(r.properties.message_id().clone());
                            }
                            kinds.push(Ok(false));
                        }
                        Ok(Confirmation::NotRequested) => kinds.push(Ok(false)),
                        Err(e) => kinds.push(Err(e)),
                    }
                }
                kinds
                    .into_iter()
                    .zip(messages)
                    .map(|(kind, message)| match kind {
                        Ok(true) => {
                            let id = Some(ShortString::from(message.message_id.to_string()));
                            Ok(if returned.contains(&id) {
                                PublishOutcome::Unroutable
                            } else {
                                PublishOutcome::Confirmed
                            })
                        }
                        Ok(false) => Ok(PublishOutcome::Nacked),
                        Err(e) => Err(BrokerError::amqp("publish confirm")(e)),
                    })
                    .collect()
            }
        };
        let reason = broken.unwrap_or_else(|| "channel closed".into());
        answers.extend((sent..messages.len()).map(|_| Err(BrokerError::NotSent(reason.clone()))));
        answers
    }

    /// Publishes a dead letter to the dead-letter exchange, keeping its body
    /// unchanged and adding why, from where and by whom as headers.
    ///
    /// # Errors
    ///
    /// As [`Publisher::publish`].
    pub async fn dead_letter(&self, dead: &DeadLetter<'_>) -> Result<PublishOutcome, BrokerError> {
        let mut headers = FieldTable::default();
        insert_str(&mut headers, HEADER_DEAD_REASON, dead.reason);
        insert_str(&mut headers, HEADER_ORIGINAL_ROUTING_KEY, dead.routing_key);
        insert_str(&mut headers, HEADER_DEAD_BY, dead.by);
        if let Some(tp) = &dead.traceparent {
            insert_str(&mut headers, HEADER_TRACEPARENT, tp);
        }
        let mut properties = persistent_json().with_headers(headers);
        if let Some(id) = &dead.message_id {
            properties = properties.with_message_id(ShortString::from(id.clone()));
        }
        self.send(
            &self.topology.dead_letter_exchange(),
            dead.routing_key,
            dead.body,
            properties,
        )
        .await
    }

    async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<PublishOutcome, BrokerError> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let sent_id = properties.message_id().clone();
        let _serial = self.serial.lock().await;
        let confirm = self
            .channel
            .basic_publish(exchange, routing_key, options, body, properties)
            .await
            .map_err(BrokerError::amqp("publish"))?;
        let confirmation = match tokio::time::timeout(self.confirm_timeout, confirm).await {
            Ok(confirmation) => confirmation.map_err(BrokerError::amqp("publish confirm"))?,
            Err(_) => {
                // Closed while `serial` is still held; see the type's docs.
                self.abandon().await;
                return Err(BrokerError::ConfirmTimeout(self.confirm_timeout));
            }
        };
        Ok(match confirmation {
            // With `mandatory`, an unroutable message is returned and then
            // acked: the returned message rides on the ack. The id check is
            // belt and braces: with one publish in flight it always matches.
            Confirmation::Ack(Some(returned)) if returned.properties.message_id() == &sent_id => {
                PublishOutcome::Unroutable
            }
            Confirmation::Ack(Some(returned)) => {
                tracing::warn!(
                    returned = ?returned.properties.message_id(),
                    sent = ?sent_id,
                    "a returned message did not match its publish; treating the publish as confirmed"
                );
                PublishOutcome::Confirmed
            }
            Confirmation::Ack(None) => PublishOutcome::Confirmed,
            Confirmation::Nack(_) => PublishOutcome::Nacked,
            // Confirm mode is always selected in `open`; treat the
            // impossible answer as a refusal rather than a success.
            Confirmation::NotRequested => PublishOutcome::Nacked,
        })
    }

    /// Closes the channel.
    pub async fn close(&self) {
        let _ = self.channel.close(200, "publisher closed").await;
    }

    /// Closes the channel after a confirm timed out, so no late answer of
    /// the broker can reach a later publish. The close handshake itself is
    /// bounded: a broker that does not answer it either leaves the channel
    /// closing, which [`AmqpPublisher::is_open`] already reports as not
    /// usable.
    async fn abandon(&self) {
        let closing = self.channel.close(200, "publish confirm timed out");
        if tokio::time::timeout(Duration::from_secs(1), closing)
            .await
            .is_err()
        {
            tracing::warn!("closing a channel after a confirm timeout did not finish in 1 s");
        }
    }
}

/// The properties of a job message: persistent JSON, its message id, the
/// protocol version and the trace context as headers.
fn job_properties(message: &JobMessage) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(HEADER_VERSION.into(), AMQPValue::LongUInt(MESSAGE_VERSION));
    if let Some(trace) = &message.trace {
        insert_str(&mut headers, HEADER_TRACEPARENT, &trace.traceparent);
        if let Some(state) = &trace.tracestate {
            insert_str(&mut headers, HEADER_TRACESTATE, state);
        }
    }
    persistent_json()
        .with_message_id(ShortString::from(message.message_id.to_string()))
        .with_headers(headers)
}

fn persistent_json() -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(ShortString::from(CONTENT_TYPE_JSON))
        .with_timestamp(u64::try_from(Utc::now().timestamp()).unwrap_or(0))
}

/// The routing key of a job message: its job type, at its priority's
/// level (see `belfry_protocol::priority`).
fn routing_key(message: &JobMessage) -> String {
    message.options.priority().routing_key(&message.job_type)
}

fn insert_str(headers: &mut FieldTable, key: &str, value: &str) {
    headers.insert(
        ShortString::from(key),
        AMQPValue::LongString(LongString::from(value.to_owned())),
    );
}
