//! What a step's handler reads of its workflow: the results of other steps.

use serde::de::DeserializeOwned;
use sqlx::Row;

use super::WorkflowId;
use crate::error::{Error, Result};
use crate::handler::TaskContext;
use crate::task::TaskId;
use crate::task_result::decode_completed;

impl TaskContext {
    /// The workflow this task is a step of, and the step's name; `None` for
    /// a task submitted on its own.
    pub async fn workflow(&self) -> Result<Option<(WorkflowId, String)>> {
        let row: Option<(Option<i64>, Option<String>)> = self
            .on_pool(async |conn| {
                sqlx::query_as(include_str!("../db/sql/workflow_of_task.sql"))
                    .bind(self.id.0)
                    .fetch_optional(conn)
                    .await
            })
            .await?;
        Ok(match row {
            Some((Some(id), Some(step))) => Some((WorkflowId(id), step)),
            _ => None,
        })
    }

    /// The result step `step` of this task's workflow completed with
    /// (`Outcome::success_with`), decoded into `R`: `None` while it has not
    /// completed, or if it completed without a result or was skipped. Any
    /// step of the workflow can be read, not only a parent: a compensation
    /// reads what the step it undoes returned (a charge id to refund).
    pub async fn step_result<R: DeserializeOwned>(&self, step: &str) -> Result<Option<R>> {
        let row = self
            .on_pool(async |conn| {
                sqlx::query(include_str!("../db/sql/workflow_step_result.sql"))
                    .bind(self.id.0)
                    .bind(step)
                    .fetch_optional(conn)
                    .await
            })
            .await?;
        let Some(row) = row else {
            return Err(self.not_a_step());
        };
        let workflow: Option<i64> = row.try_get("workflow_id")?;
        let Some(workflow) = workflow else {
            return Err(self.not_a_step());
        };
        let state: Option<String> = row.try_get("state")?;
        if state.is_none() {
            return Err(Error::InvalidWorkflow(format!(
                "workflow {workflow} has no step {step:?}"
            )));
        }
        decode(
            state.as_deref(),
            row.try_get("result")?,
            row.try_get("task_id")?,
        )
    }

    /// The results of this step's dependencies, in the order they were
    /// added to the workflow, with their names: what a chord's callback
    /// gathers from its group. A parent that was skipped (or ran without a
    /// result) gives `None`.
    pub async fn parent_results<R: DeserializeOwned>(&self) -> Result<Vec<(String, Option<R>)>> {
        let rows = self
            .on_pool(async |conn| {
                sqlx::query(include_str!("../db/sql/workflow_parent_results.sql"))
                    .bind(self.id.0)
                    .fetch_all(conn)
                    .await
            })
            .await?;
        rows.iter()
            .map(|row| {
                let name: String = row.try_get("name")?;
                let state: String = row.try_get("state")?;
                let value = decode(
                    Some(&state),
                    row.try_get("result")?,
                    row.try_get("task_id")?,
                )?;
                Ok((name, value))
            })
            .collect()
    }

    fn not_a_step(&self) -> Error {
        Error::InvalidWorkflow(format!(
            "task {} is not a step of a workflow (or no longer exists)",
            self.id
        ))
    }
}

/// A step's stored result (read from the history), as `outbox::result`
/// decodes a task's.
fn decode<R: DeserializeOwned>(
    state: Option<&str>,
    result: Option<String>,
    task_id: Option<i64>,
) -> Result<Option<R>> {
    let id = TaskId(task_id.unwrap_or_default());
    decode_completed(id, state.unwrap_or_default(), result)
}
