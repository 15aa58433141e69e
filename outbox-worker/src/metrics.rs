//! Prometheus metrics at `/metrics`, liveness at `/health` and readiness
//! (the database reachable) at `/ready`.
//!
//! Counters and the handler-duration histogram are recorded by the engine
//! through the `metrics` facade; the queue gauges (claimable, scheduled,
//! processing, dead, oldest claimable age) are read from the database on
//! each scrape, from partial indexes, so they are fresh and cheap.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// Installs the Prometheus recorder for this process and describes the
/// series. Call once, before the worker starts.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("outbox_handler_duration_seconds".to_owned()),
            &[
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0,
            ],
        )
        .map_err(|e| e.to_string())?
        .set_buckets_for_metric(
            Matcher::Prefix("outbox_relay_".to_owned()),
            &[
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0, 300.0,
            ],
        )
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    metrics::describe_counter!(
        "outbox_tasks_processed_total",
        "Attempt outcomes committed by this worker, by task_type and outcome \
         (completed, failed, dead, snoozed, released, stale)"
    );
    metrics::describe_histogram!(
        "outbox_handler_duration_seconds",
        metrics::Unit::Seconds,
        "Handler run time by task_type"
    );
    metrics::describe_gauge!(
        "outbox_tasks",
        "Tasks in the database by state (claimable, scheduled, blocked behind their ordering key, processing, dead)"
    );
    metrics::describe_gauge!(
        "outbox_oldest_claimable_age_seconds",
        metrics::Unit::Seconds,
        "How long the oldest claimable task has been due"
    );
    metrics::describe_counter!(
        outbox::relay::metrics::PUBLISHED,
        "Events the broker acknowledged, by relay"
    );
    metrics::describe_counter!(
        outbox::relay::metrics::FAILURES,
        "Publishes that failed, by relay, class (transient, permanent) and kind"
    );
    metrics::describe_histogram!(
        outbox::relay::metrics::COMMIT_TO_ACK,
        metrics::Unit::Seconds,
        "From the emitting transaction to the broker's acknowledgement, by relay"
    );
    metrics::describe_histogram!(
        outbox::relay::metrics::PUBLISH_DURATION,
        metrics::Unit::Seconds,
        "One publish call, by relay"
    );
    metrics::describe_gauge!(
        outbox::relay::metrics::CIRCUIT_OPEN,
        "1 while the relay's circuit is open (its broker presumed down)"
    );
    metrics::describe_gauge!(
        "outbox_relay_backlog",
        "Events of the relay's stream past its slowest partition's cursor"
    );
    metrics::describe_gauge!(
        "outbox_relay_oldest_unpublished_age_seconds",
        metrics::Unit::Seconds,
        "How long the oldest unpublished event of the relay's stream has waited"
    );
    metrics::describe_gauge!(
        "outbox_relay_parked_events",
        "Events the relay holds back (parked aggregates' events)"
    );
    metrics::describe_gauge!(
        "outbox_relay_parked_aggregates",
        "Aggregates the relay holds back (a refused event, or a delay not yet run out)"
    );
    metrics::describe_gauge!(
        "outbox_relay_refused_aggregates",
        "Aggregates the relay holds back because the broker refused one of their events \
         (they wait for `events retry` or `events skip`)"
    );
    metrics::describe_gauge!(
        "outbox_relay_stopped",
        "1 while the relay reads nothing because the event log's position sequence \
         caches, steps by more than one or went back (`events subscriptions` says how to fix it)"
    );
    metrics::describe_gauge!(
        "outbox_relay_failing_seconds",
        metrics::Unit::Seconds,
        "How long the relay's publishes have failed for now with no success since (0 while they \
         succeed): the longest of its live relay workers"
    );
    metrics::describe_gauge!(
        "outbox_database_up",
        "1 when the last gauge refresh reached the database"
    );
    Ok(handle)
}

#[derive(Clone)]
struct AppState {
    handle: PrometheusHandle,
    pool: PgPool,
    /// One session of its own for `/ready`: the handlers may hold every
    /// session of `pool` for longer than the probe waits, which would make
    /// a busy worker look cut off.
    probe: PgPool,
    /// The relays of this worker, as (name, queue).
    relays: Vec<(String, String)>,
}

