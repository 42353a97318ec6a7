//! `noop`: does nothing and succeeds. Measures belfry's own overhead.

use crate::job::{Job, JobContext, JobError};

/// The `noop` job type; any payload is accepted and ignored.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noop;

impl Job for Noop {
    const TYPE: &'static str = "noop";
    type Payload = serde_json::Value;

    async fn run(&self, _ctx: JobContext, _payload: serde_json::Value) -> Result<(), JobError> {
        Ok(())
    }
}
