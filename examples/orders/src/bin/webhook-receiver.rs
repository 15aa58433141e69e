//! Run with: cargo run -p orders-example --bin webhook-receiver
//!
//! The other side of the webhook: accepts events and deduplicates them by
//! their `Idempotency-Key`, which is what makes at-least-once delivery safe.
//! `GET /events` reports what arrived. (Kept in memory for the example; a
//! real receiver keeps the keys in its database, in the same transaction as
//! the effect.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use orders_example::IDEMPOTENCY_HEADER;

#[derive(Default)]
struct Received {
    /// Deliveries per idempotency key.
    by_key: BTreeMap<String, u64>,
    /// The first payload of each key.
    events: Vec<serde_json::Value>,
}

type Shared = Arc<Mutex<Received>>;

async fn receive(
    State(state): State<(Shared, Duration)>,
    headers: HeaderMap,
    Json(event): Json<serde_json::Value>,
) -> StatusCode {
    let (received, delay) = state;
    let Some(key) = headers
        .get(IDEMPOTENCY_HEADER)
        .and_then(|v| v.to_str().ok())
    else {
        return StatusCode::BAD_REQUEST;
    };
    {
        let mut received = received.lock().unwrap_or_else(|e| e.into_inner());
        let count = received.by_key.entry(key.to_owned()).or_insert(0);
        *count += 1;
        if *count == 1 {
            received.events.push(event);
        }
    }
    // The acknowledgement takes time: a sender that dies now has had its
    // event applied without learning it, and will send it again.
    tokio::time::sleep(delay).await;
    // A duplicate is acknowledged, not applied again.
    StatusCode::OK
}

async fn report(State((received, _)): State<(Shared, Duration)>) -> Json<serde_json::Value> {
    let received = received.lock().unwrap_or_else(|e| e.into_inner());
    let deliveries: u64 = received.by_key.values().sum();
    Json(serde_json::json!({
        "unique": received.by_key.len(),
        "deliveries": deliveries,
        "duplicates": deliveries - received.by_key.len() as u64,
        "events": received.events,
    }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("RECEIVER_ADDR").unwrap_or_else(|_| "127.0.0.1:3001".to_owned());
    let delay = Duration::from_millis(
        std::env::var("RECEIVER_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let state: (Shared, Duration) = (Shared::default(), delay);
    let app = Router::new()
        .route("/events", post(receive).get(report))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("webhook-receiver listening on http://{addr}/events");
    axum::serve(listener, app).await?;
    Ok(())
}
