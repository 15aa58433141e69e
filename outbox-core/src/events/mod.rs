//! Events: appended to a log in the caller's transaction, published by
//! relays.
//!
//! [`emit`] appends one row to `outbox_event_log`, with no trigger and no
//! row lock, at any isolation level (READ COMMITTED through SERIALIZABLE):
//! the event commits or rolls back with the caller's rows. Each relay
//! ([`crate::relay`]) reads the log through its own subscription, in
//! batches of what committed, and publishes each aggregate's events in the
//! order their transactions committed.
//!
//! That order comes from a transaction-scoped advisory lock on the
//! aggregate's hash, taken before the event's position is drawn: a second
//! transaction emitting for the same aggregate waits until the first has
//! ended, so positions follow commits. The lock writes nothing and holds
//! no row; two unrelated aggregates whose hashes collide only wait for each
//! other.
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

use serde::Serialize;
use sqlx::PgConnection;

use crate::error::{Error, Result};

/// The stream events go to unless [`Event::queue`] says otherwise.
pub const EVENTS_QUEUE: &str = "events";

/// The longest aggregate type, aggregate id or event type, in bytes (the
/// width of Debezium's columns).
pub const MAX_EVENT_FIELD: usize = 255;

/// The most headers an event carries.
pub const MAX_HEADERS: usize = 64;

/// The longest delay an event may be given.
pub const MAX_EVENT_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Header names the relay sets itself; an event cannot set them.
pub const RESERVED_HEADERS: &[&str] = &[
    "event-id",
    "aggregate-type",
    "aggregate-id",
    "event-type",
    "sequence",
    "created-at",
];

/// An event as the emitter gave it.
#[derive(Debug, Clone, PartialEq)]
struct EventFields {
    id: Option<String>,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    payload: serde_json::Value,
    headers: BTreeMap<String, String>,
}

/// An emitted event: where it is in the log, and the id it is published
/// under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// The event id (the emitter's, or a UUIDv7 made at emit): the
    /// consumers' dedup key.
    pub id: String,
    /// Its position in the log: increasing along each aggregate's commit
    /// order (the `sequence` header).
    pub position: i64,
}

/// An event to emit. Build it with [`Event::new`], then [`emit`] it.
#[derive(Debug, Clone)]
pub struct Event {
    task: EventFields,
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
            task: EventFields {
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
    /// already has one. Without it the event gets a new UUIDv7.
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

    /// Emits to this stream instead of `events`: the relays whose queue
    /// (stream) it is publish it.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Takes no lock on the aggregate: the event may be published before
    /// events of its aggregate that committed earlier (for emitters that
    /// need no order and want no waiting).
    pub fn unordered(mut self) -> Self {
        self.ordered = false;
        self
    }

    /// Publishes no earlier than this long after the emit. Until then the
    /// event waits, and so do its aggregate's later events (in its
    /// subscriptions' parked list).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = Error::InvalidEvent;
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
                "its aggregate type {:?} contains '/', which separates type and id in the aggregate's key",
                t.aggregate_type
            )));
        }
        if let Some(queue) = &self.queue
            && (queue.is_empty()
                || queue.len() > MAX_EVENT_FIELD
                || queue.chars().any(char::is_control))
        {
            return Err(bad(format!(
                "its stream {queue:?}: use 1 to {MAX_EVENT_FIELD} bytes with no control characters"
            )));
        }
        if let Some(d) = self.delay
            && d > MAX_EVENT_DELAY
        {
            return Err(bad(format!(
                "its delay {d:?} is longer than the most, {MAX_EVENT_DELAY:?}"
            )));
        }
        if contains_nul(&t.payload) {
            return Err(bad(
                "its payload holds U+0000, which PostgreSQL's jsonb cannot store".to_owned(),
            ));
        }
        if let Some(id) = &t.id {
            let bytes =
                parse_uuid(id).ok_or_else(|| bad(format!("its id {id:?} is not a UUID")))?;
            // An id left unset somewhere upstream, not a choice: consumers
            // that drop repeats by `event-id` would drop every event after
            // the first that carries it.
            if bytes == [0; 16] {
                return Err(bad(
                    "its id is the nil UUID: give each event an id of its own".to_owned(),
                ));
            }
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
            // Relays pass it on as the message's trace context, which
            // consumers' tracers parse: a malformed one is the emitter's
            // mistake, caught here rather than ignored downstream.
            if name.eq_ignore_ascii_case("traceparent")
                && (value.trim() != value || crate::trace::parse(value).is_none())
            {
                return Err(bad(format!(
                    "header traceparent {value:?} is not a W3C trace context \
                     (00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, lowercase, ids not all zero)"
                )));
            }
        }
        Ok(())
    }
}

