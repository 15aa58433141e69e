//! Typed handlers: what a handler receives and what its result means.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::task::{Task, TaskId};

/// Runs tasks of type `T`. The payload is decoded into `T` before the call.
///
/// The handler value itself is where application state lives (a pool, an
/// HTTP client): it is built once and shared by every attempt.
///
/// Delivery is at-least-once: a worker can die after the work was done but
/// before the outcome was written, and the task then runs again. Make side
/// effects idempotent, keyed on [`TaskContext::id`].
pub trait TaskHandler<T: Task>: Send + Sync + 'static {
    /// Runs one attempt.
    fn handle(&self, ctx: TaskContext, task: T) -> impl Future<Output = HandlerResult> + Send;
}

/// What a handler returns. `Err` is a failure: the task is retried per its
/// retry table, and dead when the table is used up.
pub type HandlerResult = Result<Outcome, HandlerError>;

/// What happens to a task after an attempt that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Done: the task is COMPLETED.
    Success,
    /// Done, with a result stored on the task (read it back with
    /// [`crate::result`]). Build it with [`Outcome::success_with`], which
    /// checks the size.
    SuccessWith(serde_json::Value),
    /// Run again after this delay without counting an attempt (for "not
    /// yet", such as a rate limit or a resource that is not ready).
    RetryAfter(Duration),
    /// Stop: the task is dead now (FAILED, no further attempts), with this
    /// reason as its last error.
    GiveUp(String),
}

/// The largest result a task keeps, as JSON text.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

impl Outcome {
    /// Success with `result` stored on the task as JSON. An error (a result
    /// that does not serialise, is larger than [`MAX_RESULT_BYTES`], or
    /// holds U+0000, which PostgreSQL's jsonb cannot) is meant for `?`: the
    /// attempt fails with the reason, so it shows up in development.
    pub fn success_with<R: serde::Serialize + ?Sized>(result: &R) -> Result<Self, HandlerError> {
        let text = serde_json::to_string(result)
            .map_err(|e| HandlerError::msg(format!("the task's result does not serialise: {e}")))?;
        if text.len() > MAX_RESULT_BYTES {
            return Err(HandlerError::msg(format!(
                "the task's result is {} bytes of JSON; the most a task keeps is {MAX_RESULT_BYTES}: store large results elsewhere and return a reference",
                text.len()
            )));
        }
        if crate::submit::contains_nul_escape(&text) {
            return Err(HandlerError::msg(
                "the task's result contains U+0000, which PostgreSQL's jsonb cannot hold",
            ));
        }
        let value = serde_json::from_str(&text)
            .map_err(|e| HandlerError::msg(format!("the task's result does not serialise: {e}")))?;
        Ok(Outcome::SuccessWith(value))
    }
}

/// A failed attempt. Any error converts into it with `?`; its message and
/// the messages of its sources are stored on the task row.
pub struct HandlerError {
    message: String,
    /// Not a failure: the handler suspends itself for this long
    /// ([`TaskContext::sleep_until`]), without holding a worker slot and
    /// without counting an attempt.
    suspend_for: Option<Duration>,
}

impl HandlerError {
    /// A failure with this message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            suspend_for: None,
        }
    }

    /// A suspension, not a failure: the task runs again after `delay`.
    pub(crate) fn suspend(delay: Duration) -> Self {
        Self {
            message: format!("suspended for {delay:?}"),
            suspend_for: Some(delay),
        }
    }

    /// How long the handler suspended itself, if that is what this is.
    pub fn suspended_for(&self) -> Option<Duration> {
        self.suspend_for
    }

    /// The message stored on the task row.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self {
            message: crate::error::with_causes(&error),
            suspend_for: None,
        }
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HandlerError").field(&self.message).finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The error type of a boxed [`HandlerError`]: a `std::error::Error` with
/// the same message. (`HandlerError` itself cannot be one: any error
/// converts into it with `?`, as with `anyhow::Error`.)
#[derive(Debug)]
struct HandlerFailure(String);

impl fmt::Display for HandlerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HandlerFailure {}

