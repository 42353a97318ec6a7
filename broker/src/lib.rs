//! belfry's broker seam.
//!
//! Everything that touches AMQP lives here: connecting, declaring the
//! topology of [`belfry_protocol::topology`], publishing job messages with
//! publisher confirms and `mandatory`, dead-lettering, and opening consumers.
//! The scheduler and the worker see only [`Broker`], [`Publisher`],
//! [`PublishOutcome`], [`Consumption`] and [`Delivery`], so the embedded
//! mode puts its database-backed queue ([`Broker::embedded`],
//! [`JobQueue`], in `embedded_queue`) behind the same shape. The embedded
//! queue's code is here; its table lives in the embedded ledger's file,
//! on connections the ledger hands out, so this crate needs no ledger.

mod ack_window;
pub mod amqp_tls;
mod broker;
mod cluster_nodes;
mod consumption;
mod embedded_queue;
mod error;
mod publisher;
mod publisher_slot;

pub use broker::Broker;
pub use consumption::{Consumption, Delivery};
pub use embedded_queue::{JobQueue, OutgoingMessage, QueuedMessage};
pub use error::BrokerError;
pub use publisher::{DeadLetter, PublishOutcome, Publisher};
pub use publisher_slot::PublisherSlot;
