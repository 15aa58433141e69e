//! Run with: DATABASE_URL=postgres://... cargo run -p events-example --bin events-service
//!
//! `POST /orders {"customer": "...", "amount_cents": N}` saves the order and
//! emits its `order.placed` event in ONE transaction, then answers 201.
//! Relay the events with the stock worker, built with the NATS client (this
//! example's `events-worker` binary is that build):
//!     cargo run -p events-example --bin events-worker -- \
//!         run --relay 'nats=nats://127.0.0.1:4222?stream=EVENTS'

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use sqlx::PgPool;

#[derive(Debug, Deserialize)]
struct NewOrder {
    customer: String,
    amount_cents: i64,
}

async fn create_order(
    State(pool): State<PgPool>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<serde_json::Value>), (StatusCode, String)> {
    if order.amount_cents <= 0 || order.customer.is_empty() {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "a customer and a positive amount_cents, please".into(),
        ));
    }
    let id = events_example::place_order(&pool, &order.customer, order.amount_cents)
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "order_id": id })),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let pool = PgPool::connect(&url).await?;
    events_example::setup(&pool).await?;
    let addr = std::env::var("EVENTS_ADDR").unwrap_or_else(|_| "127.0.0.1:3002".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("events service on http://{addr}/orders");
    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(pool);
    axum::serve(listener, app).await?;
    Ok(())
}
