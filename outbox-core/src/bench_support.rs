//! What `outbox-worker bench` needs to time the engine's own statements.
//! Not a stable API.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::db;
use crate::error::Result;

/// Runs the real claim statement of `queue` for up to `limit` tasks, then
/// releases what it took (no attempt counted); returns how many it claimed
/// and how long the claim statement took. Each key's head is claimed alone
/// (no run behind it).
pub async fn claim_and_release(
    pool: &PgPool,
    queue: &str,
    limit: usize,
) -> Result<(usize, Duration)> {
    let mut conn = pool.acquire().await?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let token: Arc<str> = Arc::from(format!("bench/{}/{n}", std::process::id()));
    let started = Instant::now();
    let claimed = db::claim_tasks(
        &mut conn,
        queue,
        limit,
        &token,
        None,
        db::ClaimStart::FRONT,
        1,
        None,
    )
    .await?
    .tasks;
    let took = started.elapsed();
    db::release_claims(&mut conn, &[token]).await?;
    Ok((claimed.len(), took))
}

/// A new event id, as `emit` makes them (the bench's control row gets one
/// made the same way, so both pay the same).
pub fn new_event_id() -> String {
    crate::events::new_event_id()
}
