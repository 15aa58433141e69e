//! Run with: cargo run -p idempotent-effect
//!
//! Submits a payment task, then executes it three times (twice by hand, as
//! duplicate deliveries would, and once by a real worker) and shows that
//! one payment was written. Uses DATABASE_URL when set, else a private
//! PostgreSQL.

use std::time::Duration;

use idempotent_effect::{Capture, CapturePayment, payments_for, setup};
use outbox::Worker;
use outbox_worker::local_postgres::{LocalPostgres, LocalPostgresOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _cluster) = LocalPostgres::url_or_start(
        std::env::var("DATABASE_URL").ok(),
        &LocalPostgresOptions::default(),
    )?;
    let pool = sqlx::PgPool::connect(&url).await?;
    setup(&pool).await?;
    let task = CapturePayment {
        invoice_id: 1001,
        amount_cents: 4200,
    };
    let id = outbox::submit(&mut *pool.acquire().await?, task).await?;
    println!("submitted payment.capture as task {id}");

    outbox::testing::run_inline(&pool, id, &Capture)
        .await
        .map_err(|e| e.to_string())?;
    outbox::testing::run_inline(&pool, id, &Capture)
        .await
        .map_err(|e| e.to_string())?;
    let worker = Worker::builder(pool.clone())
        .handler::<CapturePayment>(Capture)
        .build()?;
    outbox::testing::drain(worker, Duration::from_secs(30)).await;

    let payments = payments_for(&pool, 1001).await?;
    println!("the task ran 3 times; payments written for invoice 1001: {payments}");
    assert_eq!(payments, 1);
    Ok(())
}