/// Emits `event` on `conn`, inside whatever transaction is open on it: the
/// event commits or rolls back with the caller's rows. Legal at every
/// isolation level. Returns its id and position.
///
/// The aggregate's advisory lock is held until the transaction ends (that
/// is what orders its events by commit). Two transactions that emit for
/// the same aggregates in opposite orders can deadlock, like any two
/// transactions locking rows in opposite orders; PostgreSQL then aborts one
/// (SQLSTATE 40P01, [`crate::is_transient`]) and it should be retried. A
/// transaction that emits for several aggregates avoids it with
/// [`emit_all`], which takes the locks in one order.
pub async fn emit(conn: &mut PgConnection, event: Event) -> Result<Emitted> {
    append_one(conn, Row::of(event)?).await
}

/// Appends one event (checked and with its id) with one statement in the
/// caller's transaction.
async fn append_one(conn: &mut PgConnection, row: Row) -> Result<Emitted> {
    let sql = if row.ordered {
        include_str!("../db/sql/emit_event.sql")
    } else {
        include_str!("../db/sql/emit_event_unordered.sql")
    };
    let position: i64 = sqlx::query_scalar(sql)
        .bind(&row.id)
        .bind(&row.aggregate_type)
        .bind(&row.aggregate_id)
        .bind(&row.event_type)
        .bind(&row.payload)
        .bind(&row.headers)
        .bind(row.stream)
        .bind(row.publish_at)
        .fetch_one(conn)
        .await?;
    Ok(Emitted {
        id: row.id,
        position,
    })
}

/// Emits several events in one statement, on `conn`'s open transaction,
/// taking their aggregates' locks in one fixed order (so transactions that
/// emit for the same aggregates never deadlock on each other). Events of
/// one aggregate keep the order given. Returns them in that order.
pub async fn emit_all(
    conn: &mut PgConnection,
    events: impl IntoIterator<Item = Event>,
) -> Result<Vec<Emitted>> {
    let mut rows = Rows::default();
    for event in events {
        rows.push(Row::of(event)?);
    }
    if rows.ids.is_empty() {
        return Ok(Vec::new());
    }
    let positions: Vec<i64> = sqlx::query_scalar(include_str!("../db/sql/emit_events.sql"))
        .bind(&rows.ids)
        .bind(&rows.aggregate_types)
        .bind(&rows.aggregate_ids)
        .bind(&rows.event_types)
        .bind(&rows.payloads)
        .bind(&rows.headers)
        .bind(&rows.streams)
        .bind(&rows.publish_at)
        .bind(&rows.ordered)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .ids
        .into_iter()
        .zip(positions)
        .map(|(id, position)| Emitted { id, position })
        .collect())
}

/// Emits `event` unless an event with its id was emitted by `emit_once`
/// before: `None` then, and nothing is written. For an emit retried after
/// its commit outcome was lost (the connection dropped during `COMMIT`):
/// give the event the same [`Event::id`] both times and it is written at
/// most once. Run it inside the caller's transaction, like [`emit`].
///
/// The ids are kept in their own table (one extra indexed row per emit,
/// which plain [`emit`] does not pay) for the event log's maximum age; a
/// retry later than that emits again. Without [`Event::id`] the event gets
/// a new id, so the guard only helps once the caller knows the id.
///
/// An id recorded for a different event (another aggregate, type or
/// payload; headers, stream and delay are not compared, and a payload's
/// numbers compare as written: `1.0` is not `1`) is refused with
/// [`Error::InvalidEvent`]: an id given twice by mistake would otherwise
/// drop the second event without a word.
pub async fn emit_once(conn: &mut PgConnection, event: Event) -> Result<Option<Emitted>> {
    // Checked (and its id settled) before the id is recorded: a refused
    // event must not leave a record that would turn its retry away.
    let row = Row::of(event)?;
    let bind = |sql| {
        sqlx::query_scalar(sql)
            .bind(&row.id)
            .bind(&row.aggregate_type)
            .bind(&row.aggregate_id)
            .bind(&row.event_type)
            .bind(sqlx::types::Json(&row.payload))
    };
    let first: Option<bool> = bind(include_str!("../db/sql/claim_event_id.sql"))
        .fetch_optional(&mut *conn)
        .await?;
    if first.is_some() {
        return append_one(conn, row).await.map(Some);
    }
    let differs: Option<bool> = bind(include_str!("../db/sql/event_id_digest_differs.sql"))
        .fetch_optional(&mut *conn)
        .await?;
    if differs == Some(true) {
        return Err(Error::InvalidEvent(format!(
            "event id {} was emitted before for a different event (another aggregate, type or payload than {}/{} {}): nothing written; give this event an id of its own",
            row.id, row.aggregate_type, row.aggregate_id, row.event_type
        )));
    }
    Ok(None)
}

/// One event as the emit statements' columns.
struct Row {
    id: String,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    payload: serde_json::Value,
    headers: Option<serde_json::Value>,
    stream: String,
    publish_at: Option<chrono::DateTime<chrono::Utc>>,
    ordered: bool,
}