/// So that `?` works on a handler's result in code returning
/// `Result<_, Box<dyn Error + Send + Sync>>` (tests using
/// `testing::run_inline`, for example).
impl From<HandlerError> for Box<dyn std::error::Error + Send + Sync + 'static> {
    fn from(error: HandlerError) -> Self {
        Box::new(HandlerFailure(error.message))
    }
}

/// So that `?` works on a handler's result in code returning
/// `Result<_, Box<dyn Error>>`.
impl From<HandlerError> for Box<dyn std::error::Error + 'static> {
    fn from(error: HandlerError) -> Self {
        Box::new(HandlerFailure(error.message))
    }
}

/// What a handler knows about the attempt it runs.
#[derive(Debug, Clone)]
pub struct TaskContext {
    pub(crate) id: TaskId,
    pub(crate) task_type: Arc<str>,
    pub(crate) queue: Arc<str>,
    pub(crate) attempt: i32,
    pub(crate) max_attempts: i32,
    pub(crate) cancel: CancellationToken,
    pub(crate) pool: PgPool,
    /// The claim this attempt runs under: (claims, claim token), the fence
    /// of [`TaskContext::complete_in`]. `None` outside a worker (tests).
    pub(crate) claim: Option<(i32, Arc<str>)>,
    /// Set once `complete_in` wrote the completion (in a transaction that
    /// may still roll back).
    pub(crate) completed_in: Arc<std::sync::atomic::AtomicBool>,
    /// Its place in its ordering key's commit order (None without a key).
    pub(crate) key_seq: Option<i64>,
    /// When the task was submitted (the database's clock).
    pub(crate) created_at: chrono::DateTime<chrono::Utc>,
}

impl TaskContext {
    /// Runs the engine's own `work` on a connection of the application's
    /// pool (see [`crate::pooler`]).
    pub(crate) async fn on_pool<T>(
        &self,
        work: impl AsyncFnOnce(&mut sqlx::PgConnection) -> sqlx::Result<T>,
    ) -> sqlx::Result<T> {
        crate::pooler::on(&self.pool, work).await
    }

    /// The task id: stable across attempts, the idempotency key for side
    /// effects.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The task type.
    pub fn task_type(&self) -> &str {
        &self.task_type
    }

    /// The queue the task was claimed from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// This attempt's number, from 1.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// The most attempts the task gets (its retry table's length, or what
    /// its submit set with `TaskOptions::max_attempts`).
    pub fn max_attempts(&self) -> i32 {
        self.max_attempts
    }

    /// The task's place in its ordering key's commit order: increasing
    /// within a key (with gaps), `None` for a task without a key.
    pub fn key_seq(&self) -> Option<i64> {
        self.key_seq
    }

    /// When the task was submitted, by the database's clock (the
    /// submitting transaction's start).
    pub fn created_at(&self) -> chrono::DateTime<chrono::Utc> {
        self.created_at
    }

