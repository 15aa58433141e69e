//! Operator queries: listing, inspecting, retrying and cancelling tasks,
//! and the counts behind `stats` and the gauges.

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};

use crate::records::{
    MinuteThroughput, Overview, QueueHealth, QueueOverview, TableHealth, TaskFilter, TaskRecord,
    TypeStateCount,
};

fn record(r: &PgRow) -> sqlx::Result<TaskRecord> {
    let payload: String = r.try_get("payload")?;
    Ok(TaskRecord {
        id: r.try_get("id")?,
        task_type: r.try_get("task_type")?,
        queue: r.try_get("queue")?,
        state: r.try_get("state")?,
        priority: r.try_get("priority")?,
        retry_count: r.try_get("retry_count")?,
        max_attempts: r.try_get("max_attempts")?,
        claims: r.try_get("claims")?,
        execute_at: r.try_get("execute_at")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        finished_at: r.try_get("finished_at")?,
        dead_at: r.try_get("dead_at")?,
        claimed_by: r.try_get("claimed_by")?,
        heartbeat_at: r.try_get("heartbeat_at")?,
        last_error: r.try_get("last_error")?,
        unique_key: r.try_get("unique_key")?,
        ordering_key: r.try_get("ordering_key")?,
        key_seq: r.try_get("key_seq")?,
        blocked: r.try_get("blocked")?,
        skip_dead: r.try_get("skip_dead")?,
        attempted_at: r.try_get("attempted_at")?,
        result: r
            .try_get::<Option<String>, _>("result")?
            .map(|t| serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t))),
        payload: serde_json::from_str(&payload).unwrap_or(serde_json::Value::String(payload)),
    })
}

pub(crate) async fn get_task(pool: &PgPool, id: i64) -> sqlx::Result<Option<TaskRecord>> {
    let row = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("sql/get_task.sql"))
            .bind(id)
            .fetch_optional(conn)
            .await
    })
    .await?;
    row.as_ref().map(record).transpose()
}

pub(crate) async fn retry_tasks(
    pool: &PgPool,
    ids: Option<Vec<i64>>,
    dead_of_type: Option<&str>,
) -> sqlx::Result<Vec<i64>> {
    crate::pooler::on(pool, async |conn| {
        sqlx::query_scalar(include_str!("sql/retry_tasks.sql"))
            .bind(ids)
            .bind(dead_of_type.map(str::to_owned))
            .fetch_all(conn)
            .await
    })
    .await
}

/// Moves completed tasks `ids` back from the history to run again
/// (revive_completed.sql says which); returns the ids moved.
pub(crate) async fn revive_completed(pool: &PgPool, ids: Vec<i64>) -> sqlx::Result<Vec<i64>> {
    crate::pooler::on(pool, async |conn| {
        sqlx::query_scalar(include_str!("sql/revive_completed.sql"))
            .bind(&ids)
            .fetch_all(conn)
            .await
    })
    .await
}

/// The signals sent to task `id`: (name, value, sent at).
pub(crate) async fn task_signals(
    pool: &PgPool,
    id: i64,
) -> sqlx::Result<
    Vec<(
        String,
        sqlx::types::Json<serde_json::Value>,
        chrono::DateTime<chrono::Utc>,
    )>,
> {
    crate::pooler::on(pool, async |conn| {
        sqlx::query_as(include_str!("sql/task_signals.sql"))
            .bind(id)
            .fetch_all(conn)
            .await
    })
    .await
}

/// Why each of `ids` was not retried, read as the task is now, in the
/// order given.
pub(crate) async fn retry_refusals(
    pool: &PgPool,
    ids: Vec<i64>,
) -> sqlx::Result<Vec<(i64, String)>> {
    crate::pooler::on(pool, async |conn| {
        sqlx::query_as(include_str!("sql/retry_refusals.sql"))
            .bind(&ids)
            .fetch_all(conn)
            .await
    })
    .await
}

/// Cancels tasks `ids` inside the caller's transaction: moves those still
/// in the intake into outbox_tasks, locks them
/// (cancel_lock.sql), then cancels each by the state it has under the lock
/// (cancel_tasks.sql), in a statement of its own: one statement for both
/// judged a task changed while it waited by its state before the wait.
pub(crate) async fn cancel_tasks(conn: &mut PgConnection, ids: Vec<i64>) -> sqlx::Result<Vec<i64>> {
    super::intake::take_ids(&mut *conn, &ids).await?;
    let locked: Vec<(i64, bool)> = sqlx::query_as(include_str!("sql/cancel_lock.sql"))
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
    // The tasks judged waiting under the lock: only those may be made dead
    // at once (cancel_tasks.sql).
    let waiting: Vec<i64> = locked
        .into_iter()
        .filter_map(|(id, waiting)| waiting.then_some(id))
        .collect();
    sqlx::query_scalar(include_str!("sql/cancel_tasks.sql"))
        .bind(ids)
        .bind(waiting)
        .fetch_all(conn)
        .await
}

pub(crate) async fn count_by_type_and_state(pool: &PgPool) -> sqlx::Result<Vec<TypeStateCount>> {
    let rows: Vec<(String, String, i64)> = crate::pooler::on(pool, async |conn| {
        sqlx::query_as(include_str!("sql/count_by_type_and_state.sql"))
            .fetch_all(conn)
            .await
    })
    .await?;
    Ok(rows
        .into_iter()
        .map(|(task_type, state, count)| TypeStateCount {
            task_type,
            state,
            count,
        })
        .collect())
}

