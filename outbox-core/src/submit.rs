//! Submitting tasks inside the caller's own transaction.
//!
//! The task row is written on the caller's connection, so it commits or rolls
//! back together with the caller's business rows: no dual write. Workers are
//! woken by a NOTIFY that PostgreSQL delivers only at commit.

use sqlx::PgConnection;

use crate::db::{self, NewTask, UniqueRow};
use crate::error::{Error, Result};
use crate::options::{TaskOptions, Unique, delay_micros, validate_priority, validate_queue};
use crate::retry::max_attempts;
use crate::task::{RegisteredTask, Task, TaskId};

/// Submits one task on `conn`, inside whatever transaction is open on it:
/// pass `&mut tx` for a `Transaction`, or any `&mut PgConnection` (a pooled
/// connection outside a transaction commits the task at once).
///
/// Taking a plain `&mut PgConnection` (rather than a generic executor) keeps
/// the returned future `Send` for every caller, so it works inside
/// `tokio::spawn` and web framework handlers.
///
/// ```no_run
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize)]
/// # #[outbox::outbox_task(task_type = "email.welcome")]
/// # struct SendWelcome { user_id: i64 }
/// # async fn f(pool: sqlx::PgPool) -> outbox::Result<()> {
/// let mut tx = pool.begin().await?;
/// // ... insert the user in the same transaction ...
/// outbox::submit(&mut tx, SendWelcome { user_id: 7 }).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn submit<T: Task>(conn: &mut PgConnection, task: T) -> Result<TaskId> {
    submit_with(conn, task, TaskOptions::new()).await
}

/// Submits one task with options (delay or run-at, priority, queue,
/// uniqueness). For a unique task that is a duplicate, nothing is written
/// and the id is the existing task's; [`submit_detailed`] tells the two
/// apart.
pub async fn submit_with<T: Task>(
    conn: &mut PgConnection,
    task: T,
    options: TaskOptions,
) -> Result<TaskId> {
    Ok(submit_detailed(conn, task, options).await?.id)
}

/// What a submit did with one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Submitted {
    /// The new task's id, or for a duplicate the id of the task that holds
    /// its unique key.
    pub id: TaskId,
    /// True when nothing was written: a task with the same unique key is in
    /// a state the uniqueness covers.
    pub duplicate: bool,
}

/// Like [`submit_with`], saying whether the task was a duplicate.
///
/// ```no_run
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize)]
/// # #[outbox::outbox_task(task_type = "invoice.send")]
/// # struct SendInvoice { invoice_id: i64 }
/// # async fn f(conn: &mut sqlx::PgConnection) -> outbox::Result<()> {
/// use outbox::{TaskOptions, Unique};
/// let options = TaskOptions::new().unique(Unique::key("invoice-7"));
/// let first = outbox::submit_detailed(conn, SendInvoice { invoice_id: 7 }, options.clone()).await?;
/// let again = outbox::submit_detailed(conn, SendInvoice { invoice_id: 7 }, options).await?;
/// assert!(!first.duplicate && again.duplicate && again.id == first.id);
/// # Ok(()) }
/// ```
pub async fn submit_detailed<T: Task>(
    conn: &mut PgConnection,
    task: T,
    options: TaskOptions,
) -> Result<Submitted> {
    let mut batch = Batch::new();
    batch.push_with(&task, options)?;
    let done = batch.submit_detailed(conn).await?;
    Ok(done[0])
}

/// Submits many tasks of one type in one round trip.
pub async fn submit_batch<T, I>(conn: &mut PgConnection, tasks: I) -> Result<Vec<TaskId>>
where
    T: Task,
    I: IntoIterator<Item = T>,
{
    let mut batch = Batch::new();
    for task in tasks {
        batch.push(&task)?;
    }
    batch.submit(conn).await
}

/// True when JSON text `json` holds the escape `\u0000` (an encoded NUL),
/// not merely an escaped backslash followed by `u0000`.
pub(crate) fn contains_nul_escape(json: &str) -> bool {
    let bytes = json.as_bytes();
    let mut from = 0;
    while let Some(found) = json[from..].find("u0000") {
        let at = from + found;
        let backslashes = bytes[..at]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if backslashes % 2 == 1 {
            return true;
        }
        from = at + 1;
    }
    false
}

