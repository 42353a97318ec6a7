//! belfry's alerts: telling someone when something did not run.
//!
//! The ledger records alert events in the transaction of the state change
//! that causes them (`belfry_ledger::AlertEvent`); this crate routes them
//! to the channels of the `BELFRY_ALERTS` file and sends them:
//!
//! - [`config`]: the file (channels, routes, throttling, retries) and the
//!   secrets it names;
//! - [`deliverer`]: the loop every replica runs, routing and sending with
//!   leases so that each delivery is sent by one replica at a time;
//! - [`channel`]: what is retried and what is given up; [`webhook`]
//!   (signed with [`signature`], Standard Webhooks), [`slack`] and
//!   [`email`] (SMTP with STARTTLS);
//! - [`message`]: what an alert says, the same on every channel;
//! - [`name_pattern`]: the globs of route `names`;
//! - [`counters`]: metrics per channel.

pub mod channel;
pub mod config;
pub mod counters;
pub mod deliverer;
pub mod email;
mod error;
pub mod message;
pub mod name_pattern;
pub mod signature;
pub mod slack;
pub mod webhook;

pub use channel::{Channels, SendOutcome};
pub use config::{AlertsConfig, ALERTS_VAR};
pub use counters::AlertCounters;
pub use deliverer::{AlertDeliverer, PassReport};
pub use error::AlertError;
pub use message::{AlertMessage, WebhookBody};
