//! W3C trace context carried by every job message.
//!
//! A run is followed end to end in one trace: the scheduler starts the trace
//! at the fire, puts its `traceparent` into the message (body and AMQP
//! header), and the worker continues it. The trace id is also stored on the
//! `job_runs` row so an operator can go from a run to its trace.
//!
//! Format: `00-{32 hex trace id}-{16 hex parent span id}-{2 hex flags}`
//! (<https://www.w3.org/TR/trace-context/>).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The trace context of a run, as carried in a [`crate::JobMessage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    /// W3C `traceparent` value.
    pub traceparent: String,
    /// W3C `tracestate` value, when the producer had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// Starts a new sampled trace with random trace and span ids.
    pub fn new_root() -> Self {
        let trace_id = Uuid::new_v4().simple().to_string();
        let span_id = &Uuid::new_v4().simple().to_string()[..16];
        Self {
            traceparent: format!("00-{trace_id}-{span_id}-01"),
            tracestate: None,
        }
    }

    /// Parses a `traceparent` value, keeping it only when well formed.
    ///
    /// Returns `None` for anything that is not version `00` with a non-zero
    /// 32-hex trace id and 16-hex span id, as the W3C spec asks receivers to
    /// do.
    pub fn from_traceparent(traceparent: &str, tracestate: Option<String>) -> Option<Self> {
        let ctx = Self {
            traceparent: traceparent.to_owned(),
            tracestate,
        };
        if ctx.trace_id().is_some() {
            Some(ctx)
        } else {
            None
        }
    }

    /// The 32-hex-digit trace id, or `None` when the `traceparent` is
    /// malformed.
    pub fn trace_id(&self) -> Option<&str> {
        let mut parts = self.traceparent.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
        let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
        (parts.next().is_none()
            && version == "00"
            && hex(trace, 32)
            && nonzero(trace)
            && hex(span, 16)
            && nonzero(span)
            && hex(flags, 2))
        .then_some(trace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_roots_are_well_formed_and_distinct() {
        let a = TraceContext::new_root();
        let b = TraceContext::new_root();
        assert_eq!(a.trace_id().map(str::len), Some(32));
        assert_ne!(a.trace_id(), b.trace_id());
    }

    #[test]
    fn rejects_malformed_parents() {
        for bad in [
            "",
            "00-abc-def-01",
            "00-00000000000000000000000000000000-0000000000000001-01",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        ] {
            assert!(TraceContext::from_traceparent(bad, None).is_none(), "{bad}");
        }
        let ok = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert_eq!(
            TraceContext::from_traceparent(ok, None).unwrap().trace_id(),
            Some("0af7651916cd43dd8448eb211c80319c")
        );
    }
}
