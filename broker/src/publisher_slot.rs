//! A small pool of publishers, opened on first use and replaced when their
//! channel breaks.
//!
//! A channel dies with any channel-level error (and with the connection);
//! callers that publish for the life of the process hold a slot instead of
//! a publisher, so one failed publish does not poison every later one. The
//! pool has several channels because each [`Publisher`] serialises its
//! publishes (see its docs); publishes are spread over them round-robin.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::{Broker, BrokerError, Publisher};

/// Channels per slot: enough concurrent confirms for a burst of fires on a
/// local broker without holding many channels open.
const CHANNELS: usize = 8;

/// Most publishes awaiting their confirm on one channel: large enough to
/// keep a local broker busy, small enough that a broken channel fails a
/// bounded number of publishes.
pub const CONFIRM_WINDOW: usize = 128;

/// A lazily (re)opened pool of [`Publisher`]s.
#[derive(Debug)]
pub struct PublisherSlot {
    broker: Broker,
    next: AtomicUsize,
    // Tokio mutexes because opening a channel awaits; each is held only to
    // clone or replace its Arc, never across a publish.
    slots: Vec<tokio::sync::Mutex<Option<Arc<Publisher>>>>,
}

/// A publisher taken from a [`PublisherSlot`], with the index to report a
/// broken channel for.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The publisher.
    pub publisher: Arc<Publisher>,
    index: usize,
}

impl PublisherSlot {
    /// A pool publishing through `broker`.
    pub fn new(broker: Broker) -> Self {
        Self {
            broker,
            next: AtomicUsize::new(0),
            slots: (0..CHANNELS)
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
        }
    }

    /// An open publisher, opening a new one when its slot is empty or its
    /// channel closed (reconnecting the broker when needed).
    ///
    /// # Errors
    ///
    /// [`BrokerError`] when no channel can be opened.
    pub async fn get(&self) -> Result<Lease, BrokerError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[index].lock().await;
        if let Some(p) = slot.as_ref().filter(|p| p.is_open()) {
            return Ok(Lease {
                publisher: p.clone(),
                index,
            });
        }
        let fresh = Arc::new(self.broker.publisher().await?);
        *slot = Some(fresh.clone());
        Ok(Lease {
            publisher: fresh,
            index,
        })
    }

    /// Drops a publisher after an error, so its slot opens a fresh channel.
    pub async fn reset(&self, lease: &Lease) {
        *self.slots[lease.index].lock().await = None;
    }

    /// Publishes through any open publisher, dropping a publisher whose
    /// publish failed.
    ///
    /// # Errors
    ///
    /// [`BrokerError`] when no channel can be opened or the publish failed.
    pub async fn publish(
        &self,
        message: &belfry_protocol::JobMessage,
    ) -> Result<crate::PublishOutcome, BrokerError> {
        let lease = self.get().await?;
        let result = lease.publisher.publish(message).await;
        self.reset_on_error(&lease, result).await
    }

    /// Publishes `messages` pipelined, at most [`CONFIRM_WINDOW`] unconfirmed
    /// per channel, the chunks spread over the pool's channels
    /// concurrently; one answer per message, in order. A channel whose
    /// chunk failed is replaced.
    pub async fn publish_many(
        &self,
        messages: &[belfry_protocol::JobMessage],
    ) -> Vec<Result<crate::PublishOutcome, BrokerError>> {
        let chunks = messages.chunks(CONFIRM_WINDOW).map(|chunk| async move {
            let lease = match self.get().await {
                Ok(lease) => lease,
                Err(e) => {
                    let reason = e.to_string();
                    return chunk
                        .iter()
                        .map(|_| Err(BrokerError::NotSent(reason.clone())))
                        .collect::<Vec<_>>();
                }
            };
            let answers = lease.publisher.publish_many(chunk).await;
            if answers.iter().any(Result::is_err) {
                self.reset(&lease).await;
            }
            answers
        });
        futures::future::join_all(chunks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Dead-letters through any open publisher; see [`PublisherSlot::publish`].
    ///
    /// # Errors
    ///
    /// As [`PublisherSlot::publish`].
    pub async fn dead_letter(
        &self,
        dead: &crate::DeadLetter<'_>,
    ) -> Result<crate::PublishOutcome, BrokerError> {
        let lease = self.get().await?;
        let result = lease.publisher.dead_letter(dead).await;
        self.reset_on_error(&lease, result).await
    }

    /// Passes `result` of a publish on `lease` through, replacing the
    /// lease's channel first when it failed (a failed publish can leave the
    /// channel closed or with confirms out of step).
    async fn reset_on_error<T>(
        &self,
        lease: &Lease,
        result: Result<T, BrokerError>,
    ) -> Result<T, BrokerError> {
        if result.is_err() {
            self.reset(lease).await;
        }
        result
    }
}
