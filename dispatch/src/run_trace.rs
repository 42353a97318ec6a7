//! The trace a run belongs to.
//!
//! A new run (a fire, an ad-hoc job) joins the caller's current trace when
//! spans carry OpenTelemetry context — the scheduler's `fire` span, or the
//! request span of a service enqueueing a job — and starts a fresh random
//! trace id otherwise, so `job_runs.trace_id` and the logs always have one.

use belfry_protocol::TraceContext;

/// The current span's trace context, when spans carry one.
pub fn current() -> Option<TraceContext> {
    belfry_runtime::trace_propagation::current().map(|(traceparent, tracestate)| TraceContext {
        traceparent,
        tracestate,
    })
}

/// The current span's trace context, or a new root trace.
pub fn current_or_new() -> TraceContext {
    current().unwrap_or_else(TraceContext::new_root)
}

/// Makes `span` a child of the span that `trace` names (a message's
/// publisher), before `span` is entered.
pub fn continue_in(span: &tracing::Span, trace: Option<&TraceContext>) {
    if let Some(t) = trace {
        belfry_runtime::trace_propagation::set_parent(
            span,
            &t.traceparent,
            t.tracestate.as_deref(),
        );
    }
}
