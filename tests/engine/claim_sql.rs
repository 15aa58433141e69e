//! The worker's claim statement called directly, as the worker calls it,
//! for tests that drive claims and outcomes by hand.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::postgres::PgRow;

const CLAIM: &str = include_str!("../../outbox-core/src/db/sql/claim_tasks.sql");

/// Claims up to `n` due tasks of `queue` under `token`, reading the claim
/// order from its front, each key's head with up to `key_run - 1` tasks
/// behind it, moving nothing from the intake: the rows the statement
/// returns.
pub(crate) async fn claim(
    conn: &mut PgConnection,
    queue: &str,
    n: i64,
    token: &str,
    key_run: i32,
) -> Vec<PgRow> {
    sqlx::query(CLAIM)
        .bind(queue)
        .bind(n)
        .bind(token)
        .bind(None::<DateTime<Utc>>)
        .bind(-1_i16)
        .bind(DateTime::UNIX_EPOCH)
        .bind(0_i64)
        .bind(None::<DateTime<Utc>>)
        .bind(None::<i64>)
        .bind(key_run)
        .bind(0_i64)
        .fetch_all(conn)
        .await
        .unwrap()
}
