//! Test helpers for periodic tasks: run a tick now.

use sqlx::PgConnection;

use crate::db::{self, NewTask};
use crate::periodic::PeriodicTask;
use crate::task::TaskId;

/// Submits, in `conn`'s transaction, the task one tick of `periodic`
/// enqueues (its type, queue, priority, attempts and payload), due now,
/// without waiting for the schedule or a maintenance leader; returns its
/// id. [`super::drain`] then runs it. The schedule itself is checked with
/// `periodic.schedule().next_after(t)`.
pub async fn tick(conn: &mut PgConnection, periodic: &PeriodicTask) -> TaskId {
    let task = NewTask {
        task_type: periodic.task_type.clone(),
        queue: periodic.queue.clone(),
        payload: periodic.payload.clone(),
        priority: periodic.priority,
        max_attempts: periodic.max_attempts,
        run_at: None,
        delay_us: None,
        unique: None,
        ordering_key: periodic.ordering_key.clone(),
        skip_dead: periodic.skip_dead,
    };
    let ids = db::insert_tasks(conn, vec![task], vec![periodic.queue.clone()])
        .await
        .unwrap_or_else(|e| panic!("submit a tick of {:?}: {e}", periodic.name));
    TaskId(ids[0])
}
