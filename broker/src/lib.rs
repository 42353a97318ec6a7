//! belfry's RabbitMQ seam.
//!
//! Everything that touches AMQP lives here: connecting, declaring the
//! topology of [`belfry_protocol::topology`], publishing job messages with
//! publisher confirms and `mandatory`, dead-lettering, and opening consumers.
//! The scheduler and the worker see only [`Broker`], [`Publisher`] and
//! [`PublishOutcome`], so the embedded mode of a later issue can put another
//! queue behind the same shape.

mod broker;
mod error;
mod publisher;
mod publisher_slot;

pub use broker::Broker;
pub use error::BrokerError;
pub use lapin::message::Delivery;
pub use lapin::Consumer;
pub use publisher::{DeadLetter, PublishOutcome, Publisher};
pub use publisher_slot::PublisherSlot;
