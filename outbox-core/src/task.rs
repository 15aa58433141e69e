//! The task model: what a payload type declares, and the registry of every
//! task type linked into the binary.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::retry::DEFAULT_RETRY_DELAYS;

/// The queue a task type runs on unless it says otherwise.
pub const DEFAULT_QUEUE: &str = "default";

/// A task payload type. Implement it with `#[outbox_task(...)]`, which also
/// registers the type so that workers find it without hand-written wiring.
pub trait Task: Serialize + DeserializeOwned + Send + 'static {
    /// The discriminator stored with each task; unique across the binary.
    const TASK_TYPE: &'static str;
    /// The queue tasks of this type go to unless the submitter overrides it.
    const QUEUE: &'static str = DEFAULT_QUEUE;
    /// The default priority, 0 (first) to 9 (last).
    const PRIORITY: i16 = 0;
    /// The retry table: the delay after the 1st, 2nd, ... failure. Its length
    /// is the maximum number of attempts.
    const RETRY_DELAYS: &'static [Duration] = DEFAULT_RETRY_DELAYS;
    /// How long one attempt may run: at the timeout the handler's
    /// cancellation token fires and the attempt fails with "timed out after
    /// ..." (then the retry table applies). A handler that ignores its token
    /// is aborted after the worker's `cancel_grace`. `None`: no limit.
    const TIMEOUT: Option<Duration> = None;

    /// What makes this task unique, if anything (`#[outbox_task(unique_by
    /// = [...])]`); a submit's [`crate::TaskOptions::unique`] replaces it.
    /// An error is a key that could not be built from the payload.
    fn unique(&self) -> Result<Option<crate::Unique>, String> {
        Ok(None)
    }

    /// The task's ordering key, if any (`#[outbox_task(ordering_key =
    /// "field")]`); a submit's [`crate::TaskOptions::ordering_key`]
    /// replaces it. Tasks with the same key in a queue run one at a time,
    /// in commit order.
    fn ordering_key(&self) -> Option<String> {
        None
    }

    /// Whether a dead task of this type lets its ordering key go on
    /// (`on_dead = "skip"`). By default it blocks the key until an operator
    /// retries, cancels or skips it, so that no later task overtakes it.
    const DEAD_SKIPS_KEY: bool = false;
}

/// The id of a task: assigned by the database, unique within it, stable
/// across attempts. Use it as the idempotency key of a handler's side
/// effects: delivery is at-least-once.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct TaskId(pub i64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

