//! A publisher that is opened on first use and replaced when its channel
//! breaks.
//!
//! A channel dies with any channel-level error (and with the connection);
//! callers that publish for the life of the process hold a slot instead of
//! a publisher, so one failed publish does not poison every later one.

use std::sync::Arc;

use crate::{Broker, BrokerError, Publisher};

/// A lazily (re)opened [`Publisher`].
#[derive(Debug)]
pub struct PublisherSlot {
    broker: Broker,
    // A tokio mutex because opening a channel awaits; it is held only to
    // clone or replace the Arc, never across a publish, so publishes stay
    // concurrent.
    slot: tokio::sync::Mutex<Option<Arc<Publisher>>>,
}

impl PublisherSlot {
    /// A slot publishing through `broker`.
    pub fn new(broker: Broker) -> Self {
        Self {
            broker,
            slot: tokio::sync::Mutex::new(None),
        }
    }

    /// The open publisher, opening a new one when there is none or the old
    /// channel closed.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Amqp`] when no channel can be opened.
    pub async fn get(&self) -> Result<Arc<Publisher>, BrokerError> {
        let mut slot = self.slot.lock().await;
        if let Some(p) = slot.as_ref().filter(|p| p.is_open()) {
            return Ok(p.clone());
        }
        let fresh = Arc::new(self.broker.publisher().await?);
        *slot = Some(fresh.clone());
        Ok(fresh)
    }

    /// Drops the current publisher after an error, so the next
    /// [`PublisherSlot::get`] opens a fresh channel.
    pub async fn reset(&self) {
        *self.slot.lock().await = None;
    }
}
