//! A task's trace context, carried through the database: the submitting
//! transaction records the current span's W3C `traceparent` (with the
//! `otel` feature) in the transaction-local setting `outbox.traceparent`,
//! the tasks it inserts take it as their `trace_context` (a column
//! default, so every way of submitting does, SQL included), and the
//! worker's span for each attempt continues that trace. Events carry it as
//! their `traceparent` header, which the relays pass on to the brokers.

use sqlx::PgConnection;

/// The current span's trace context as a W3C `traceparent`, when the
/// `otel` feature is on and the span belongs to a valid OpenTelemetry
/// trace (a `tracing-opentelemetry` layer is installed).
pub(crate) fn traceparent() -> Option<String> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid().then(|| {
            format!(
                "00-{}-{}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                sc.trace_flags().to_u8()
            )
        })
    }
    #[cfg(not(feature = "otel"))]
    None
}

/// Records the current trace context (if any) for the tasks this
/// transaction inserts from now on: one more statement, only when there
/// is a trace to continue. Outside a transaction it would last for this
/// statement alone, so an autocommit submit carries no trace.
pub(crate) async fn propagate(conn: &mut PgConnection) -> sqlx::Result<()> {
    if let Some(traceparent) = traceparent() {
        sqlx::query("SELECT set_config('outbox.traceparent', $1, true)")
            .bind(traceparent)
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// Makes `traceparent`'s span the parent of `span` (the worker's span for
/// an attempt). A malformed value, or no OpenTelemetry layer, leaves the
/// span where it was.
#[cfg(feature = "otel")]
pub(crate) fn continue_trace(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let Some((trace_id, span_id, flags)) = parse(traceparent) else {
        return;
    };
    let parent = SpanContext::new(
        TraceId::from_bytes(trace_id),
        SpanId::from_bytes(span_id),
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent));
}

/// The trace id, span id and flags of a version-00 `traceparent`; None
/// for anything else, or for the all-zero ids the format reserves. Emit
/// refuses a `traceparent` header it cannot parse.
pub(crate) fn parse(traceparent: &str) -> Option<([u8; 16], [u8; 8], u8)> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() {
        return None;
    }
    let trace: [u8; 16] = hex(trace)?.try_into().ok()?;
    let span: [u8; 8] = hex(span)?.try_into().ok()?;
    let flags = *hex(flags)?.first().filter(|_| flags.len() == 2)?;
    if trace == [0; 16] || span == [0; 8] {
        return None;
    }
    Some((trace, span, flags))
}

fn hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2)
        || !text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_traceparent_parses_and_anything_else_does_not() {
        let (trace, span, flags) =
            parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(trace[0], 0x4b);
        assert_eq!(span[7], 0xb7);
        assert_eq!(flags, 1);
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
