//! A layer wrapper that passes every span to the OpenTelemetry layer but
//! only the events worth exporting (WARN and ERROR).
//!
//! Not a per-layer filter (`Layer::with_filter`) on purpose: per-layer
//! filtering keeps per-thread state about which layers enabled a span, and
//! with it the first span of a callsite was seen going missing from traces
//! (a `fire` span in the process test once; a test's request span another
//! time), splitting a run's trace. Which spans exist is decided by the one
//! global `RUST_LOG` filter; this wrapper only drops events, so it has no
//! say in whether a span is enabled.

use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Wraps `inner`: spans pass through, events below WARN do not.
pub struct ExportedEvents<L> {
    inner: L,
}

impl<L> ExportedEvents<L> {
    /// The wrapper around `inner`.
    pub fn new(inner: L) -> Self {
        Self { inner }
    }
}

/// Whether an event goes into exported traces (as a span event): WARN and
/// ERROR; routine INFO lines stay in the logs.
pub fn exported_event(meta: &Metadata<'_>) -> bool {
    *meta.level() <= tracing::Level::WARN
}

impl<S, L> Layer<S> for ExportedEvents<L>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    L: Layer<S>,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }

    fn on_layer(&mut self, subscriber: &mut S) {
        self.inner.on_layer(subscriber);
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        self.inner.on_new_span(attrs, id, ctx);
    }

    fn on_record(&self, span: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        self.inner.on_record(span, values, ctx);
    }

    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
        self.inner.on_follows_from(span, follows, ctx);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if exported_event(event.metadata()) {
            self.inner.on_event(event, ctx);
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        self.inner.on_enter(id, ctx);
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        self.inner.on_exit(id, ctx);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        self.inner.on_close(id, ctx);
    }

    fn on_id_change(&self, old: &Id, new: &Id, ctx: Context<'_, S>) {
        self.inner.on_id_change(old, new, ctx);
    }

    // SAFETY (of the contract, no unsafe here): forwarding keeps the inner
    // layer reachable by downcast, which is how `OpenTelemetrySpanExt`
    // finds a span's OpenTelemetry context.
    #[allow(unsafe_code)] // The trait's method is unsafe; see runtime/Cargo.toml.
    unsafe fn downcast_raw(&self, id: std::any::TypeId) -> Option<*const ()> {
        if id == std::any::TypeId::of::<Self>() {
            Some(self as *const Self as *const ())
        } else {
            // SAFETY: the inner layer upholds `downcast_raw`'s contract for
            // its own types; this only passes the question on.
            unsafe { self.inner.downcast_raw(id) }
        }
    }
}