pub(crate) async fn queue_health(pool: &PgPool) -> sqlx::Result<QueueHealth> {
    type Row = (i64, i64, i64, i64, i64, f64, f64);
    let (
        claimable,
        scheduled,
        blocked,
        processing,
        dead,
        oldest_claimable_age_s,
        oldest_heartbeat_age_s,
    ): Row = crate::pooler::on(pool, async |conn| {
        sqlx::query_as(include_str!("sql/queue_health.sql"))
            .fetch_one(conn)
            .await
    })
    .await?;
    Ok(QueueHealth {
        claimable,
        scheduled,
        blocked,
        processing,
        dead,
        oldest_claimable_age_s,
        oldest_heartbeat_age_s,
        table: crate::pooler::on(pool, async |conn| table_health(conn).await).await?,
    })
}

/// Dead row versions in the task table and the oldest open snapshot.
pub(crate) async fn table_health(conn: &mut PgConnection) -> sqlx::Result<TableHealth> {
    let (dead_tuples, live_tuples, age, oldest_snapshot_holder): (
        i64,
        i64,
        Option<f64>,
        Option<String>,
    ) = sqlx::query_as(include_str!("sql/table_health.sql"))
        .fetch_one(conn)
        .await?;
    Ok(TableHealth {
        dead_tuples,
        live_tuples,
        oldest_snapshot_age_s: age.unwrap_or(0.0).max(0.0),
        oldest_snapshot_holder,
    })
}

pub(crate) async fn search_tasks(
    pool: &PgPool,
    filter: &TaskFilter,
    pattern: Option<String>,
    limit: i64,
) -> sqlx::Result<Vec<TaskRecord>> {
    let rows = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("sql/search_tasks.sql"))
            .bind(filter.state.as_deref())
            .bind(filter.task_type.as_deref())
            .bind(filter.queue.as_deref())
            .bind(filter.id)
            .bind(pattern)
            .bind(filter.before)
            .bind(limit)
            .bind(filter.without_payload)
            .fetch_all(conn)
            .await
    })
    .await?;
    rows.iter().map(record).collect()
}

pub(crate) async fn overview(pool: &PgPool) -> sqlx::Result<Overview> {
    let queues = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("sql/overview_queues.sql"))
            .fetch_all(conn)
            .await
    })
    .await?
    .iter()
    .map(|r| {
        Ok(QueueOverview {
            queue: r.try_get("queue")?,
            available: r.try_get("available")?,
            scheduled: r.try_get("scheduled")?,
            retrying: r.try_get("retrying")?,
            blocked: r.try_get("blocked")?,
            processing: r.try_get("processing")?,
            dead: r.try_get("dead")?,
            completed_last_hour: r.try_get("completed_last_hour")?,
            failed_last_hour: r.try_get("failed_last_hour")?,
            oldest_available_age_s: r.try_get("oldest_available_age_s")?,
        })
    })
    .collect::<sqlx::Result<Vec<_>>>()?;
    let last_hour = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("sql/throughput_last_hour.sql"))
            .fetch_all(conn)
            .await
    })
    .await?
    .iter()
    .map(|r| {
        Ok(MinuteThroughput {
            minute: r.try_get("minute")?,
            queue: r.try_get("queue")?,
            completed: r.try_get("completed")?,
            failed: r.try_get("failed")?,
        })
    })
    .collect::<sqlx::Result<Vec<_>>>()?;
    let completed_estimate = crate::pooler::on(pool, async |conn| {
        sqlx::query_scalar(include_str!("sql/completed_estimate.sql"))
            .fetch_one(conn)
            .await
    })
    .await?;
    Ok(Overview {
        queues,
        last_hour,
        completed_estimate,
    })
}

/// The task table's dead and live row estimates, and whether this role may
/// vacuum it.
pub(crate) async fn vacuum_due(conn: &mut PgConnection) -> sqlx::Result<(i64, i64, bool)> {
    sqlx::query_as(include_str!("sql/vacuum_due.sql"))
        .fetch_one(conn)
        .await
}

/// Vacuums the task table under a statement timeout of `timeout`, then puts
/// the session's own timeout (`restore`) back, whatever the vacuum did.
/// While it runs the server checks every second that the client is still
/// there (PostgreSQL 14 and later; older servers refuse the setting, and
/// the timeout alone bounds a vacuum whose worker went away).
pub(crate) async fn vacuum_tasks(
    conn: &mut PgConnection,
    timeout: std::time::Duration,
    restore: std::time::Duration,
) -> sqlx::Result<()> {
    let set = |d: std::time::Duration| format!("SET statement_timeout = {}", d.as_millis().max(1));
    sqlx::raw_sql(sqlx::AssertSqlSafe(set(timeout)))
        .execute(&mut *conn)
        .await?;
    let checked = sqlx::raw_sql("SET client_connection_check_interval = 1000")
        .execute(&mut *conn)
        .await
        .is_ok();
    let vacuumed = sqlx::raw_sql(include_str!("sql/vacuum_tasks.sql"))
        .execute(&mut *conn)
        .await;
    if checked {
        sqlx::raw_sql("SET client_connection_check_interval = 0")
            .execute(&mut *conn)
            .await?;
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(set(restore)))
        .execute(&mut *conn)
        .await?;
    vacuumed.map(|_| ())
}
