//! Reading workflows back (`workflows list` / `show`, the dashboard) and
//! cancelling one.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

use super::WorkflowId;
use crate::error::Result;
use crate::task::TaskId;

/// A workflow as `workflows list` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkflowSummary {
    /// Its id.
    pub id: WorkflowId,
    /// The name given to `Workflow::new`.
    pub name: String,
    /// running, completed, failed, compensating, compensated or
    /// compensation_failed.
    pub state: String,
    /// Steps, compensations included once added.
    pub steps: i32,
    /// Steps not finished yet.
    pub open_steps: i32,
    /// When it was submitted.
    pub created_at: DateTime<Utc>,
    /// When it reached its final state.
    pub finished_at: Option<DateTime<Utc>>,
    /// When an operator cancelled it (`workflows cancel`), if one did
    /// before it ended. A retry of a cancelled workflow's dead forward step
    /// runs that task on its own, and the forward steps the cancel stopped
    /// stay cancelled; a retried compensation resumes the compensation.
    pub cancelled_at: Option<DateTime<Utc>>,
}

/// One step of a workflow, as `workflows show` prints it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepStatus {
    /// The step's name (`undo:NAME` for the compensation of step NAME).
    pub name: String,
    /// waiting, released (its task exists: see `task_state`), completed,
    /// skipped, dead or cancelled.
    pub state: String,
    /// The task type it runs.
    pub task_type: String,
    /// The steps it depends on.
    pub after: Vec<String>,
    /// Its task, once released.
    pub task_id: Option<TaskId>,
    /// The task's state: pending, processing, failed or dead while it is
    /// live, completed once it is in the history.
    pub task_state: Option<String>,
    /// When the live task is due (pending, or failed and waiting for its
    /// retry).
    pub due_at: Option<DateTime<Utc>>,
    /// Failed attempts of the live task.
    pub retry_count: Option<i32>,
    /// The live task's last error.
    pub last_error: Option<String>,
    /// For a compensation: the step it undoes.
    pub compensates: Option<String>,
    /// Whether it declared a compensation.
    pub has_compensation: bool,
    /// When it reached its final state.
    pub finished_at: Option<DateTime<Utc>>,
    /// What its handler returned (`Outcome::success_with`), once completed.
    pub result: Option<serde_json::Value>,
}

/// A workflow with its steps.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkflowStatus {
    /// The workflow.
    #[serde(flatten)]
    pub workflow: WorkflowSummary,
    /// Its steps in the order they were added (compensations last).
    pub step_list: Vec<StepStatus>,
}

/// The latest workflows, newest first, optionally only those in `state`
/// (`"cancelled"`: those an operator cancelled, whatever state they ended in).
pub async fn list(pool: &PgPool, state: Option<&str>, limit: i64) -> Result<Vec<WorkflowSummary>> {
    let rows = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("../db/sql/list_workflows.sql"))
            .bind(state)
            .bind(limit)
            .fetch_all(conn)
            .await
    })
    .await?;
    rows.iter().map(summary).collect()
}

/// Workflow `id` with every step, or `None` if there is no such workflow.
pub async fn workflow_status(pool: &PgPool, id: WorkflowId) -> Result<Option<WorkflowStatus>> {
    // Both reads in one transaction: through a pooler, on one server.
    let mut conn = crate::pooler::begin(pool).await?;
    let Some(row) = sqlx::query(include_str!("../db/sql/get_workflow.sql"))
        .bind(id.0)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let workflow = summary(&row)?;
    let rows = sqlx::query(include_str!("../db/sql/workflow_steps.sql"))
        .bind(id.0)
        .fetch_all(&mut *conn)
        .await?;
    let step_list = rows
        .iter()
        .map(|r| {
            Ok(StepStatus {
                name: r.try_get("name")?,
                state: r.try_get("state")?,
                task_type: r.try_get("task_type")?,
                after: r.try_get("after")?,
                task_id: r.try_get::<Option<i64>, _>("task_id")?.map(TaskId),
                task_state: r.try_get("task_state")?,
                due_at: r.try_get("due_at")?,
                retry_count: r.try_get("retry_count")?,
                last_error: r.try_get("last_error")?,
                compensates: r.try_get("compensates")?,
                has_compensation: r.try_get("has_compensation")?,
                finished_at: r.try_get("finished_at")?,
                result: r
                    .try_get::<Option<sqlx::types::Json<serde_json::Value>>, _>("result")?
                    .map(|j| j.0),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(WorkflowStatus {
        workflow,
        step_list,
    }))
}

/// What [`cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CancelReport {
    /// Waiting steps cancelled (they never run).
    pub steps_cancelled: i64,
    /// Released tasks cancelled (pending ones at once, running ones asked
    /// to stop, as `tasks cancel` does).
    pub tasks_cancelled: i64,
}

/// Cancels workflow `id`: its waiting steps never run and its released
/// tasks are cancelled. A saga then compensates its completed steps. `None`
/// if there is no such workflow.
pub async fn cancel(pool: &PgPool, id: WorkflowId) -> Result<Option<CancelReport>> {
    let mut tries = 0;
    loop {
        let mut tx = crate::pooler::begin(pool).await?;
        match cancel_in(&mut tx, id).await {
            Ok(report) => {
                tx.commit().await?;
                return Ok(report);
            }
            Err(error) if crate::db::run_again(&error, &mut tries) => {}
            Err(error) => return Err(error.into()),
        }
    }
}

/// [`cancel`] in the caller's transaction.
async fn cancel_in(
    conn: &mut sqlx::PgConnection,
    id: WorkflowId,
) -> sqlx::Result<Option<CancelReport>> {
    let Some(row) = sqlx::query(include_str!("../db/sql/cancel_workflow.sql"))
        .bind(id.0)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let steps_cancelled: i64 = row.try_get("steps_cancelled")?;
    let tasks: Vec<i64> = row.try_get("tasks")?;
    let cancelled = crate::db::admin::cancel_tasks(conn, tasks).await?;
    Ok(Some(CancelReport {
        steps_cancelled,
        tasks_cancelled: cancelled.len() as i64,
    }))
}

fn summary(row: &sqlx::postgres::PgRow) -> Result<WorkflowSummary> {
    Ok(WorkflowSummary {
        id: WorkflowId(row.try_get("id")?),
        name: row.try_get("name")?,
        state: row.try_get("state")?,
        steps: row.try_get("steps")?,
        open_steps: row.try_get("open_steps")?,
        created_at: row.try_get("created_at")?,
        finished_at: row.try_get("finished_at")?,
        cancelled_at: row.try_get("cancelled_at")?,
    })
}
