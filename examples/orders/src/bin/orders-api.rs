//! Run with: DATABASE_URL=postgres://... cargo run -p orders-example --bin orders-api
//!
//! `POST /orders {"customer": "...", "amount_cents": N}` inserts the order and
//! submits its `order.created` task in ONE transaction, then answers 201.
//! Either both are saved or neither: no lost or phantom events.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use orders_example::OrderCreated;
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
    let fail = |e: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    if order.amount_cents <= 0 {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount_cents must be positive".into(),
        ));
    }
    let mut tx = pool.begin().await.map_err(|e| fail(&e))?;
    let order_id: i64 = sqlx::query_scalar(
        "INSERT INTO orders (customer, amount_cents) VALUES ($1, $2) RETURNING id",
    )
    .bind(&order.customer)
    .bind(order.amount_cents)
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| fail(&e))?;
    let event = OrderCreated {
        order_id,
        customer: order.customer,
        amount_cents: order.amount_cents,
    };
    let task_id = outbox::submit(&mut tx, event).await.map_err(|e| fail(&e))?;
    tx.commit().await.map_err(|e| fail(&e))?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "order_id": order_id, "task_id": task_id })),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let addr = std::env::var("ORDERS_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    // One connection first: a database that is not there is named with
    // its cause within seconds, where the pool would retry for 30 s and
    // report only that it timed out.
    let first = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        <sqlx::PgConnection as sqlx::Connection>::connect(&url),
    )
    .await
    .map_err(|_| "no answer from the database at DATABASE_URL within 5 s")?
    .map_err(|e| format!("cannot connect to the database at DATABASE_URL: {e}"))?;
    sqlx::Connection::close(first).await?;
    let pool = PgPool::connect(&url).await?;
    orders_example::setup(&pool).await?;
    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(pool);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("orders-api listening on http://{addr}");
    axum::serve(listener, app).await?;
    Ok(())
}
