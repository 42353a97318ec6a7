//! Logging and trace export for the binaries.
//!
//! Logs: `RUST_LOG` filters (default `info`); `BELFRY_LOG_FORMAT=json`
//! switches to one JSON object per line for log shippers. Nothing here ever
//! formats a configuration secret: URLs are logged through [`crate::masked`].
//!
//! Traces: spans are exported over OTLP/HTTP (protobuf) when the standard
//! OpenTelemetry variables ask for it — `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set, `OTEL_TRACES_EXPORTER` not
//! `none`, `OTEL_SDK_DISABLED` not `true`; the exporter itself reads the
//! rest (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, and the batch processor's `OTEL_BSP_*`).
//! `RUST_LOG` filters both logs and exported spans (belfry's spans are at
//! INFO, the default); of the events inside spans, only WARN and ERROR are
//! exported.
//! Unset, no OpenTelemetry layer is installed
//! at all: spans cost what a `tracing` span costs, and run trace ids are
//! generated directly (see [`crate::trace_propagation`]).

use std::str::FromStr;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable text (default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" | "" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "unknown log format {other:?}; use \"text\" or \"json\""
            )),
        }
    }
}

/// Trace export could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter refused its configuration.
    #[error("OpenTelemetry export is configured (OTEL_EXPORTER_OTLP_*) but cannot start: {0}; fix or unset the OTEL_* variables")]
    Exporter(String),
}

/// Keeps trace export running; [`Telemetry::shutdown`] flushes it.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Awaits `work`, then flushes and stops the exporter
    /// ([`Telemetry::shutdown`]) whatever `work` returned: the spans of a
    /// binary that stops with an error are sent too.
    pub async fn flush_after<T>(self, work: impl std::future::Future<Output = T>) -> T {
        let out = work.await;
        self.shutdown().await;
        out
    }

    /// Flushes buffered spans and stops the exporter (waiting up to the
    /// exporter's timeout). Call once, after the binary's work has stopped;
    /// errors are logged, not returned, since the process is exiting.
    pub async fn shutdown(self) {
        if let Some(provider) = self.provider {
            // Flushing blocks until the batch thread has sent what it holds:
            // off the async threads.
            let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            match flushed {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "flushing spans at shutdown failed"),
                Err(e) => tracing::warn!(error = %e, "flushing spans at shutdown panicked"),
            }
        }
    }
}

/// Whether the environment asks for OTLP trace export.
pub fn export_configured() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let is = |k: &str, v: &str| std::env::var(k).is_ok_and(|x| x.trim().eq_ignore_ascii_case(v));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        && !is("OTEL_TRACES_EXPORTER", "none")
        && !is("OTEL_SDK_DISABLED", "true")
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of
/// `provider`, exporting every span and WARN+ events (see
/// [`crate::exported_events`]); binaries
/// get it from [`init_telemetry`], tests use it with an in-memory exporter.
/// Installing it turns on [`crate::trace_propagation`].
pub fn otel_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    crate::trace_propagation::enable();
    // Busy/idle timing (a clock read at every poll of an instrumented
    // future), thread and source-location attributes cost time and bytes
    // on every span without helping to follow a run: off.
    crate::exported_events::ExportedEvents::new(
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("belfry"))
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false),
    )
}

/// Installs the global subscriber: logs as `format`, plus OTLP export of
/// spans as `service` (resource `service.name`, unless `OTEL_SERVICE_NAME`
/// says otherwise) from `instance` (`service.instance.id`, so spans need not
/// repeat it) when [`export_configured`]. Calling it twice keeps
/// the first subscriber (tests may call it from every test).
///
/// # Errors
///
/// [`TelemetryError::Exporter`] when export is configured but the exporter
/// cannot be built.
pub fn init_telemetry(
    service: &str,
    instance: &str,
    format: LogFormat,
) -> Result<Telemetry, TelemetryError> {
    init_telemetry_with(
        service,
        instance,
        format,
        tracing_subscriber::layer::Identity::new(),
    )
}

/// [`init_telemetry`] with one more layer of the process's own, next to the
/// registry: the worker's run-log capture (`belfry_worker::RunLogCapture`)
/// is one. The same global filter applies to it.
///
/// # Errors
///
/// As [`init_telemetry`].
pub fn init_telemetry_with<L>(
    service: &str,
    instance: &str,
    format: LogFormat,
    layer: L,
) -> Result<Telemetry, TelemetryError>
where
    L: Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    let provider = if export_configured() {
        Some(otlp_provider(service, instance)?)
    } else {
        None
    };
    // One global filter (RUST_LOG, default INFO) for logs and exported
    // spans alike: an `EnvFilter` as a per-layer filter of the log layer made
    // the first span of a callsite go missing (seen in the process test: a
    // `fire` span absent, its `claim` and `publish` children each starting a
    // trace of their own). The trace layer's own filter is a plain function.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .boxed(),
    };
    let traces = provider.as_ref().map(otel_layer);
    let _ = tracing_subscriber::registry()
        .with(layer)
        .with(filter)
        .with(logs)
        .with(traces)
        .try_init();
    Ok(Telemetry { provider })
}

fn otlp_provider(service: &str, instance: &str) -> Result<SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::WithExportConfig as _;
    // The blocking HTTP client must not be built on an async runtime's
    // thread (it owns a runtime of its own): build it on a plain thread.
    let exporter = std::thread::spawn(|| {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build()
    })
    .join()
    .map_err(|_| TelemetryError::Exporter("exporter set-up panicked".into()))?
    .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let mut resource = opentelemetry_sdk::Resource::builder().with_attribute(
        opentelemetry::KeyValue::new("service.instance.id", instance.to_owned()),
    );
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service.to_owned());
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}
