//! Test helpers for applications (feature `testing`): run a submitted task
//! inline and read the result it returns, assert what a transaction
//! submitted or emitted, run a periodic task's tick now, drain the queues
//! once.
//!
//! ```no_run
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! # #[outbox::outbox_task(task_type = "email.welcome")]
//! # struct SendWelcome { user_id: i64 }
//! # async fn f(pool: sqlx::PgPool) {
//! let mut tx = pool.begin().await.unwrap();
//! // ... the code under test submits in `tx` ...
//! # outbox::submit(&mut tx, SendWelcome { user_id: 7 }).await.unwrap();
//! outbox::testing::assert_submitted(&mut tx, &SendWelcome { user_id: 7 }).await;
//! # }
//! ```

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{PgConnection, PgPool, Row};
use tokio_util::sync::CancellationToken;

use crate::handler::{HandlerResult, Outcome, TaskContext, TaskHandler};
use crate::task::{Task, TaskId};
use crate::worker::{TaskEvent, TaskEventKind, Worker};

mod events;
mod periodic;

pub use events::{EmittedEvent, assert_emitted, assert_none_emitted, emitted};
pub use periodic::tick;

/// The tasks of type `T` that `conn`'s open transaction submitted (in a
/// savepoint too), decoded, oldest first: those other transactions
/// committed are not counted, as [`emitted`] counts only the transaction's
/// events. On a connection outside a transaction, every task of type `T`
/// in the database (pending, running, dead or completed). A task the
/// transaction changed (cancelled, retried) counts as written by it too.
pub async fn submitted<T: Task>(conn: &mut PgConnection) -> Vec<(TaskId, T)> {
    let in_transaction = sqlx::Connection::is_in_transaction(&*conn);
    let rows = sqlx::query(include_str!("db/sql/submitted_of_type.sql"))
        .bind(T::TASK_TYPE)
        .bind(in_transaction)
        .fetch_all(conn)
        .await
        .expect("query submitted tasks");
    rows.iter()
        .map(|r| {
            let id: i64 = r.get("id");
            let payload: String = r.get("payload");
            let task = serde_json::from_str(&payload).unwrap_or_else(|e| {
                panic!(
                    "task {id} of type {:?} does not decode: {e}\npayload: {payload}",
                    T::TASK_TYPE
                )
            });
            (TaskId(id), task)
        })
        .collect()
}

/// Panics unless a task of type `T` equal to `expected` is among
/// [`submitted`]'s (in `conn`'s open transaction); returns its id. The
/// message lists what was submitted.
pub async fn assert_submitted<T: Task + PartialEq + Debug>(
    conn: &mut PgConnection,
    expected: &T,
) -> TaskId {
    let all = submitted::<T>(conn).await;
    match all.iter().find(|(_, t)| t == expected) {
        Some((id, _)) => *id,
        None => panic!(
            "no {:?} task equal to {expected:?} was submitted; submitted tasks of that type: {:?}",
            T::TASK_TYPE,
            all.iter().map(|(_, t)| t).collect::<Vec<_>>()
        ),
    }
}

/// Panics if [`submitted`] finds a task of type `T` (in `conn`'s open
/// transaction).
pub async fn assert_none_submitted<T: Task + Debug>(conn: &mut PgConnection) {
    let all = submitted::<T>(conn).await;
    assert!(
        all.is_empty(),
        "expected no {:?} task, found {all:?}",
        T::TASK_TYPE
    );
}

/// A context for calling a handler directly, as attempt `attempt` of task
/// `id`.
pub fn context<T: Task>(pool: &PgPool, id: TaskId, attempt: i32) -> TaskContext {
    TaskContext {
        id,
        task_type: Arc::from(T::TASK_TYPE),
        queue: Arc::from(T::QUEUE),
        attempt,
        max_attempts: crate::retry::max_attempts(T::RETRY_DELAYS),
        cancel: CancellationToken::new(),
        pool: pool.clone(),
        claim: None,
        completed_in: Arc::default(),
        key_seq: None,
        created_at: chrono::Utc::now(),
    }
}

