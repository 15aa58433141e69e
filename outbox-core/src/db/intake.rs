//! The intake (migration 31): the narrow table a single submit of a task
//! due now, with no ordering key, appends to in the caller's transaction.
//! Claims move it into `outbox_tasks` first thing (claim_tasks.sql,
//! claim_limited.sql); these move it from elsewhere.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgConnection;

/// The most tasks of the intake a maintenance round moves: a backstop for
/// tasks that no claim moved (no worker is claiming at all).
pub(crate) const PER_ROUND: i64 = 10_000;

/// How far below the highest id a worker's claims moved the next claim
/// starts reading: submits commit in about the order they drew their ids,
/// give or take the transactions open at once.
const MARGIN: i64 = 10_000;

/// How often a claim reads the intake from its first row, for the tasks of
/// transactions that committed long after they drew their ids.
const WALK_EVERY: Duration = Duration::from_secs(1);

/// Where a worker's claims read the intake from: above the ids its claims
/// moved, less [`MARGIN`], and from the first row every [`WALK_EVERY`].
///
/// Every row a move deletes leaves an index entry that a snapshot held
/// open elsewhere (a report, `pg_dump`) keeps until it ends; a move that
/// read from the first row would step over all of them, every claim
/// (300,000 of them, five minutes of submits at 1,000/s, took 16 ms). The
/// floor only decides where a read starts: a task below it waits for the
/// next walk, a second at most.
#[derive(Debug)]
pub(crate) struct IntakeFloor(Mutex<Floor>);

#[derive(Debug)]
struct Floor {
    /// The highest id a claim moved.
    moved_to: i64,
    /// When a claim last read from the first row.
    walked: Option<Instant>,
}

impl Default for IntakeFloor {
    fn default() -> Self {
        Self(Mutex::new(Floor {
            moved_to: 0,
            walked: None,
        }))
    }
}

impl IntakeFloor {
    /// The id the next claim reads the intake above.
    pub(crate) fn above(&self, now: Instant) -> i64 {
        let mut floor = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if floor
            .walked
            .is_none_or(|at| now.saturating_duration_since(at) >= WALK_EVERY)
        {
            floor.walked = Some(now);
            return 0;
        }
        floor.moved_to.saturating_sub(MARGIN).max(0)
    }

    /// A claim moved the intake up to id `to`.
    pub(crate) fn moved(&self, to: Option<i64>) {
        if let Some(to) = to {
            let mut floor = self.0.lock().unwrap_or_else(|e| e.into_inner());
            floor.moved_to = floor.moved_to.max(to);
        }
    }
}

/// Moves up to `wanted` committed tasks of the intake into `outbox_tasks`,
/// from its first row, passing over those another transaction is moving,
/// and wakes the workers of their queues at commit. Returns the highest
/// id moved.
pub(crate) async fn take(conn: &mut PgConnection, wanted: i64) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar("SELECT outbox_take_intake($1, 0, NULL)")
        .bind(wanted)
        .fetch_one(conn)
        .await
}

/// Moves those of tasks `ids` still in the intake into `outbox_tasks`,
/// waiting for a claim moving one of them: the caller's next statement
/// finds each in `outbox_tasks`. For a cancel, in a transaction of its
/// own (in a caller's REPEATABLE READ transaction, a row a claim moved
/// after its snapshot would fail it with a serialization error). Returns
/// the highest id moved.
pub(crate) async fn take_ids(conn: &mut PgConnection, ids: &[i64]) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar("SELECT outbox_take_intake_ids($1)")
        .bind(ids)
        .fetch_one(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_from_the_first_row_every_second_and_below_the_moves_between() {
        let floor = IntakeFloor::default();
        let t0 = Instant::now();
        assert_eq!(floor.above(t0), 0, "the first claim walks");
        floor.moved(Some(50_000));
        floor.moved(None);
        floor.moved(Some(20_000));
        assert_eq!(floor.above(t0 + Duration::from_millis(10)), 40_000);
        assert_eq!(floor.above(t0 + WALK_EVERY), 0, "a second later, a walk");
        assert_eq!(
            floor.above(t0 + WALK_EVERY + Duration::from_millis(1)),
            40_000
        );
        floor.moved(Some(5));
        assert_eq!(
            floor.above(t0 + WALK_EVERY + Duration::from_millis(2)),
            40_000
        );
    }
}