/// Serves `/metrics`, `/health` and `/ready` on `addr` until `stop` is
/// cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    pool: PgPool,
    relays: Vec<(String, String)>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(render))
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .with_state(AppState {
            handle,
            probe: sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(READY_WITHIN)
                .connect_lazy_with(pool.connect_options().as_ref().clone()),
            pool,
            relays,
        });
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "serving /metrics, /health and /ready");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

/// How long `/ready`'s query may take.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// 200 while a query reaches the database within 2 s, 503 otherwise.
/// `/health` stays 200 through an outage (the worker rides it out and
/// loses nothing, so restarting it would not help); `/ready` is for
/// whoever wants to know the worker can do its work now: a readiness
/// probe, a load balancer in front of the dashboard, an alert.
async fn ready(State(state): State<AppState>) -> (StatusCode, &'static str) {
    let ping =
        tokio::time::timeout(READY_WITHIN, sqlx::query("SELECT 1").execute(&state.probe)).await;
    match ping {
        Ok(Ok(_)) => (StatusCode::OK, "ready\n"),
        Ok(Err(_)) | Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the database is unreachable\n",
        ),
    }
}

async fn render(State(state): State<AppState>) -> (StatusCode, String) {
    let health = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        outbox::admin::queue_health(&state.pool),
    )
    .await;
    match health {
        Ok(Ok(h)) => {
            metrics::gauge!("outbox_tasks", "state" => "claimable").set(h.claimable as f64);
            metrics::gauge!("outbox_tasks", "state" => "scheduled").set(h.scheduled as f64);
            metrics::gauge!("outbox_tasks", "state" => "blocked").set(h.blocked as f64);
            metrics::gauge!("outbox_tasks", "state" => "processing").set(h.processing as f64);
            metrics::gauge!("outbox_tasks", "state" => "dead").set(h.dead as f64);
            metrics::gauge!("outbox_oldest_claimable_age_seconds").set(h.oldest_claimable_age_s);
            metrics::gauge!("outbox_oldest_heartbeat_age_seconds").set(h.oldest_heartbeat_age_s);
            metrics::gauge!("outbox_task_table_dead_tuples").set(h.table.dead_tuples as f64);
            metrics::gauge!("outbox_task_table_live_tuples").set(h.table.live_tuples as f64);
            metrics::gauge!("outbox_oldest_snapshot_age_seconds")
                .set(h.table.oldest_snapshot_age_s);
            metrics::gauge!("outbox_database_up").set(1.0);
        }
        _ => metrics::gauge!("outbox_database_up").set(0.0),
    }
    if !state.relays.is_empty() {
        relay_gauges(&state).await;
    }
    (StatusCode::OK, state.handle.render())
}

/// Each relay's subscription lag, read on each scrape.
async fn relay_gauges(state: &AppState) {
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        outbox::relay::subscriptions(&state.pool),
    )
    .await;
    let Ok(Ok(rows)) = read else {
        return;
    };
    for (name, _) in &state.relays {
        let row = rows.iter().find(|r| &r.name == name);
        let relay = name.clone();
        let (behind, age, parked, aggregates, refused) = row.map_or((0, 0.0, 0, 0, 0), |r| {
            (
                r.behind,
                r.lag_s,
                r.parked,
                r.parked_aggregates,
                r.refused_aggregates,
            )
        });
        let stopped = row.is_some_and(|r| r.problem.is_some());
        let failing = row.and_then(|r| r.failing_s).unwrap_or(0.0);
        metrics::gauge!("outbox_relay_failing_seconds", "relay" => relay.clone()).set(failing);
        metrics::gauge!("outbox_relay_stopped", "relay" => relay.clone())
            .set(f64::from(u8::from(stopped)));
        metrics::gauge!("outbox_relay_backlog", "relay" => relay.clone()).set(behind as f64);
        metrics::gauge!("outbox_relay_oldest_unpublished_age_seconds", "relay" => relay.clone())
            .set(age);
        metrics::gauge!("outbox_relay_parked_events", "relay" => relay.clone()).set(parked as f64);
        metrics::gauge!("outbox_relay_parked_aggregates", "relay" => relay.clone())
            .set(aggregates as f64);
        metrics::gauge!("outbox_relay_refused_aggregates", "relay" => relay).set(refused as f64);
    }
}