/// A batch of tasks of any types, written in one statement.
///
/// Each push serialises and validates at once, so a bad task is an error
/// before anything reaches the database.
#[derive(Debug, Default)]
pub struct Batch {
    rows: Vec<NewTask>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of tasks in the batch.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when the batch holds no task.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows pushed so far (a workflow's steps are checked as a batch's
    /// tasks are, then written their own way).
    pub(crate) fn into_rows(self) -> Vec<NewTask> {
        self.rows
    }

    /// Adds a task with its type's defaults.
    pub fn push<T: Task>(&mut self, task: &T) -> Result<&mut Self> {
        self.push_with(task, TaskOptions::new())
    }

    /// Adds a task with options.
    pub fn push_with<T: Task>(&mut self, task: &T, mut options: TaskOptions) -> Result<&mut Self> {
        let payload = serde_json::to_string(task).map_err(|source| Error::Serialize {
            task_type: T::TASK_TYPE.to_owned(),
            source,
        })?;
        if options.unique.is_none() {
            options.unique = task.unique().map_err(|reason| Error::InvalidPayload {
                task_type: T::TASK_TYPE.to_owned(),
                reason: format!("its unique key cannot be built: {reason}"),
            })?;
        }
        if options.ordering_key.is_none() {
            options.ordering_key = task.ordering_key();
        }
        let declared = Declared {
            task_type: T::TASK_TYPE,
            queue: T::QUEUE,
            priority: T::PRIORITY,
            retry_delays: T::RETRY_DELAYS,
            dead_skips_key: T::DEAD_SKIPS_KEY,
        };
        self.push_row(&declared, payload, options)
    }

    /// Adds a task given as JSON for a registered task type (what the CLI
    /// does). The payload is not decoded here: a worker's handler does that.
    pub fn push_json(
        &mut self,
        task: &RegisteredTask,
        payload: &serde_json::Value,
        mut options: TaskOptions,
    ) -> Result<&mut Self> {
        let payload = payload.to_string();
        if options.unique.is_none() {
            options.unique =
                (task.unique_of)(&payload).map_err(|reason| Error::InvalidPayload {
                    task_type: task.task_type.to_owned(),
                    reason: format!("its unique key cannot be built: {reason}"),
                })?;
        }
        if options.ordering_key.is_none() {
            options.ordering_key =
                (task.ordering_of)(&payload).map_err(|reason| Error::InvalidPayload {
                    task_type: task.task_type.to_owned(),
                    reason: format!("its ordering key cannot be read: {reason}"),
                })?;
        }
        let declared = Declared {
            task_type: task.task_type,
            queue: task.queue,
            priority: task.priority,
            retry_delays: task.retry_delays,
            dead_skips_key: task.dead_skips_key,
        };
        self.push_row(&declared, payload, options)
    }

    fn push_row(
        &mut self,
        declared: &Declared<'_>,
        payload: String,
        options: TaskOptions,
    ) -> Result<&mut Self> {
        let task_type = declared.task_type;
        options.validate()?;
        if contains_nul_escape(&payload) {
            return Err(Error::InvalidPayload {
                task_type: task_type.to_owned(),
                reason: "it contains the character U+0000 (\\u0000), which PostgreSQL's jsonb \
                         cannot hold; encode binary data (base64, hex) instead"
                    .to_owned(),
            });
        }
        let unique = options.unique.as_ref().map(|u: &Unique| UniqueRow {
            key: format!("{task_type}:{}", u.key),
            states: u.states,
            period_us: u.period_us(),
        });
        let queue = options.queue.unwrap_or_else(|| declared.queue.to_owned());
        let priority = options.priority.unwrap_or(declared.priority);
        // The type's own defaults are checked too: a hand-written `impl Task`
        // does not go through the macro's compile-time checks.
        validate_queue(&queue)?;
        validate_priority(priority)?;
        self.rows.push(NewTask {
            task_type: task_type.to_owned(),
            queue,
            payload,
            priority,
            max_attempts: match options.max_attempts {
                Some(n) => crate::options::attempts_as_sql(n)?,
                None => max_attempts(declared.retry_delays),
            },
            run_at: options.run_at,
            delay_us: options.delay.map(delay_micros).transpose()?,
            unique,
            ordering_key: options.ordering_key,
            skip_dead: declared.dead_skips_key,
        });
        Ok(self)
    }

    /// Writes the batch on `conn` in one statement and returns the task ids
    /// in the order the tasks were pushed (for a duplicate unique task, the
    /// id of the task holding its key).
    pub async fn submit(self, conn: &mut PgConnection) -> Result<Vec<TaskId>> {
        Ok(self
            .submit_detailed(conn)
            .await?
            .into_iter()
            .map(|s| s.id)
            .collect())
    }

    /// Like [`Batch::submit`], saying for each task whether it was a
    /// duplicate. Duplicates within the batch count too: the first task
    /// with a key is inserted, the later ones get its id.
    pub async fn submit_detailed(self, conn: &mut PgConnection) -> Result<Vec<Submitted>> {
        if self.rows.is_empty() {
            return Ok(Vec::new());
        }
        crate::trace::propagate(conn).await?;
        let notify = crate::wakeup::queues_to_notify(&self.rows);
        let (rows, order) = in_key_order(self.rows);
        let done: Vec<Submitted> = if rows.iter().all(|r| r.unique.is_none()) {
            db::insert_tasks(conn, rows, notify)
                .await?
                .into_iter()
                .map(|id| Submitted {
                    id: TaskId(id),
                    duplicate: false,
                })
                .collect()
        } else {
            db::unique::insert(conn, rows, notify)
                .await?
                .into_iter()
                .map(|(id, duplicate)| Submitted {
                    id: TaskId(id),
                    duplicate,
                })
                .collect()
        };
        Ok(match order {
            None => done,
            Some(order) => {
                let mut out = done.clone();
                for (sorted_at, &pushed_at) in order.iter().enumerate() {
                    out[pushed_at] = done[sorted_at];
                }
                out
            }
        })
    }
}

/// What a task type declares, whichever way it was pushed.
struct Declared<'a> {
    task_type: &'a str,
    queue: &'a str,
    priority: i16,
    retry_delays: &'a [std::time::Duration],
    dead_skips_key: bool,
}

