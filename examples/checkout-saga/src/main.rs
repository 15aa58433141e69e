//! Run with: cargo run -p checkout-saga
//!
//! Places two orders for lamps (5 in stock): one for 2, which is charged,
//! reserved and shipped; one for 10, whose reservation fails, so its charge
//! is refunded. Prints each saga's steps. Uses DATABASE_URL when set, else
//! a private PostgreSQL.

use std::time::Duration;

use checkout_saga::{place_order, register, setup, wait_for_end};
use outbox::Worker;
use outbox_worker::local_postgres::{LocalPostgres, LocalPostgresOptions};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _cluster) = LocalPostgres::url_or_start(
        std::env::var("DATABASE_URL").ok(),
        &LocalPostgresOptions::default(),
    )?;
    let pool = sqlx::PgPool::connect(&url).await?;
    setup(&pool).await?;
    let base: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM orders")
        .fetch_one(&pool)
        .await?;
    let fits = place_order(&pool, base + 1, "lamp", 2, 3998).await?;
    let too_many = place_order(&pool, base + 2, "lamp", 10, 19990).await?;

    let worker = register(Worker::builder(pool.clone())).build()?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    for id in [fits, too_many] {
        let state = wait_for_end(&pool, id, Duration::from_secs(60)).await?;
        let status = outbox::workflow::workflow_status(&pool, id)
            .await?
            .expect("the workflow");
        println!("workflow {id}: {state}");
        for step in &status.step_list {
            let error = step.last_error.as_deref().unwrap_or("");
            println!("  {:<14} {:<10} {error}", step.name, step.state);
        }
    }
    stop.cancel();
    running.await??;
    Ok(())
}
