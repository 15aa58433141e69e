//! Events: written in the caller's transaction, published by a relay.
//!
//! An event is a task of the built-in type `outbox.event` on the `events`
//! queue (unless told otherwise), so it has everything a task has: retries,
//! dead tasks, heartbeats, fencing, metrics and the admin tooling
//! (`tasks list --type outbox.event --dead`). Its ordering key is its
//! aggregate (`type/id`), so a relay publishes one aggregate's events one at
//! a time, in the order their transactions committed.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> outbox::Result<()> {
//! use outbox::events::{Event, emit};
//! let mut tx = pool.begin().await?;
//! // ... insert the order on &mut *tx ...
//! emit(&mut tx, Event::new("order", "42", "order.placed", serde_json::json!({"total": 990}))
//!     .header("tenant", "acme")).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

pub mod inbox;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use crate::error::{Error, Result};
use crate::options::TaskOptions;
use crate::task::TaskId;

/// The task type of events.
pub const EVENT_TASK_TYPE: &str = "outbox.event";

/// The queue events go to unless [`Event::queue`] says otherwise.
pub const EVENTS_QUEUE: &str = "events";

/// The longest aggregate type, aggregate id or event type, in bytes (the
/// width of Debezium's columns).
pub const MAX_EVENT_FIELD: usize = 255;

/// The most headers an event carries.
pub const MAX_HEADERS: usize = 64;

/// Header names the relay sets itself; an event cannot set them.
pub const RESERVED_HEADERS: &[&str] = &[
    "event-id",
    "aggregate-type",
    "aggregate-id",
    "event-type",
    "sequence",
    "created-at",
];

/// The stored form of an event: the payload of its `outbox.event` task.
#[doc(hidden)]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[outbox::outbox_task(
    task_type = "outbox.event",
    queue = "events",
    retry_delays = ["5s", "30s", "2m", "10m", "30m", "1h", "3h", "6h", "12h", "24h"]
)]
pub struct EventTask {
    /// The emitter's event id; none means derived from the task id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The aggregate's type (routing, and half the ordering key).
    pub aggregate_type: String,
    /// The aggregate's id (the message key).
    pub aggregate_id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The event's body.
    pub payload: serde_json::Value,
    /// The emitter's headers (a `traceparent` among them, when traced).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// An event to emit. Build it with [`Event::new`], then [`emit`] it.
#[derive(Debug, Clone)]
pub struct Event {
    task: EventTask,
    payload_error: Option<String>,
    queue: Option<String>,
    ordered: bool,
    delay: Option<Duration>,
}

impl Event {
    /// An event `event_type` of aggregate `aggregate_type`/`aggregate_id`
    /// with `payload` (anything that serialises to JSON).
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: impl Serialize,
    ) -> Self {
        let (payload, payload_error) = match serde_json::to_value(payload) {
            Ok(v) => (v, None),
            Err(e) => (serde_json::Value::Null, Some(e.to_string())),
        };
        Self {
            task: EventTask {
                id: None,
                aggregate_type: aggregate_type.into(),
                aggregate_id: aggregate_id.into(),
                event_type: event_type.into(),
                payload,
                headers: BTreeMap::new(),
            },
            payload_error,
            queue: None,
            ordered: true,
            delay: None,
        }
    }

