//! One event and where each subscription stands with it: for an operator
//! asking "did sink X get event Y?" (`outbox-worker events show`).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::{Error, Result};

/// Which event to look up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventLookup {
    /// The event at this position of the log.
    Position(i64),
    /// The event with this id (a UUID), emitted within `window` of the
    /// time a UUIDv7 id carries, or in the last `window` for any other id:
    /// the log has no index on id, so the window keeps the search to a few
    /// days' partitions.
    Id {
        /// The event id.
        id: String,
        /// How far to look.
        window: std::time::Duration,
    },
}

/// An event of the log and, for each subscription reading its stream,
/// where it stands there.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EventStatus {
    /// Its position in the log.
    pub position: i64,
    /// Its id.
    pub id: String,
    /// Its aggregate's type.
    pub aggregate_type: String,
    /// Its aggregate's id.
    pub aggregate_id: String,
    /// Its type.
    pub event_type: String,
    /// Its payload (JSON).
    pub payload: Option<serde_json::Value>,
    /// Its headers, as the emitter gave them.
    pub headers: Option<serde_json::Value>,
    /// The stream it was emitted to.
    pub stream: String,
    /// When it was emitted.
    pub created_at: DateTime<Utc>,
    /// Not published before this time (a delay), if it has one.
    pub publish_at: Option<DateTime<Utc>>,
    /// Each subscription reading its stream, by name (empty when none
    /// does).
    pub subscriptions: Vec<EventAt>,
}

/// Where one subscription stands with an event.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EventAt {
    /// The subscription.
    pub subscription: String,
    /// `passed` (published, or passed over by a skip, a rewind forward or
    /// a subscription started at the head; or emitted below the cursor
    /// while the position sequence was behind or cached, which is never
    /// published: the cursor cannot tell), `held back` (its aggregate is
    /// parked: `error` says why when the broker refused it, `retry_at`
    /// when it is tried again) or `waiting` (not read yet, or its
    /// transaction was open when the cursor passed it).
    pub state: String,
    /// Why the broker refused it, when it did.
    pub error: Option<String>,
    /// When the relay tries it again (none: when an operator says so, or
    /// when the event before it in its aggregate goes).
    pub retry_at: Option<DateTime<Utc>>,
}

/// The event `lookup` names and where each subscription stands with it;
/// none when the log has no such event (never emitted, dropped by
/// retention, or an id outside the window). A malformed id is an error.
pub async fn event_status(pool: &PgPool, lookup: &EventLookup) -> Result<Option<EventStatus>> {
    let (id, window) = match lookup {
        EventLookup::Position(p) => return read(pool, Some(*p), None, None).await,
        EventLookup::Id { id, window } => (id, window),
    };
    let id = super::admin::canonical_event_id(id)?;
    let window = chrono::Duration::from_std(*window)
        .map_err(|e| Error::InvalidOption(format!("window: {e}")))?;
    let bytes = crate::events::parse_uuid(&id).unwrap_or_default();
    if let Some(at) = uuid_v7_time(&bytes) {
        let found = read(pool, None, Some(&id), Some((at - window, at + window))).await?;
        if found.is_some() {
            return Ok(found);
        }
    }
    // Any other id, or a v7 id chosen by hand, which may carry any time.
    let now = Utc::now();
    let recent = (now - window, now + chrono::Duration::hours(1));
    read(pool, None, Some(&id), Some(recent)).await
}

/// The event at `position`, or with `id` emitted within `window`.
async fn read(
    pool: &PgPool,
    position: Option<i64>,
    id: Option<&str>,
    window: Option<(DateTime<Utc>, DateTime<Utc>)>,
) -> Result<Option<EventStatus>> {
    use sqlx::Row as _;
    let (from, to) = window.unzip();
    let rows = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("../db/sql/event_status.sql"))
            .bind(position)
            .bind(id)
            .bind(from)
            .bind(to)
            .fetch_all(conn)
            .await
    })
    .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let mut status = EventStatus {
        position: first.try_get("position")?,
        id: first.try_get("id")?,
        aggregate_type: first.try_get("aggregatetype")?,
        aggregate_id: first.try_get("aggregateid")?,
        event_type: first.try_get("type")?,
        payload: first.try_get("payload")?,
        headers: first.try_get("headers")?,
        stream: first.try_get("stream")?,
        created_at: first.try_get("created_at")?,
        publish_at: first.try_get("publish_at")?,
        subscriptions: Vec::new(),
    };
    for row in &rows {
        // One row with no subscription when none reads the stream.
        if let Some(subscription) = row.try_get("subscription")? {
            status.subscriptions.push(EventAt {
                subscription,
                state: row.try_get("state")?,
                error: row.try_get("error")?,
                retry_at: row.try_get("retry_at")?,
            });
        }
    }
    Ok(Some(status))
}

/// The time a UUIDv7 carries (its first 48 bits, milliseconds since the
/// epoch), or none for another version.
fn uuid_v7_time(bytes: &[u8; 16]) -> Option<DateTime<Utc>> {
    if bytes[6] >> 4 != 7 {
        return None;
    }
    let ms = bytes[..6]
        .iter()
        .fold(0i64, |acc, b| (acc << 8) | i64::from(*b));
    DateTime::from_timestamp_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v7_id_carries_its_time_and_others_none() {
        let id = crate::events::new_event_id();
        let bytes = crate::events::parse_uuid(&id).unwrap();
        let at = uuid_v7_time(&bytes).expect("a v7 id");
        assert!((Utc::now() - at).num_seconds().abs() < 60, "{at}");
        let v4 = crate::events::parse_uuid("0190a0b0-0000-4000-8000-000000000001").unwrap();
        assert_eq!(uuid_v7_time(&v4), None);
    }
}
