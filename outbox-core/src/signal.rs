//! Signals: a task waiting in [`TaskContext::wait_for`] is sent a named
//! value by another transaction ([`signal`]), without holding a worker
//! slot while it waits.

use std::time::Duration;

use chrono::Utc;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::PgConnection;

use crate::durable::check_name;
use crate::error::{Error, Result};
use crate::handler::{HandlerError, MAX_RESULT_BYTES, TaskContext};
use crate::task::TaskId;

/// How often a waiting task looks again without being signalled (a
/// signal wakes it at once; this only bounds a lost wake-up).
pub const WAIT_RECHECK: Duration = Duration::from_secs(60);

/// Sends signal `name` with `value` to task `task`, in whatever transaction
/// is open on `conn`: the signal exists, and the task is woken to read it,
/// only if that transaction commits. The first signal of a name wins:
/// returns false (and changes nothing) if the task was already sent one,
/// and also if it has finished or does not exist (nothing would read it).
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, task: outbox::TaskId) -> outbox::Result<()> {
/// let mut tx = pool.begin().await?;
/// // ... record the approval in your own tables ...
/// outbox::signal(&mut tx, task, "approved", &serde_json::json!({"by": "ada"})).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn signal<T: Serialize + ?Sized>(
    conn: &mut PgConnection,
    task: TaskId,
    name: &str,
    value: &T,
) -> Result<bool> {
    check_name("signal", name).map_err(Error::InvalidOption)?;
    let text = serde_json::to_string(value).map_err(|e| {
        Error::InvalidOption(format!(
            "signal {name:?}: the value does not serialise: {e}"
        ))
    })?;
    if text.len() > MAX_RESULT_BYTES || crate::submit::contains_nul_escape(&text) {
        return Err(Error::InvalidOption(format!(
            "signal {name:?}: the value is {} bytes of JSON (the most kept is {MAX_RESULT_BYTES}) or holds U+0000",
            text.len()
        )));
    }
    let sent: bool = sqlx::query_scalar(include_str!("db/sql/send_signal.sql"))
        .bind(task.0)
        .bind(name)
        .bind(&text)
        .fetch_one(conn)
        .await?;
    Ok(sent)
}

impl TaskContext {
    /// The value of signal `name` sent to this task ([`signal`]). Until it
    /// arrives the task is suspended as by [`TaskContext::sleep`] (return
    /// with `?`: the worker slot is free and no attempt is counted) and the
    /// signal wakes it; the handler then runs again from the top, its
    /// durable steps skipped, and this call returns the value.
    pub async fn wait_for<T: DeserializeOwned>(&self, name: &str) -> Result<T, HandlerError> {
        match self.received(name).await? {
            Some(value) => Ok(value),
            None => Err(HandlerError::suspend(WAIT_RECHECK)),
        }
    }

    /// [`TaskContext::wait_for`], giving up `within` after the first attempt
    /// that waited (the deadline is recorded as durable step
    /// `NAME:deadline`): `None` if the signal did not come in time.
    pub async fn wait_for_within<T: DeserializeOwned>(
        &self,
        name: &str,
        within: Duration,
    ) -> Result<Option<T>, HandlerError> {
        if let Some(value) = self.received(name).await? {
            return Ok(Some(value));
        }
        let deadline = self
            .recorded_deadline(&format!("{name}:deadline"), within)
            .await?;
        match (deadline - Utc::now()).to_std() {
            Ok(left) if !left.is_zero() => Err(HandlerError::suspend(left.min(WAIT_RECHECK))),
            _ => Ok(None),
        }
    }

    async fn received<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, HandlerError> {
        check_name("signal", name).map_err(HandlerError::msg)?;
        let text: Option<String> = self
            .on_pool(async |conn| {
                sqlx::query_scalar(include_str!("db/sql/received_signal.sql"))
                    .bind(self.id.0)
                    .bind(name)
                    .fetch_optional(conn)
                    .await
            })
            .await
            .map_err(HandlerError::from)?;
        text.map(|t| {
            serde_json::from_str(&t).map_err(|e| {
                HandlerError::msg(format!(
                    "signal {name:?}: its value does not decode into the type asked for: {e} (stored: {})",
                    crate::task_result::excerpt(&t)
                ))
            })
        })
        .transpose()
    }
}