    /// Gives the event its id (a UUID, as text): for an emitter that
    /// already has one. Without it the id is derived from the task id and
    /// this database's instance id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.task.id = Some(id.into());
        self
    }

    /// Adds a header that travels with the message.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.task.headers.insert(name.into(), value.into());
        self
    }

    /// Sets the W3C `traceparent` header, so consumers join the emitter's
    /// trace.
    pub fn traceparent(self, value: impl Into<String>) -> Self {
        self.header("traceparent", value)
    }

    /// Emits to this queue instead of `events`: the queue picks the relay.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Lets this event be published beside its aggregate's other events
    /// instead of after them (no ordering key).
    pub fn unordered(mut self) -> Self {
        self.ordered = false;
        self
    }

    /// Publishes no earlier than this long after the transaction's start.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// The ordering key of an aggregate: its type and id.
    pub fn ordering_key_of(aggregate_type: &str, aggregate_id: &str) -> String {
        format!("{aggregate_type}/{aggregate_id}")
    }

    fn validate(&self) -> Result<()> {
        let bad = |reason: String| Error::InvalidPayload {
            task_type: EVENT_TASK_TYPE.to_owned(),
            reason,
        };
        if let Some(e) = &self.payload_error {
            return Err(bad(format!("its payload does not serialise to JSON: {e}")));
        }
        let t = &self.task;
        for (what, value) in [
            ("aggregate type", &t.aggregate_type),
            ("aggregate id", &t.aggregate_id),
            ("event type", &t.event_type),
        ] {
            if value.is_empty() || value.len() > MAX_EVENT_FIELD {
                return Err(bad(format!(
                    "its {what} is {} bytes: use 1 to {MAX_EVENT_FIELD}",
                    value.len()
                )));
            }
            if value.chars().any(char::is_control) {
                return Err(bad(format!(
                    "its {what} {value:?} holds a control character"
                )));
            }
        }
        if t.aggregate_type.contains('/') {
            return Err(bad(format!(
                "its aggregate type {:?} contains '/', which separates type and id in the ordering key",
                t.aggregate_type
            )));
        }
        if let Some(id) = &t.id {
            parse_uuid(id).ok_or_else(|| bad(format!("its id {id:?} is not a UUID")))?;
        }
        if t.headers.len() > MAX_HEADERS {
            return Err(bad(format!(
                "it has {} headers: the most is {MAX_HEADERS}",
                t.headers.len()
            )));
        }
        for (name, value) in &t.headers {
            let token = !name.is_empty()
                && name.len() <= MAX_EVENT_FIELD
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !token {
                return Err(bad(format!(
                    "header name {name:?}: use 1 to {MAX_EVENT_FIELD} ASCII letters, digits, '-', '_' or '.'"
                )));
            }
            if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                return Err(bad(format!(
                    "header {name:?} is set by the relay itself (reserved: {})",
                    RESERVED_HEADERS.join(", ")
                )));
            }
            if value.chars().any(char::is_control) || value.len() > 4096 {
                return Err(bad(format!(
                    "header {name:?}: its value must be at most 4096 bytes with no control characters"
                )));
            }
        }
        Ok(())
    }
}

/// Emits `event` on `conn`, inside whatever transaction is open on it: the
/// event commits or rolls back with the caller's rows. Returns its task id
/// (see [`event_id`] for the id the relay publishes it under).
///
/// Each aggregate's lock is held until the transaction ends (that is what
/// orders its events by commit). Two transactions that emit for the same
/// aggregates in opposite orders can deadlock, like any two transactions
/// locking rows in opposite orders; PostgreSQL then aborts one (SQLSTATE
/// 40P01, [`crate::is_transient`]) and it should be retried. A transaction
/// that emits for several aggregates avoids it with [`emit_all`], which
/// takes the locks in one order.
pub async fn emit(conn: &mut PgConnection, event: Event) -> Result<TaskId> {
    Ok(emit_all(conn, [event]).await?[0])
}

/// Emits several events in one statement, on `conn`'s open transaction,
/// taking their aggregates' locks in one fixed order (so transactions that
/// emit for the same aggregates never deadlock on each other). Events of
/// one aggregate keep the order given. Returns their task ids in that order.
pub async fn emit_all(
    conn: &mut PgConnection,
    events: impl IntoIterator<Item = Event>,
) -> Result<Vec<TaskId>> {
    let mut batch = crate::Batch::new();
    for mut event in events {
        event.validate()?;
        // One spelling (lower case, hyphens) wherever the id is read back.
        if let Some(bytes) = event.task.id.as_deref().and_then(parse_uuid) {
            event.task.id = Some(format_uuid(&bytes));
        }
        let mut options = TaskOptions::new();
        if event.ordered {
            options = options.ordering_key(Event::ordering_key_of(
                &event.task.aggregate_type,
                &event.task.aggregate_id,
            ));
        }
        if let Some(q) = event.queue {
            options = options.queue(q);
        }
        if let Some(d) = event.delay {
            options = options.delay(d);
        }
        batch.push_with(&event.task, options)?;
    }
    batch.submit(conn).await
}

