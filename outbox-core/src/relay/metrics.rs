//! What relays record through the `metrics` facade, and the backlog read
//! from the database for the gauges.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// Events the broker acknowledged, by relay.
pub const PUBLISHED: &str = "outbox_relay_published_total";
/// Publishes that failed, by relay, class (transient, permanent) and kind.
pub const FAILURES: &str = "outbox_relay_failures_total";
/// From the emitting transaction to the broker's acknowledgement, by relay.
pub const COMMIT_TO_ACK: &str = "outbox_relay_commit_to_ack_seconds";
/// One publish call, by relay.
pub const PUBLISH_DURATION: &str = "outbox_relay_publish_seconds";
/// 1 while the relay's circuit is open (the broker presumed down), by relay.
pub const CIRCUIT_OPEN: &str = "outbox_relay_circuit_open";

pub(crate) fn circuit(relay: &Arc<str>, open: bool) {
    metrics::gauge!(CIRCUIT_OPEN, "relay" => Arc::clone(relay)).set(if open { 1.0 } else { 0.0 });
}

pub(crate) fn published(relay: &Arc<str>, took: Duration, created_at: DateTime<Utc>) {
    metrics::counter!(PUBLISHED, "relay" => Arc::clone(relay)).increment(1);
    metrics::histogram!(PUBLISH_DURATION, "relay" => Arc::clone(relay)).record(took.as_secs_f64());
    let age = (Utc::now() - created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
    metrics::histogram!(COMMIT_TO_ACK, "relay" => Arc::clone(relay)).record(age.max(0.0));
}

pub(crate) fn failed(relay: &Arc<str>, class: &'static str, kind: &'static str) {
    metrics::counter!(FAILURES, "relay" => Arc::clone(relay), "class" => class, "kind" => kind)
        .increment(1);
}

/// The events of one queue not yet published.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Backlog {
    /// The queue.
    pub queue: String,
    /// Events waiting or in flight (not dead).
    pub pending: i64,
    /// How long the oldest of them has waited, in seconds.
    pub oldest_age_s: f64,
    /// Dead events.
    pub dead: i64,
    /// Aggregates held back by a dead event.
    pub blocked_keys: i64,
}

/// The backlog of every queue holding events.
pub async fn backlog(pool: &PgPool) -> crate::Result<Vec<Backlog>> {
    let rows: Vec<(String, i64, f64, i64, i64)> = sqlx::query_as(
        "SELECT queue,
                count(*) FILTER (WHERE dead_at IS NULL),
                coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_at IS NULL)), 0)::float8,
                count(*) FILTER (WHERE dead_at IS NOT NULL),
                count(DISTINCT ordering_key) FILTER (WHERE dead_at IS NOT NULL AND NOT skip_dead)
         FROM outbox_tasks
         WHERE task_type = 'outbox.event' AND state <> 'completed'
         GROUP BY queue ORDER BY queue",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(queue, pending, oldest_age_s, dead, blocked_keys)| Backlog {
                queue,
                pending,
                oldest_age_s,
                dead,
                blocked_keys,
            },
        )
        .collect())
}
