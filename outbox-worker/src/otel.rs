//! Exporting the worker's traces over OTLP/HTTP (the `otel` feature): each
//! task attempt is a span named `<task type> process`, with its task id,
//! type, queue and attempt, whose parent is the span that submitted the
//! task, in whatever process that was (the trace context travels in the
//! task's row). Configured the standard way, by environment:
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! turns it on, `OTEL_SERVICE_NAME` names the service (default
//! `outbox-worker`), `OTEL_RESOURCE_ATTRIBUTES` adds to it.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::{EnvFilter, Filtered};
use tracing_subscriber::registry::LookupSpan;

use crate::failure::Failure;

/// The exporter's provider: shut it down at exit so the last spans go out.
pub(crate) struct Exporter(SdkTracerProvider);

impl Exporter {
    /// Sends what is still buffered, within the SDK's own timeout.
    pub(crate) fn shutdown(self) {
        if let Err(e) = self.0.shutdown() {
            eprintln!("warning: the last traces were not all exported: {e}");
        }
    }
}

/// The exporting layer on a subscriber `S`, with its own filter.
type ExportLayer<S> = Filtered<
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
    EnvFilter,
    S,
>;

/// The tracing layer that exports spans, filtered by `filter` (the same
/// directives as the log), when an OTLP endpoint is configured.
pub(crate) fn layer<S>(filter: &str) -> Result<Option<(ExportLayer<S>, Exporter)>, Failure>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    let configured = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    if !configured {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| Failure::config(format!("cannot export traces over OTLP: {e}")))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("outbox-worker");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("outbox");
    let filter = EnvFilter::try_new(filter).map_err(|e| Failure::config(e.to_string()))?;
    let layer = tracing_subscriber::Layer::with_filter(
        tracing_opentelemetry::layer().with_tracer(tracer),
        filter,
    );
    Ok(Some((layer, Exporter(provider))))
}
