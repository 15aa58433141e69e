//! Queue settings in the database: what workers read before they claim,
//! the claim of a queue with limits, and the operator's changes.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};

use super::{ClaimedTask, claimed_task};
use crate::records::{QueueChange, QueueDeletion, QueueSettings};

fn settings(r: &PgRow) -> sqlx::Result<QueueSettings> {
    Ok(QueueSettings {
        name: r.try_get("name")?,
        paused_at: r.try_get("paused_at")?,
        global_concurrency: r.try_get("global_concurrency")?,
        rate_per_second: r.try_get("rate_per_second")?,
        per_key_concurrency: r.try_get("per_key_concurrency")?,
        updated_at: r.try_get("updated_at")?,
    })
}

/// Adds `queue`'s row if missing and returns its settings.
pub(crate) async fn serve_queue(
    conn: &mut PgConnection,
    queue: &str,
) -> sqlx::Result<QueueSettings> {
    let row = sqlx::query(include_str!("sql/serve_queue.sql"))
        .bind(queue)
        .fetch_one(conn)
        .await?;
    settings(&row)
}

/// TX1 of a queue with a global concurrency or a rate: one statement that
/// moves tasks of the intake above `intake_above` (none when `None`), takes
/// the queue's row, then claims what the limits allow. Also says whether
/// the limits (or a pause) let it take fewer than `limit`, and how far the
/// move of the intake went.
pub(crate) async fn claim_limited(
    conn: &mut PgConnection,
    queue: &str,
    limit: usize,
    token: &Arc<str>,
    now: Option<DateTime<Utc>>,
    intake_above: Option<i64>,
) -> sqlx::Result<(Vec<ClaimedTask>, bool, Option<i64>)> {
    let rows = sqlx::query(include_str!("sql/claim_limited.sql"))
        .bind(queue)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(token.to_string())
        .bind(now)
        .bind(intake_above)
        .fetch_all(conn)
        .await?;
    let allowed: i64 = match rows.first() {
        Some(r) => r.try_get("allowed")?,
        // Paused (or the row vanished): held back.
        None => 0,
    };
    let tasks = rows
        .iter()
        .filter(|r| matches!(r.try_get::<Option<i64>, _>("id"), Ok(Some(_))))
        .map(|r| claimed_task(r, token))
        .collect::<sqlx::Result<Vec<_>>>()?;
    // Held back: the limits allowed fewer than asked, and all of those were
    // taken (had the queue run out first, it is simply empty).
    let taken = i64::try_from(tasks.len()).unwrap_or(i64::MAX);
    let held_back = allowed < i64::try_from(limit).unwrap_or(i64::MAX) && taken >= allowed;
    Ok((tasks, held_back, super::intake_moved_to(&rows)?))
}

/// Every queue's settings, by name.
pub(crate) async fn list(pool: &PgPool) -> sqlx::Result<Vec<QueueSettings>> {
    let rows = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("sql/list_queues.sql"))
            .fetch_all(conn)
            .await
    })
    .await?;
    rows.iter().map(settings).collect()
}

/// Applies `change` to `queue` (adding its row if needed), wakes its
/// workers, and after a change of per-key concurrency hands keys with
/// waiting tasks to as many as now may run.
pub(crate) async fn set(
    pool: &PgPool,
    queue: &str,
    change: &QueueChange,
) -> sqlx::Result<QueueSettings> {
    let set = sqlx::query(include_str!("sql/set_queue.sql"))
        .bind(queue)
        .bind(change.paused)
        .bind(change.global_concurrency.is_some())
        .bind(change.global_concurrency.flatten())
        .bind(change.rate_per_second.is_some())
        .bind(change.rate_per_second.flatten())
        .bind(change.per_key_concurrency);
    let row = crate::pooler::on(pool, async |conn| set.fetch_one(conn).await).await?;
    if change.per_key_concurrency.is_some() {
        let taken = take_back_key_places(pool, queue).await?;
        if taken > 0 {
            tracing::info!(
                queue,
                taken,
                "tasks wait for their key again under the lower per-key concurrency"
            );
        }
        crate::pooler::on(pool, async |conn| advance_keys(conn, Some(queue)).await).await?;
    }
    settings(&row)
}

/// After a change of `queue`'s per-key concurrency (committed: every
/// hand-over from then on reads it), takes back the places of tasks not
/// started beyond it: locks the keys that have too many holders, in the
/// order hand-overs lock them, then re-blocks the excess in a statement of
/// its own, whose snapshot sees what hand-overs did while it waited.
/// Returns how many tasks were taken back.
async fn take_back_key_places(pool: &PgPool, queue: &str) -> sqlx::Result<i64> {
    let mut tx = crate::pooler::begin(pool).await?;
    let keys: Vec<String> = sqlx::query_scalar(include_str!("sql/lock_crowded_keys.sql"))
        .bind(queue)
        .fetch_all(&mut *tx)
        .await?;
    if keys.is_empty() {
        return Ok(0);
    }
    let taken = sqlx::query_scalar(include_str!("sql/take_back_key_places.sql"))
        .bind(queue)
        .bind(&keys)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(taken)
}

/// Deletes `queue`'s settings row unless a live worker serves the queue or
/// tasks wait or run on it (delete_queue.sql).
pub(crate) async fn delete(pool: &PgPool, queue: &str) -> sqlx::Result<QueueDeletion> {
    let row = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("sql/delete_queue.sql"))
            .bind(queue)
            .fetch_one(conn)
            .await
    })
    .await?;
    let served: i64 = row.try_get("served")?;
    Ok(if !row.try_get::<bool, _>("found")? {
        QueueDeletion::NotFound
    } else if row.try_get("deleted")? {
        QueueDeletion::Deleted
    } else if served > 0 {
        QueueDeletion::Served(served)
    } else {
        QueueDeletion::Unfinished
    })
}

/// Hands keys with waiting tasks and a free place to their next tasks;
/// returns how many tasks were released.
pub(crate) async fn advance_keys<'c, E>(conn: E, queue: Option<&str>) -> sqlx::Result<i64>
where
    E: sqlx::PgExecutor<'c>,
{
    sqlx::query_scalar(include_str!("sql/advance_keys.sql"))
        .bind(queue)
        .fetch_one(conn)
        .await
}

/// Deletes up to `limit` lock rows of keys added over a day ago that have
/// no unfinished tasks; returns how many.
pub(crate) async fn prune_keys(conn: &mut PgConnection, limit: i64) -> sqlx::Result<u64> {
    let done = sqlx::query(include_str!("sql/prune_keys.sql"))
        .bind(limit)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}
