//! Durable steps inside one handler: `ctx.step` records what a piece of
//! work returned, so an attempt after a failure (or after its worker died)
//! skips what already succeeded; `ctx.sleep` suspends the task until a
//! recorded moment without holding a worker slot.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::handler::{HandlerError, MAX_RESULT_BYTES, TaskContext};

/// The longest durable step name, in bytes.
pub const MAX_DURABLE_STEP_NAME: usize = 200;

impl TaskContext {
    /// Runs `work` unless an earlier attempt of this task recorded step
    /// `name`, and returns its result either way: the recorded one, decoded,
    /// or the fresh one, recorded (at most [`MAX_RESULT_BYTES`] of JSON).
    ///
    /// Recorded at once, outside the attempt's outcome: a step that
    /// succeeded stays done even if a later step fails the attempt. Work
    /// that ran but whose record was lost (the worker died in between) runs
    /// again, so keep each step idempotent as any handler. Two attempts
    /// racing (a stale one after recovery) both run it; the first record
    /// wins and both return it.
    ///
    /// ```no_run
    /// # use outbox::{HandlerResult, Outcome, TaskContext};
    /// # async fn charge() -> Result<String, std::io::Error> { Ok(String::new()) }
    /// # async fn email(_: &str) -> Result<(), std::io::Error> { Ok(()) }
    /// # async fn handle(ctx: TaskContext) -> HandlerResult {
    /// let receipt: String = ctx.step("charge", || async { charge().await }).await?;
    /// ctx.sleep("cool-off", std::time::Duration::from_secs(3600)).await?;
    /// ctx.step("email", || async { email(&receipt).await }).await?;
    /// Ok(Outcome::Success)
    /// # }
    /// ```
    pub async fn step<R, F, Fut, E>(&self, name: &str, work: F) -> Result<R, HandlerError>
    where
        R: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<R, E>>,
        E: Into<HandlerError>,
    {
        check_name("durable step", name).map_err(HandlerError::msg)?;
        if let Some(recorded) = self.recorded(name).await? {
            return decode(name, &recorded);
        }
        let value = work().await.map_err(Into::into)?;
        let text = serde_json::to_string(&value).map_err(|e| {
            HandlerError::msg(format!(
                "durable step {name:?}: its result does not serialise: {e}"
            ))
        })?;
        if text.len() > MAX_RESULT_BYTES || crate::submit::contains_nul_escape(&text) {
            return Err(HandlerError::msg(format!(
                "durable step {name:?}: its result is {} bytes of JSON (the most kept is {MAX_RESULT_BYTES}) or holds U+0000",
                text.len()
            )));
        }
        let recorded: Option<bool> = self
            .on_pool(async |conn| {
                sqlx::query_scalar(include_str!("db/sql/record_durable_step.sql"))
                    .bind(self.id.0)
                    .bind(name)
                    .bind(&text)
                    .fetch_optional(conn)
                    .await
            })
            .await
            .map_err(HandlerError::from)?;
        if recorded.is_some() {
            return Ok(value);
        }
        // Another attempt recorded it first: theirs is the result.
        match self.recorded(name).await? {
            Some(theirs) => decode(name, &theirs),
            None => Err(HandlerError::msg(format!(
                "durable step {name:?}: another attempt recorded it and the record is gone"
            ))),
        }
    }

    /// Suspends the task for `duration`, counted from the first attempt that
    /// reached this sleep (the wake-up time is recorded as durable step
    /// `name`): the handler returns at once (propagate the error with `?`),
    /// its worker slot is free, no attempt is counted, and the task runs
    /// again from the start at the wake-up time, its recorded steps
    /// skipped, this sleep included.
    pub async fn sleep(&self, name: &str, duration: Duration) -> Result<(), HandlerError> {
        let wake_at = self.recorded_deadline(name, duration).await?;
        self.sleep_until(wake_at)
    }

    /// Now plus `duration`, recorded as durable step `name` by the first
    /// attempt that gets here: the same moment in every attempt.
    pub(crate) async fn recorded_deadline(
        &self,
        name: &str,
        duration: Duration,
    ) -> Result<DateTime<Utc>, HandlerError> {
        self.step(name, || async {
            let span = chrono::Duration::from_std(duration)
                .map_err(|e| HandlerError::msg(format!("{name:?}: {e}")))?;
            Ok::<_, HandlerError>(Utc::now() + span)
        })
        .await
    }

    /// Suspends the task until `at` (see [`TaskContext::sleep`]); `Ok` once
    /// `at` has passed. `at` must be the same in every attempt (recorded
    /// with [`TaskContext::step`], or from the payload), or the task never
    /// wakes up.
    pub fn sleep_until(&self, at: DateTime<Utc>) -> Result<(), HandlerError> {
        match (at - Utc::now()).to_std() {
            Ok(left) if !left.is_zero() => Err(HandlerError::suspend(left)),
            _ => Ok(()),
        }
    }

    async fn recorded(&self, name: &str) -> Result<Option<String>, HandlerError> {
        self.on_pool(async |conn| {
            sqlx::query_scalar(include_str!("db/sql/durable_step.sql"))
                .bind(self.id.0)
                .bind(name)
                .fetch_optional(conn)
                .await
        })
        .await
        .map_err(HandlerError::from)
    }
}

/// Checks a durable step's or a signal's name (`what`): 1 to
/// [`MAX_DURABLE_STEP_NAME`] bytes.
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_DURABLE_STEP_NAME {
        return Err(format!(
            "a {what} name must be 1 to {MAX_DURABLE_STEP_NAME} bytes long, got {}",
            name.len()
        ));
    }
    Ok(())
}

fn decode<R: DeserializeOwned>(name: &str, text: &str) -> Result<R, HandlerError> {
    serde_json::from_str(text).map_err(|e| {
        HandlerError::msg(format!(
            "durable step {name:?}: the recorded result does not decode into the type asked for: {e} (stored: {})",
            crate::task_result::excerpt(text)
        ))
    })
}

/// Deletes up to `limit` durable step records and up to `limit` signals of
/// tasks no longer in `outbox_tasks` (completed, or deleted); returns how
/// many.
pub(crate) async fn prune(conn: &mut sqlx::PgConnection, limit: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar(include_str!("db/sql/prune_durable_steps.sql"))
        .bind(limit)
        .fetch_one(conn)
        .await
}
