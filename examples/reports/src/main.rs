//! Run with: cargo run -p reports-example
//! then:     curl -s -XPOST localhost:3002/reports -H 'content-type: application/json' \
//!               -d '{"from": "2026-01-01T00:00:00Z", "to": "2026-01-31T00:00:00Z"}'
//!           curl -s localhost:3002/reports/1
//!
//! The API and the worker in one process (they can as well run apart).
//! Uses DATABASE_URL when set, else a private PostgreSQL.

use std::time::Duration;

use outbox_worker::local_postgres::{LocalPostgres, LocalPostgresOptions};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _cluster) = LocalPostgres::url_or_start(
        std::env::var("DATABASE_URL").ok(),
        &LocalPostgresOptions::default(),
    )?;
    let addr = std::env::var("REPORTS_ADDR").unwrap_or_else(|_| "127.0.0.1:3002".to_owned());
    let pool = sqlx::PgPool::connect(&url).await?;
    reports_example::setup(&pool).await?;
    let shutdown = CancellationToken::new();
    let worker = reports_example::worker(pool.clone(), Duration::from_millis(200))?;
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("reports service on http://{addr}/reports (Ctrl-C to stop)");
    // SIGTERM (a service manager) as well as Ctrl-C. Either way the
    // private PostgreSQL goes with the process, when `_cluster` is dropped
    // at the end of main: later signals are ignored meanwhile, so that a
    // second Ctrl-C cannot cut that short.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = shutdown.clone();
    axum::serve(listener, reports_example::router(pool))
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            stop.cancel();
        })
        .await?;
    running.await??;
    Ok(())
}
