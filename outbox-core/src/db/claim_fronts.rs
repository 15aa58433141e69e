//! Where the last slow walk of a queue's claimable index found its first
//! task (migration 35; worker/claim_floor.rs says what it is for).

use std::time::Duration;

use sqlx::{PgConnection, Row};

use super::ClaimPosition;

/// The last slow walk of a queue's claimable index.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WalkedFront {
    /// The first task it found.
    pub(crate) front: ClaimPosition,
    /// How long it took.
    pub(crate) took: Duration,
    /// How long ago it ended.
    pub(crate) age: Duration,
}

/// The last slow walk of `queue`'s claimable index, if one was recorded.
pub(crate) async fn read(
    conn: &mut PgConnection,
    queue: &str,
) -> sqlx::Result<Option<WalkedFront>> {
    let Some(row) = sqlx::query(include_str!("sql/read_claim_front.sql"))
        .bind(queue)
        .fetch_optional(conn)
        .await?
    else {
        return Ok(None);
    };
    // A row made by hand with a time that is not one is no walk.
    let (Ok(took), Ok(age)) = (
        Duration::try_from_secs_f64(row.try_get::<f64, _>("walk_ms")? / 1000.0),
        Duration::try_from_secs_f64(row.try_get("age_s")?),
    ) else {
        return Ok(None);
    };
    Ok(Some(WalkedFront {
        front: ClaimPosition {
            priority: row.try_get("priority")?,
            execute_at: row.try_get("execute_at")?,
            id: row.try_get("id")?,
        },
        took,
        age,
    }))
}

/// Records that a walk of `queue`'s claimable index that took `took` and
/// ended `ago` found its first task at `front`.
pub(crate) async fn write(
    conn: &mut PgConnection,
    queue: &str,
    front: ClaimPosition,
    took: Duration,
    ago: Duration,
) -> sqlx::Result<()> {
    sqlx::query(include_str!("sql/write_claim_front.sql"))
        .bind(queue)
        .bind(front.priority)
        .bind(front.execute_at)
        .bind(front.id)
        .bind(took.as_secs_f64() * 1000.0)
        .bind(ago.as_secs_f64())
        .execute(conn)
        .await?;
    Ok(())
}