/// A batch with ordering keys is written in key order (each key's tasks in
/// the order they were pushed), so two batches locking the same keys take
/// the locks in the same order instead of deadlocking. Returns the rows to
/// write and, when they were reordered, each one's place in the batch.
fn in_key_order(rows: Vec<NewTask>) -> (Vec<NewTask>, Option<Vec<usize>>) {
    let keyed = rows.iter().filter(|r| r.ordering_key.is_some()).count();
    if keyed < 2 {
        return (rows, None);
    }
    let mut indexed: Vec<(usize, NewTask)> = rows.into_iter().enumerate().collect();
    // Stable: tasks of one key keep their order.
    indexed.sort_by(|(_, a), (_, b)| {
        (a.ordering_key.is_some(), &a.queue, &a.ordering_key).cmp(&(
            b.ordering_key.is_some(),
            &b.queue,
            &b.ordering_key,
        ))
    });
    let order = indexed.iter().map(|(i, _)| *i).collect();
    (indexed.into_iter().map(|(_, r)| r).collect(), Some(order))
}

#[cfg(test)]
mod tests {
    use super::contains_nul_escape;

    #[test]
    fn only_a_real_nul_escape_is_found() {
        assert!(contains_nul_escape(r#"{"a":"x\u0000y"}"#));
        assert!(contains_nul_escape(
            &serde_json::to_string("nul\0").unwrap()
        ));
        assert!(contains_nul_escape(r#"{"\u0000":1}"#));
        assert!(contains_nul_escape(r#"["\\\u0000"]"#));
        assert!(!contains_nul_escape(r#"{"a":"\\u0000"}"#));
        assert!(!contains_nul_escape(r#"{"u0000":"u0000"}"#));
        assert!(!contains_nul_escape(r#"{"a":"\u0001"}"#));
    }
}
