//! Test helpers for events: what a transaction emitted.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

/// An event as the log holds it, read back by [`emitted`].
#[derive(Debug, Clone, PartialEq)]
pub struct EmittedEvent {
    /// The event id (the consumers' dedup key).
    pub id: String,
    /// Its position in the log (the `sequence` header).
    pub position: i64,
    /// The aggregate's type.
    pub aggregate_type: String,
    /// The aggregate's id.
    pub aggregate_id: String,
    /// The event type.
    pub event_type: String,
    /// The payload.
    pub payload: serde_json::Value,
    /// The emitter's headers (those the relay adds are not stored).
    pub headers: BTreeMap<String, String>,
    /// The stream relays read it from (`events` unless
    /// [`Event::queue`](crate::Event::queue) said otherwise).
    pub stream: String,
    /// Not published before this time ([`Event::delay`](crate::Event::delay)).
    pub publish_at: Option<DateTime<Utc>>,
}

/// Every event emitted in `conn`'s open transaction, in log order. Call it
/// before the transaction ends (a test that rolls back afterwards leaves
/// nothing behind). It scans the log, which has no index for it: for tests.
pub async fn emitted(conn: &mut PgConnection) -> Vec<EmittedEvent> {
    let rows = sqlx::query(include_str!("../db/sql/emitted_in_transaction.sql"))
        .fetch_all(conn)
        .await
        .expect("query the events this transaction emitted");
    rows.iter()
        .map(|r| {
            let headers: Option<serde_json::Value> = r.get("headers");
            let headers = headers
                .and_then(|h| serde_json::from_value(h).ok())
                .unwrap_or_default();
            EmittedEvent {
                id: r.get("id"),
                position: r.get("position"),
                aggregate_type: r.get("aggregatetype"),
                aggregate_id: r.get("aggregateid"),
                event_type: r.get("type"),
                payload: r
                    .get::<Option<serde_json::Value>, _>("payload")
                    .unwrap_or_default(),
                headers,
                stream: r.get("stream"),
                publish_at: r.get("publish_at"),
            }
        })
        .collect()
}

/// Panics unless `conn`'s open transaction emitted an event `event_type`
/// of aggregate `aggregate_type`/`aggregate_id`; returns the first such
/// event, for assertions on its payload. The message lists what was
/// emitted.
pub async fn assert_emitted(
    conn: &mut PgConnection,
    aggregate_type: &str,
    aggregate_id: &str,
    event_type: &str,
) -> EmittedEvent {
    let all = emitted(conn).await;
    match all.iter().find(|e| {
        e.aggregate_type == aggregate_type
            && e.aggregate_id == aggregate_id
            && e.event_type == event_type
    }) {
        Some(found) => found.clone(),
        None => panic!(
            "no {event_type:?} event of {aggregate_type}/{aggregate_id} was emitted; emitted: {:?}",
            all.iter()
                .map(|e| format!(
                    "{} of {}/{}",
                    e.event_type, e.aggregate_type, e.aggregate_id
                ))
                .collect::<Vec<_>>()
        ),
    }
}

/// Panics if `conn`'s open transaction emitted an event `event_type`.
pub async fn assert_none_emitted(conn: &mut PgConnection, event_type: &str) {
    let found: Vec<EmittedEvent> = emitted(conn)
        .await
        .into_iter()
        .filter(|e| e.event_type == event_type)
        .collect();
    assert!(
        found.is_empty(),
        "expected no {event_type:?} event, found {found:?}"
    );
}