/// The id event task `task` is published under: the emitter's, or the one
/// derived from the task id and this database's instance id.
pub async fn event_id(conn: &mut PgConnection, task: TaskId) -> Result<Option<String>> {
    let id: Option<String> = sqlx::query_scalar(
        "SELECT coalesce(payload->>'id', outbox_event_id(id)::text) FROM outbox_all_tasks \
         WHERE id = $1 AND task_type = 'outbox.event'",
    )
    .bind(task.0)
    .fetch_optional(conn)
    .await?;
    Ok(id)
}

/// This database's instance id, as 16 bytes.
pub(crate) async fn instance_id(conn: &mut PgConnection) -> sqlx::Result<[u8; 16]> {
    let text: String = sqlx::query_scalar("SELECT id::text FROM outbox_instance")
        .fetch_one(conn)
        .await?;
    parse_uuid(&text).ok_or_else(|| sqlx::Error::Protocol(format!("bad instance id {text:?}")))
}

/// The derived event id of task `task_id` in the database with `instance`
/// (the same as SQL's `outbox_event_id`).
pub(crate) fn derived_event_id(instance: &[u8; 16], task_id: i64) -> String {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&instance[..8]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    let tail = (task_id as u64 & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    bytes[8..].copy_from_slice(&tail.to_be_bytes());
    format_uuid(&bytes)
}

/// Parses a UUID in its usual text form (hyphens optional, any case).
pub(crate) fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|&b| b != b'-').collect();
    let hyphens = text.len() - hex.len();
    if hex.len() != 32 || !(hyphens == 0 || (hyphens == 4 && text.len() == 36)) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// A UUID's text form, lower case with hyphens.
pub(crate) fn format_uuid(bytes: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Turns the Debezium mirror on or off: while on, every event emitted is
/// also written to `outbox_events` in the emitting transaction, in the
/// layout Debezium's Outbox Event Router reads.
pub async fn set_debezium_mirror(pool: &sqlx::PgPool, on: bool) -> Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query("DROP TRIGGER IF EXISTS outbox_events_mirror ON outbox_tasks")
        .execute(&mut *tx)
        .await?;
    if on {
        sqlx::query(
            "CREATE TRIGGER outbox_events_mirror AFTER INSERT ON outbox_tasks FOR EACH ROW \
             WHEN (NEW.task_type = 'outbox.event') EXECUTE FUNCTION outbox_events_mirror()",
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Whether the Debezium mirror is on.
pub async fn debezium_mirror(pool: &sqlx::PgPool) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_events_mirror' \
         AND tgrelid = 'outbox_tasks'::regclass)",
    )
    .fetch_one(pool)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip_and_derived_ids_set_version_and_variant() {
        let instance = parse_uuid("0123456789abcdef0123456789ABCDEF").unwrap();
        let id = derived_event_id(&instance, 42);
        assert_eq!(id, "01234567-89ab-8def-8000-00000000002a");
        assert_eq!(format_uuid(&parse_uuid(&id).unwrap()), id);
        assert!(parse_uuid("not-a-uuid").is_none());
        assert!(parse_uuid("01234567-89ab-8def-8000-00000000002").is_none());
    }

    #[test]
    fn bad_events_are_refused_with_the_reason() {
        let ok = Event::new("order", "1", "placed", serde_json::json!({}));
        assert!(ok.validate().is_ok());
        let cases = [
            Event::new("", "1", "placed", 1),
            Event::new("a/b", "1", "placed", 1),
            Event::new("order", "x".repeat(256), "placed", 1),
            Event::new("order", "1", "placed", 1).id("nope"),
            Event::new("order", "1", "placed", 1).header("event-id", "x"),
            Event::new("order", "1", "placed", 1).header("bad name", "x"),
            Event::new("order", "1", "placed", 1).header("ok", "line\nbreak"),
        ];
        for e in cases {
            let err = e.validate().unwrap_err().to_string();
            assert!(err.contains("outbox.event"), "{err}");
        }
    }
}