// A TaskId binds and decodes as the `bigint` it is, so applications can
// store it next to their own rows (`.bind(id)`, `query_scalar::<_, TaskId>`).
impl sqlx::Type<sqlx::Postgres> for TaskId {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <i64 as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <i64 as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl sqlx::postgres::PgHasArrayType for TaskId {
    fn array_type_info() -> sqlx::postgres::PgTypeInfo {
        <i64 as sqlx::postgres::PgHasArrayType>::array_type_info()
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for TaskId {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <i64 as sqlx::Encode<'_, sqlx::Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for TaskId {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        <i64 as sqlx::Decode<'r, sqlx::Postgres>>::decode(value).map(TaskId)
    }
}

/// A task type as registered by `#[outbox_task]`: one entry per payload type
/// linked into the binary.
#[derive(Debug)]
pub struct RegisteredTask {
    /// The task type string.
    pub task_type: &'static str,
    /// Its default queue.
    pub queue: &'static str,
    /// Its default priority.
    pub priority: i16,
    /// Its retry table.
    pub retry_delays: &'static [Duration],
    /// The Rust path of the payload type, for error messages.
    pub rust_type: &'static str,
    /// Checks that a JSON payload decodes into the payload type, so that a
    /// submission by name (the CLI) is refused before it is written.
    pub check_payload: fn(&str) -> Result<(), String>,
    /// The uniqueness a JSON payload has by the type's declaration
    /// (`unique_by`), so that a submission by name is unique like one from
    /// code.
    pub unique_of: fn(&str) -> Result<Option<crate::Unique>, String>,
    /// The ordering key a JSON payload has by the type's declaration
    /// (`ordering_key`), for a submission by name.
    pub ordering_of: fn(&str) -> Result<Option<String>, String>,
    /// The type's `on_dead = "skip"`.
    pub dead_skips_key: bool,
    /// The type's `unique_by` declaration, for submits from SQL.
    pub unique_decl: Option<RegisteredUnique>,
    /// The JSON name of the type's `ordering_key` field, for submits from
    /// SQL.
    pub ordering_field: Option<&'static str>,
    /// Whether SQL can derive the unique and ordering keys from a JSON
    /// payload exactly as Rust does: every key field an integer, `String`
    /// or `bool` under its own name. Otherwise a submit from SQL must give
    /// the keys.
    pub keys_from_payload: bool,
    /// One of the stock binary's diagnostic types (`outbox.noop`,
    /// `outbox.sleep`, `outbox.fail`), linked into every program that uses
    /// `outbox-worker`: a worker serving its queue without its handler is
    /// not refused for it, as it would be for a type of the application's.
    pub diagnostic: bool,
}

/// A task type's `unique_by`, `unique_period` and `unique_states`, as
/// `outbox_submit` (SQL) applies them to a JSON payload.
#[derive(Debug, Clone, Copy)]
pub struct RegisteredUnique {
    /// The JSON names of the fields whose values make the key (empty: one
    /// per type).
    pub fields: &'static [&'static str],
    /// `unique_period` in milliseconds.
    pub period_ms: Option<u64>,
    /// State bits beyond the always-covered ones (8 completed, 16 dead).
    pub extra_states: i16,
}

/// The `check_payload` of task type `T`.
#[doc(hidden)]
pub fn check_payload<T: Task>(json: &str) -> Result<(), String> {
    serde_json::from_str::<T>(json)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The `unique_of` of a task type that is not unique: nothing to decode.
#[doc(hidden)]
pub fn no_unique(_json: &str) -> Result<Option<crate::Unique>, String> {
    Ok(None)
}

/// The `unique_of` of a unique task type `T`: the payload must decode to
/// build its key.
#[doc(hidden)]
pub fn unique_of<T: Task>(json: &str) -> Result<Option<crate::Unique>, String> {
    serde_json::from_str::<T>(json)
        .map_err(|e| e.to_string())?
        .unique()
}

/// The `ordering_of` of a task type without an ordering key.
#[doc(hidden)]
pub fn no_ordering(_json: &str) -> Result<Option<String>, String> {
    Ok(None)
}

/// The `ordering_of` of a task type `T` with an ordering key.
#[doc(hidden)]
pub fn ordering_of<T: Task>(json: &str) -> Result<Option<String>, String> {
    Ok(serde_json::from_str::<T>(json)
        .map_err(|e| e.to_string())?
        .ordering_key())
}

inventory::collect!(RegisteredTask);

/// Every task type registered with `#[outbox_task]` in this binary, sorted
/// by task type.
pub fn registered_tasks() -> Vec<&'static RegisteredTask> {
    let mut all: Vec<_> = inventory::iter::<RegisteredTask>.into_iter().collect();
    all.sort_by(|a, b| {
        a.task_type
            .cmp(b.task_type)
            .then(a.rust_type.cmp(b.rust_type))
    });
    all
}

/// Looks up a registered task type by name (the first, if it is duplicated).
pub fn find_registered(task_type: &str) -> Option<&'static RegisteredTask> {
    inventory::iter::<RegisteredTask>
        .into_iter()
        .find(|r| r.task_type == task_type)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    #[crate::outbox_task(task_type = "test.core.registered", queue = "core-tests", priority = 4, retry_delays = ["1s", "2m"])]
    struct Registered {
        n: u32,
    }

    #[test]
    fn the_macro_implements_task_and_registers_the_type() {
        assert_eq!(Registered::TASK_TYPE, "test.core.registered");
        assert_eq!(Registered::QUEUE, "core-tests");
        assert_eq!(Registered::PRIORITY, 4);
        assert_eq!(
            Registered::RETRY_DELAYS,
            &[Duration::from_secs(1), Duration::from_secs(120)]
        );
        let found = find_registered("test.core.registered").expect("registered through inventory");
        assert!(
            found.rust_type.ends_with("::Registered"),
            "{}",
            found.rust_type
        );
        assert_eq!(found.queue, "core-tests");
        assert!(
            registered_tasks()
                .iter()
                .any(|r| r.task_type == "test.core.registered")
        );
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    #[crate::outbox_task(task_type = "test.core.five", retry_delays = ["10s"], max_attempts = 5)]
    struct FiveTries {}

    #[derive(serde::Serialize, serde::Deserialize)]
    #[crate::outbox_task(task_type = "test.core.three", max_attempts = 3)]
    struct ThreeTries {}

    #[derive(serde::Serialize, serde::Deserialize)]
    #[crate::outbox_task(task_type = "test.core.once", retry_delays = ["1s", "2s"], max_attempts = 1)]
    struct Once {}

    /// `max_attempts` makes the table that long: the last delay repeated,
    /// the default table cut, a longer table cut.
    #[test]
    fn max_attempts_sets_the_tables_length() {
        assert_eq!(FiveTries::RETRY_DELAYS, &[Duration::from_secs(10); 5]);
        assert_eq!(
            ThreeTries::RETRY_DELAYS,
            &crate::retry::DEFAULT_RETRY_DELAYS[..3]
        );
        assert_eq!(Once::RETRY_DELAYS, &[Duration::from_secs(1)]);
        assert_eq!(crate::retry::max_attempts(FiveTries::RETRY_DELAYS), 5);
        let declared = find_registered("test.core.five").unwrap();
        assert_eq!(declared.retry_delays.len(), 5);
    }
}
