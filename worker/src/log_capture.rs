//! `tracing` events from inside a handler, stored in its run's log (issue
//! 23): opt-in per job type ([`crate::RegistryBuilder::capture_tracing`]),
//! so a chatty library used by one handler does not flood the store.
//!
//! - **How an event finds its run.** The worker runs each attempt in its
//!   own `attempt` span. For a job type that opted in, the worker stores
//!   the attempt's [`RunLog`] in that span's extensions ([`attach`]), in
//!   the span's own subscriber, so the log lives exactly as long as the
//!   span and two subscribers (a test's thread-local one beside the global
//!   one) never mix their span ids. [`RunLogCapture`], a
//!   `tracing_subscriber` layer, walks an event's span scope and writes the
//!   event to the first span that has a log. Events of tasks the handler
//!   spawned reach it too when they are instrumented with `ctx.span` (the
//!   usual way to keep a trace). Once the attempt's outcome is known its
//!   log is closed, so an event after it is dropped (and counted as late).
//! - **What is stored.** The event's level, its `message` as the line's
//!   text and its other fields as the line's structured fields (numbers and
//!   booleans as JSON values, everything else as text), at the job type's
//!   level or more severe. The worker's own events (target `belfry_worker`)
//!   are left out: the attempt's outcome is already its `error` line.
//! - **What it costs.** Nothing while no span holds a log (one atomic
//!   read per event). While one does, each event the process's filter lets
//!   through walks its span scope and reads each span's extensions under
//!   that span's shared lock. The lock is never held while a line is
//!   written (the [`RunLog`] is cloned out first), so a write cannot
//!   re-enter it.
//! - **What it needs.** The layer installed in the process's subscriber:
//!   `belfry-worker` does it; a worker binary of your own adds
//!   [`RunLogCapture`] to its subscriber (or uses
//!   `belfry_runtime::init_telemetry_with`). Only events the subscriber's
//!   filter enables (`RUST_LOG`, default `info`) exist to be captured; an
//!   attempt whose span the filter disabled, or a subscriber not built on
//!   `tracing_subscriber::Registry`, captures nothing.

use std::sync::atomic::{AtomicUsize, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::run_log::RunLog;

/// Spans holding a log now: the layer's fast path when none does.
static CAPTURING: AtomicUsize = AtomicUsize::new(0);

/// Whether `target` is the worker's own (`belfry_worker` or a module of
/// it; not a crate that merely starts with the name).
fn own_target(target: &str) -> bool {
    target == "belfry_worker" || target.starts_with("belfry_worker::")
}

/// The layer that writes captured events to their attempt's log; add it to
/// the subscriber of a worker binary of your own (`belfry-worker` has it).
#[derive(Debug, Clone, Copy, Default)]
pub struct RunLogCapture;

impl RunLogCapture {
    /// The layer.
    pub fn layer() -> Self {
        Self
    }
}

/// What an `attempt` span carries in its extensions: the attempt's log and
/// the most verbose level it stores. Counted while it exists.
struct Captured {
    log: RunLog,
    max_level: Level,
}

impl Drop for Captured {
    fn drop(&mut self) {
        CAPTURING.fetch_sub(1, Ordering::Release);
    }
}

/// Stores `log` in `span`'s extensions: events inside the span at
/// `max_level` or more severe go to it until the span closes. Returns
/// false when nothing can be captured: the span is disabled (filtered out)
/// or its subscriber is not built on `tracing_subscriber::Registry`.
pub(crate) fn attach(span: &tracing::Span, log: RunLog, max_level: Level) -> bool {
    span.with_subscriber(|(id, dispatch)| {
        let Some(registry) = dispatch.downcast_ref::<tracing_subscriber::Registry>() else {
            return false;
        };
        let Some(data) = registry.span(id) else {
            return false;
        };
        // Counted before it can be dropped (a `replace` of an earlier one
        // drops that one, which uncounts itself).
        CAPTURING.fetch_add(1, Ordering::Release);
        data.extensions_mut().replace(Captured { log, max_level });
        true
    })
    .unwrap_or(false)
}

/// The log (and level) of the nearest capturing span around `event`.
fn capture_of<S>(event: &Event<'_>, ctx: &Context<'_, S>) -> Option<(RunLog, Level)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    ctx.event_scope(event)?.find_map(|span| {
        // Cloned out, so the span's extension lock is released before the
        // line is written.
        span.extensions()
            .get::<Captured>()
            .map(|c| (c.log.clone(), c.max_level))
    })
}

impl<S> Layer<S> for RunLogCapture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if CAPTURING.load(Ordering::Acquire) == 0 {
            return;
        }
        let meta = event.metadata();
        if own_target(meta.target()) {
            return;
        }
        let Some((log, max_level)) = capture_of(event, &ctx) else {
            return;
        };
        // `Level` orders by verbosity: TRACE > DEBUG > ... > ERROR.
        if *meta.level() > max_level {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        if !meta.target().is_empty() {
            line.fields
                .insert("target".into(), meta.target().to_owned().into());
        }
        let fields = serde_json::Value::Object(line.fields);
        log.write(*meta.level(), &line.message, fields);
    }
}

/// An event's fields as a line: `message` as text, the rest as JSON.
#[derive(Default)]
struct Line {
    message: String,
    fields: serde_json::Map<String, serde_json::Value>,
}

impl Line {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        if field.name() == "message" {
            self.message = match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.fields.insert(field.name().to_owned(), value);
        }
    }
}

impl Visit for Line {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;
    use uuid::Uuid;

    use super::*;
    use crate::run_log::{test_lines, test_sink, RunLogBounds};

    #[test]
    fn events_in_a_capturing_span_are_stored_at_its_level_and_others_are_not() {
        let (sink, mut rx) = test_sink(100);
        let log = sink.attempt(Uuid::nil(), 1, RunLogBounds::default(), (0, 0));
        let subscriber = tracing_subscriber::registry().with(RunLogCapture::layer());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("attempt");
            let other = tracing::info_span!("elsewhere");
            {
                assert!(attach(&span, log.clone(), Level::INFO));
                span.in_scope(|| {
                    tracing::info!(target: "billing", invoice = 42, paid = true, "sent {}", "it");
                    tracing::debug!(target: "billing", "too verbose for INFO");
                    let child = tracing::info_span!("child");
                    child.in_scope(|| tracing::warn!(target: "billing", "from a child span"));
                    tracing::error!(target: "belfry_worker::process", "the worker's own");
                    tracing::info!(target: "belfry_worker_billing", "a crate named alike");
                });
                other.in_scope(|| tracing::info!(target: "billing", "another span"));
            }
            // The attempt is over: its log is closed.
            assert_eq!(log.close(), Some(3));
            span.in_scope(|| tracing::info!(target: "billing", "after the attempt"));
        });
        let got = test_lines(&mut rx);
        let messages: Vec<&str> = got.iter().map(|l| l.message.as_str()).collect();
        assert_eq!(
            messages,
            ["sent it", "from a child span", "a crate named alike"]
        );
        assert_eq!(got[0].level, "info");
        assert_eq!(
            got[0].fields,
            Some(serde_json::json!({"invoice": 42, "paid": true, "target": "billing"}))
        );
        assert_eq!(got[1].level, "warn");
    }
}
