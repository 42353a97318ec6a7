//! Built-in job types for demos, smoke tests and benchmarks.

mod http;
mod noop;
mod sleep;

pub use http::{Http, HttpPayload};
pub use noop::Noop;
pub use sleep::{Sleep, SleepPayload};
