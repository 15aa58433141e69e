//! The workers table: each worker's own row, renewed with its heartbeat,
//! and the operator's list.

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};

use crate::records::{WorkerQueue, WorkerRecord};

/// What a worker says about itself.
#[derive(Debug, Clone)]
pub(crate) struct WorkerIdentity {
    pub(crate) id: String,
    pub(crate) host: String,
    pub(crate) pid: i32,
    /// JSON: the queues with their concurrency.
    pub(crate) queues: String,
}

/// Adds or renews the worker's row, alive for `ttl_us` more.
pub(crate) async fn register(
    conn: &mut PgConnection,
    me: &WorkerIdentity,
    first: bool,
    ttl_us: i64,
) -> sqlx::Result<()> {
    sqlx::query(include_str!("sql/register_worker.sql"))
        .bind(&me.id)
        .bind(&me.host)
        .bind(me.pid)
        .bind(&me.queues)
        .bind(first)
        .bind(ttl_us)
        .execute(conn)
        .await?;
    Ok(())
}

/// Declares task types for `outbox_submit` (SQL): their queue, priority,
/// attempts and how their unique and ordering keys come from a payload.
pub(crate) async fn declare_task_types(
    conn: &mut PgConnection,
    types: &[&crate::RegisteredTask],
) -> sqlx::Result<()> {
    if types.is_empty() {
        return Ok(());
    }
    let rows: Vec<serde_json::Value> = types
        .iter()
        .map(|t| {
            let unique = t.unique_decl.as_ref();
            serde_json::json!({
                "task_type": t.task_type,
                "queue": t.queue,
                "priority": t.priority,
                "max_attempts": crate::retry::max_attempts(t.retry_delays),
                "skip_dead": t.dead_skips_key,
                "unique_fields": unique.map(|u| u.fields),
                "unique_period_us": unique
                    .and_then(|u| u.period_ms)
                    .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX).saturating_mul(1000)),
                "unique_states": unique.map(|u| u.extra_states | crate::options::UNIQUE_ALWAYS),
                "ordering_field": t.ordering_field,
                "keys_from_payload": t.keys_from_payload,
            })
        })
        .collect();
    sqlx::query(include_str!("sql/declare_task_types.sql"))
        .bind(serde_json::Value::Array(rows))
        .execute(conn)
        .await?;
    Ok(())
}

/// Removes the worker's row (a clean shutdown).
pub(crate) async fn forget(conn: &mut PgConnection, id: &str) -> sqlx::Result<()> {
    sqlx::query(include_str!("sql/forget_worker.sql"))
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Removes the rows of workers expired for more than `after_us`.
pub(crate) async fn prune(conn: &mut PgConnection, after_us: i64) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(include_str!("sql/prune_workers.sql"))
        .bind(after_us)
        .fetch_all(conn)
        .await
}

fn worker(r: &PgRow) -> sqlx::Result<WorkerRecord> {
    let queues: String = r.try_get("queues")?;
    Ok(WorkerRecord {
        id: r.try_get("id")?,
        host: r.try_get("host")?,
        pid: r.try_get("pid")?,
        queues: serde_json::from_str::<Vec<WorkerQueue>>(&queues).unwrap_or_default(),
        started_at: r.try_get("started_at")?,
        last_seen_at: r.try_get("last_seen_at")?,
        expires_at: r.try_get("expires_at")?,
        alive: r.try_get("alive")?,
        leader: r.try_get("leader")?,
    })
}

/// Every worker that reported itself, live ones first.
pub(crate) async fn list(pool: &PgPool) -> sqlx::Result<Vec<WorkerRecord>> {
    let rows = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("sql/list_workers.sql"))
            .fetch_all(conn)
            .await
    })
    .await?;
    rows.iter().map(worker).collect()
}
