//! One trace from a web handler, through the database, to a worker in
//! another process: the test plays the web handler (a span of a real
//! OpenTelemetry tracer) that submits a task and emits an event in its
//! transaction; the worker process exports its spans over OTLP/HTTP to a
//! receiver in this test, which decodes them. A task submitted from SQL
//! with `SET LOCAL outbox.traceparent` continues its own trace the same way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use outbox::events::{Event, emit};
use outbox_tests::TestDb;
use outbox_tests::process::{WorkerProcess, wait_until};
use outbox_tests::tasks::{Record, create_executions_table};
use prost::Message;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use crate::WORKER;

/// An OTLP/HTTP receiver: every span the worker exports.
async fn receiver() -> (String, Arc<Mutex<Vec<Span>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let got = Arc::clone(&spans);
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let got = Arc::clone(&got);
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        got.lock().unwrap().extend(scope.spans);
                    }
                }
                // An empty ExportTraceServiceResponse.
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), spans)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    Some(match value.value.as_ref()? {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::IntValue(i) => i.to_string(),
        other => format!("{other:?}"),
    })
}

#[tokio::test]
async fn a_tasks_span_in_the_worker_process_continues_the_submitters_trace() {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    let (endpoint, exported) = receiver().await;

    // The web handler's side: a real tracer (nothing exported here; the
    // ids are what matter) behind tracing, for this test's thread only.
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("web")));
    let _default = tracing::subscriber::set_default(subscriber);
    let request = tracing::info_span!("POST /orders");
    let web = request.context().span().span_context().clone();
    assert!(web.is_valid(), "the test's tracer makes real spans");
    let (task, event) = async {
        let mut tx = db.pool.begin().await.unwrap();
        let task = outbox::submit(&mut tx, Record { ms: 10 }).await.unwrap();
        let event = emit(
            &mut tx,
            Event::new("order", "42", "order.placed", serde_json::json!({})),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        (task, event)
    }
    .instrument(request)
    .await;

    // Another service's: psql, a trigger, Python, with a trace of its own.
    let sql_trace = "0af7651916cd43dd8448eb211c80319c";
    let sql_parent = "b7ad6b7169203331";
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET LOCAL outbox.traceparent = '00-{sql_trace}-{sql_parent}-01'"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let from_sql: i64 = sqlx::query_scalar(
        "SELECT outbox_submit('test.record', '{\"ms\": 10}', '{\"queue\": \"record\"}')",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();

    // The event carries the web handler's trace for its consumers.
    let header: Option<String> = sqlx::query_scalar(
        "SELECT headers->>'traceparent' FROM outbox_event_log WHERE id = $1::uuid",
    )
    .bind(&event.id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        header.as_deref(),
        Some(format!("00-{}-{}-01", web.trace_id(), web.span_id()).as_str())
    );

    let mut worker = WorkerProcess::spawn_with_env(
        WORKER,
        &db.url,
        &["--queue", "record=4", "--poll-interval", "100ms"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "billing-worker"),
        ],
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 2 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    // At exit the worker sends what it still holds.
    worker.signal("TERM");
    let status = worker.wait(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0), "{}", worker.log());

    let spans = exported.lock().unwrap().clone();
    let of_task = |id: i64| {
        spans
            .iter()
            .find(|s| attribute(s, "task_id") == Some(id.to_string()))
            .unwrap_or_else(|| panic!("no span for task {id} among {spans:#?}\n{}", worker.log()))
    };
    let span = of_task(task.0);
    eprintln!(
        "otel: web span {}/{}; the worker's span {:?} in trace {} under {}",
        web.trace_id(),
        web.span_id(),
        span.name,
        hex(&span.trace_id),
        hex(&span.parent_span_id)
    );
    assert_eq!(span.name, "test.record process");
    assert_eq!(hex(&span.trace_id), web.trace_id().to_string(), "one trace");
    assert_eq!(
        hex(&span.parent_span_id),
        web.span_id().to_string(),
        "the handler's span is the web handler's child"
    );
    assert_eq!(attribute(span, "task_type").as_deref(), Some("test.record"));
    assert_eq!(attribute(span, "queue").as_deref(), Some("record"));
    assert_eq!(attribute(span, "attempt").as_deref(), Some("1"));

    let span = of_task(from_sql);
    assert_eq!(hex(&span.trace_id), sql_trace);
    assert_eq!(hex(&span.parent_span_id), sql_parent);
}