    /// True when a failure of this attempt makes the task dead.
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }

    /// Cancelled when the worker shuts down and the grace period is over:
    /// a long handler should stop at the next safe point.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The worker's database pool, for handlers that write to the same
    /// database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Completes this task inside the handler's own transaction, so that
    /// the handler's database effects and the task's completion commit
    /// together (exactly once for database-side effects; tasks submitted in
    /// `tx` commit with it, which chains tasks). Fenced like every outcome:
    /// if this attempt no longer holds the task (it was recovered and
    /// claimed again, or an operator cancelled it), it returns
    /// [`crate::Error::NotHeld`] and the caller must roll back. After the
    /// commit, whatever the handler returns leaves the row alone; if `tx`
    /// rolls back instead, the handler's return value is written as usual.
    ///
    /// A task with an ordering key hands its key on in `conn`'s
    /// transaction: complete it at READ COMMITTED. At REPEATABLE READ or
    /// SERIALIZABLE the hand-over sees only the transaction's snapshot, and
    /// a task of the key committed after it waits for maintenance (about a
    /// minute) instead of running next.
    ///
    /// ```no_run
    /// # use outbox::{HandlerResult, Outcome, TaskContext};
    /// # async fn handle(ctx: TaskContext, order_id: i64) -> HandlerResult {
    /// let mut tx = ctx.pool().begin().await?;
    /// outbox::sqlx::query("UPDATE orders SET shipped = true WHERE id = $1")
    ///     .bind(order_id)
    ///     .execute(&mut *tx)
    ///     .await?;
    /// ctx.complete_in(&mut tx).await?;
    /// tx.commit().await?;
    /// Ok(Outcome::Success)
    /// # }
    /// ```
    pub async fn complete_in(&self, conn: &mut sqlx::PgConnection) -> crate::Result<()> {
        self.complete_in_with(conn, None).await
    }

    /// [`TaskContext::complete_in`] with a result stored on the task (see
    /// [`Outcome::success_with`] for the limits).
    pub async fn complete_in_with_result<R: serde::Serialize + ?Sized>(
        &self,
        conn: &mut sqlx::PgConnection,
        result: &R,
    ) -> crate::Result<()> {
        let value = match Outcome::success_with(result) {
            Ok(Outcome::SuccessWith(v)) => v,
            Ok(_) => serde_json::Value::Null,
            Err(e) => return Err(crate::Error::InvalidOption(e.message().to_owned())),
        };
        self.complete_in_with(conn, Some(value.to_string())).await
    }

    async fn complete_in_with(
        &self,
        conn: &mut sqlx::PgConnection,
        result: Option<String>,
    ) -> crate::Result<()> {
        let Some((claims, token)) = &self.claim else {
            return Err(crate::Error::NotHeld(self.id));
        };
        let written: Option<i64> =
            sqlx::query_scalar(include_str!("db/sql/complete_in_transaction.sql"))
                .bind(self.id.0)
                .bind(claims)
                .bind(&**token)
                .bind(result)
                .fetch_optional(conn)
                .await?;
        if written.is_none() {
            return Err(crate::Error::NotHeld(self.id));
        }
        self.completed_in
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// A boxed handler future.
pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;

/// A handler with its payload type erased, so handlers of all types sit in
/// one map keyed by task type.
pub(crate) trait ErasedHandler: Send + Sync {
    /// Decodes the payload and starts the handler; a payload that does not
    /// decode is an error message for the task row.
    fn start(&self, ctx: TaskContext, payload: &str) -> Result<HandlerFuture, String>;
}

/// The [`ErasedHandler`] for payload type `T`.
pub(crate) struct TypedHandler<T, H> {
    handler: Arc<H>,
    _task: PhantomData<fn() -> T>,
}

impl<T, H> TypedHandler<T, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler: Arc::new(handler),
            _task: PhantomData,
        }
    }
}

impl<T: Task, H: TaskHandler<T>> ErasedHandler for TypedHandler<T, H> {
    fn start(&self, ctx: TaskContext, payload: &str) -> Result<HandlerFuture, String> {
        let task: T = serde_json::from_str(payload).map_err(|e| {
            format!(
                "payload does not decode into {} (task type {:?}): {e}",
                std::any::type_name::<T>(),
                T::TASK_TYPE
            )
        })?;
        let handler = Arc::clone(&self.handler);
        Ok(Box::pin(async move { handler.handle(ctx, task).await }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer {
        says_source: bool,
        inner: std::io::Error,
    }

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            if self.says_source {
                write!(f, "query failed: {}", self.inner)
            } else {
                write!(f, "query failed")
            }
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.inner)
        }
    }

    #[test]
    fn a_source_is_added_once_and_only_when_the_message_lacks_it() {
        let inner = || std::io::Error::other("connection reset");
        let said = HandlerError::from(Outer {
            says_source: true,
            inner: inner(),
        });
        assert_eq!(said.message(), "query failed: connection reset");
        let unsaid = HandlerError::from(Outer {
            says_source: false,
            inner: inner(),
        });
        assert_eq!(unsaid.message(), "query failed: connection reset");
    }
}
