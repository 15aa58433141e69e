//! Statements about events' side tables: the inbox and the Debezium mirror.

use sqlx::PgConnection;

/// Deletes up to `limit` inbox records and `limit` mirror rows older than
/// `retention_us`; returns how many in all.
pub(crate) async fn prune(
    conn: &mut PgConnection,
    retention_us: i64,
    limit: i64,
) -> sqlx::Result<u64> {
    let inbox = prune_inbox(&mut *conn, retention_us, limit).await?;
    let mirror = sqlx::query(
        "DELETE FROM outbox_events WHERE id = ANY (ARRAY(SELECT id FROM outbox_events \
         WHERE created_at < now() - make_interval(secs => $1::float8 / 1e6) LIMIT $2))",
    )
    .bind(retention_us)
    .bind(limit)
    .execute(conn)
    .await?;
    Ok(inbox + mirror.rows_affected())
}

/// Deletes up to `limit` inbox records older than `retention_us`.
pub(crate) async fn prune_inbox(
    conn: &mut PgConnection,
    retention_us: i64,
    limit: i64,
) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "DELETE FROM outbox_inbox WHERE ctid = ANY (ARRAY(SELECT ctid FROM outbox_inbox \
         WHERE processed_at < now() - make_interval(secs => $1::float8 / 1e6) LIMIT $2))",
    )
    .bind(retention_us)
    .bind(limit)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}