/// Runs the submitted task `id` inline: decodes its payload into `T` and
/// calls `handler` with a first-attempt context. Writes nothing back: the
/// row stays as it is, so a test can run it again (a duplicate execution)
/// or assert on the handler's effects.
pub async fn run_inline<T: Task>(
    pool: &PgPool,
    id: TaskId,
    handler: &impl TaskHandler<T>,
) -> HandlerResult {
    // This task alone: reading every task of the type would also decode
    // (and trip over) ones the test is not about.
    let record = crate::admin::get_task(pool, id)
        .await
        .expect("read the task")
        .unwrap_or_else(|| {
            panic!(
                "no task with id {id} (run_inline reads what has committed: commit the \
                 submitting transaction first)"
            )
        });
    assert_eq!(
        record.task_type,
        T::TASK_TYPE,
        "task {id} is of type {:?}, not {:?}: name the task type run_inline::<T> runs",
        record.task_type,
        T::TASK_TYPE
    );
    let task: T = serde_json::from_value(record.payload).unwrap_or_else(|e| {
        panic!(
            "task {id}'s payload does not decode as {}: {e}",
            std::any::type_name::<T>()
        )
    });
    handler.handle(context::<T>(pool, id, 1), task).await
}

/// The result a handler's outcome stores ([`Outcome::SuccessWith`]),
/// decoded as `R`; `None` for an outcome that stores none. Panics when the
/// handler failed or the result does not decode as `R`, with the reason.
///
/// With [`run_inline`]: `result_of::<ReportReady>(&run_inline(..).await)`.
/// After [`drain`], read what the worker stored with [`crate::result`].
pub fn result_of<R: serde::de::DeserializeOwned>(outcome: &HandlerResult) -> Option<R> {
    match outcome {
        Ok(Outcome::SuccessWith(value)) => {
            Some(serde_json::from_value(value.clone()).unwrap_or_else(|e| {
                panic!(
                    "the result does not decode as {}: {e}\nresult: {value}",
                    std::any::type_name::<R>()
                )
            }))
        }
        Ok(_) => None,
        Err(e) => panic!("the handler failed: {e}"),
    }
}

/// What [`drain`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Outcomes committed, in order.
    pub events: Vec<TaskEvent>,
}

impl DrainReport {
    /// How many outcomes of `kind`.
    pub fn count(&self, kind: TaskEventKind) -> usize {
        self.events.iter().filter(|e| e.kind == kind).count()
    }
}

/// Runs `worker` until no task on its queues is due or running, then stops
/// it; panics after `within`. Retries do not wait out their backoff: a task
/// that failed an attempt (or snoozed) is made due again at once, so a drain
/// ends with every task that ran either completed or dead. Tasks submitted
/// with a delay that never ran yet are left for later.
pub async fn drain(worker: Worker, within: Duration) -> DrainReport {
    let queues: Vec<String> = worker.queues().iter().map(|(q, _)| q.clone()).collect();
    let pool = worker.pool.clone();
    let mut events = worker.subscribe();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + within;
    let mut report = DrainReport::default();
    loop {
        while let Ok(event) = events.try_recv() {
            report.events.push(event);
        }
        let _: i64 = sqlx::query_scalar(include_str!("db/sql/hurry_retries.sql"))
            .bind(&queues)
            .fetch_one(&pool)
            .await
            .expect("make retries due");
        let unfinished: i64 = sqlx::query_scalar(include_str!("db/sql/unfinished_on_queues.sql"))
            .bind(&queues)
            .fetch_one(&pool)
            .await
            .expect("count unfinished tasks");
        if unfinished == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "drain: {unfinished} tasks still unfinished after {within:?}"
        );
        tokio::select! {
            e = events.recv() => if let Ok(e) = e { report.events.push(e) },
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    shutdown.cancel();
    running.await.expect("worker task").expect("worker run");
    while let Ok(event) = events.try_recv() {
        report.events.push(event);
    }
    report
}
