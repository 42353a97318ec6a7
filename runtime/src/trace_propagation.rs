//! W3C trace context in and out of `tracing` spans.
//!
//! A run is one trace: the scheduler's `fire` span starts it, the message
//! carries the `traceparent` of the span that published it, and the
//! worker's `process` span continues it as a child of that span. With an
//! OpenTelemetry layer installed (export configured, or a test exporter),
//! [`current`] reads the current span's ids and [`set_parent`] links a span
//! to a remote parent. Without one, [`current`] returns `None` (callers
//! then start a fresh random trace id, which is still stored on the run and
//! logged) and [`set_parent`] does nothing: no cost when export is off.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Whether an OpenTelemetry layer was installed in this process.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Marks the OpenTelemetry layer as installed (done by
/// [`crate::telemetry::otel_layer`]); until then [`current`] and
/// [`set_parent`] return at once.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether spans carry OpenTelemetry context in this process.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The W3C `traceparent` (and `tracestate`, when there is one) of the
/// current span, or `None` when spans carry no OpenTelemetry context.
pub fn current() -> Option<(String, Option<String>)> {
    if !enabled() {
        return None;
    }
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let traceparent = format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    );
    let state = sc.trace_state().header();
    Some((traceparent, (!state.is_empty()).then_some(state)))
}

/// Makes `span` a child of the remote span named by `traceparent` (and
/// `tracestate`), so it joins that trace. Malformed values are ignored: the
/// span then starts a trace of its own. Call it before `span` is entered.
pub fn set_parent(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    if !enabled() {
        return;
    }
    let mut parts = traceparent.split('-');
    let (Some("00"), Some(trace), Some(parent), Some(flags), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return;
    };
    let (Ok(trace), Ok(parent), Ok(flags)) = (
        TraceId::from_hex(trace),
        SpanId::from_hex(parent),
        u8::from_str_radix(flags, 16),
    ) else {
        return;
    };
    let state = tracestate
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let sc = SpanContext::new(trace, parent, TraceFlags::new(flags), true, state);
    if !sc.is_valid() {
        return;
    }
    // Fails only when the span was disabled or already started; the span
    // then keeps the parent it has.
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
}