impl Row {
    /// Checks `event` and settles its id, stream and publish time.
    fn of(event: Event) -> Result<Self> {
        event.validate()?;
        let Event {
            task,
            queue,
            ordered,
            delay,
            ..
        } = event;
        // One spelling (lower case, hyphens) wherever the id is read back.
        let id = match task.id.as_deref().and_then(parse_uuid) {
            Some(bytes) => format_uuid(&bytes),
            None => new_event_id(),
        };
        let publish_at = match delay {
            Some(d) => Some(
                chrono::Utc::now()
                    + chrono::Duration::from_std(d)
                        .map_err(|e| Error::InvalidEvent(e.to_string()))?,
            ),
            None => None,
        };
        let mut headers = task.headers;
        if let Some(traceparent) = crate::trace::traceparent() {
            // The emitter's trace, for the consumers (the relays pass
            // headers on); one the application set itself wins.
            headers
                .entry("traceparent".to_owned())
                .or_insert(traceparent);
        }
        Ok(Row {
            id,
            aggregate_type: task.aggregate_type,
            aggregate_id: task.aggregate_id,
            event_type: task.event_type,
            payload: task.payload,
            headers: if headers.is_empty() {
                None
            } else {
                Some(serde_json::to_value(&headers).unwrap_or_default())
            },
            stream: queue.unwrap_or_else(|| EVENTS_QUEUE.to_owned()),
            publish_at,
            ordered,
        })
    }
}

/// Events as the columns of `emit_events.sql`'s arrays.
#[derive(Default)]
struct Rows {
    ids: Vec<String>,
    aggregate_types: Vec<String>,
    aggregate_ids: Vec<String>,
    event_types: Vec<String>,
    payloads: Vec<serde_json::Value>,
    headers: Vec<Option<serde_json::Value>>,
    streams: Vec<String>,
    publish_at: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    ordered: Vec<bool>,
}

impl Rows {
    fn push(&mut self, row: Row) {
        self.ids.push(row.id);
        self.aggregate_types.push(row.aggregate_type);
        self.aggregate_ids.push(row.aggregate_id);
        self.event_types.push(row.event_type);
        self.payloads.push(row.payload);
        self.headers.push(row.headers);
        self.streams.push(row.stream);
        self.publish_at.push(row.publish_at);
        self.ordered.push(row.ordered);
    }
}

/// Whether a JSON value holds U+0000 anywhere (jsonb refuses it).
fn contains_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(contains_nul),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

/// A new event id: a UUIDv7 (milliseconds since the epoch, then
/// randomness), so ids sort roughly by time in consumers' inbox indexes.
pub fn new_event_id() -> String {
    let mut bytes = [0u8; 16];
    // Without an entropy source the time and a counter still make ids
    // unique within this process; getrandom fails only on broken systems.
    if getrandom::fill(&mut bytes[6..]).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        bytes[8..].copy_from_slice(&n.to_be_bytes());
    }
    let ms = chrono::Utc::now().timestamp_millis().max(0) as u64;
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = (bytes[6] & 0x0f) | 0x70;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
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
    // Every emit makes one: a `format!` per byte was 2-3% of the bench's
    // emitting process.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip_and_new_ids_are_version_7() {
        let id = new_event_id();
        assert_eq!(&id[14..15], "7", "{id}");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_eq!(format_uuid(&parse_uuid(&id).unwrap()), id);
        let known: [u8; 16] = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x0f, 0xf0, 0xff, 0x10, 0x9a,
            0xbc, 0xde,
        ];
        assert_eq!(format_uuid(&known), "01234567-89ab-cdef-000f-f0ff109abcde");
        assert_ne!(new_event_id(), id);
        assert!(parse_uuid("not-a-uuid").is_none());
        assert!(parse_uuid("01234567-89ab-8def-8000-00000000002").is_none());
    }

    #[test]
    fn traceparent_headers_must_be_w3c_trace_contexts() {
        // The forms trace::parse refuses are its own test's; here, that
        // emit asks it, whatever the header name's case.
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let with = |name: &str, value: &str| {
            Event::new("order", "1", "placed", 1)
                .header(name, value)
                .validate()
        };
        assert!(with("traceparent", good).is_ok());
        for (name, value) in [
            ("traceparent", "garbage"),
            ("TraceParent", "garbage"),
            (
                "traceparent",
                " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            (
                "traceparent",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            ),
        ] {
            let error = with(name, value).unwrap_err().to_string();
            assert!(error.contains("not a W3C trace context"), "{error}");
        }
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
            Event::new("order", "1", "placed", 1).id("00000000-0000-0000-0000-000000000000"),
            Event::new("order", "1", "placed", 1).header("event-id", "x"),
            Event::new("order", "1", "placed", 1).header("bad name", "x"),
            Event::new("order", "1", "placed", 1).header("ok", "line\nbreak"),
            Event::new("order", "1", "placed", "nul\0byte"),
            Event::new("order", "1", "placed", 1).queue(""),
            Event::new("order", "1", "placed", 1).delay(MAX_EVENT_DELAY * 2),
        ];
        for e in cases {
            let err = e.validate().unwrap_err().to_string();
            assert!(err.contains("event"), "{err}");
        }
    }
}
