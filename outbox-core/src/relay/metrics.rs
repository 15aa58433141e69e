//! What relays record through the `metrics` facade. The gauges of each
//! subscription's lag are read from the database when scraped
//! ([`super::subscriptions`]).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics::{Counter, Gauge, Histogram};

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
/// Events held back, by relay: refused, behind a refused event of their
/// aggregate, or delayed (their delay not yet run out when first read).
pub const PARKED: &str = "outbox_relay_parked_total";
/// Event log partitions dropped at the maximum age before every
/// subscription had passed them (events lost to a stuck subscription).
pub const FORCED_DROPS: &str = "outbox_event_log_forced_drops_total";

/// A relay's instruments written at every publish, looked up once when it
/// starts (from the recorder installed then): the macros build each key
/// and look it up in the recorder's registry at every call, which at tens
/// of thousands of events a second is work of its own.
pub(crate) struct Instruments {
    published: Counter,
    publish_duration: Histogram,
    commit_to_ack: Histogram,
    circuit_open: Gauge,
}

impl Instruments {
    pub(crate) fn new(relay: &Arc<str>) -> Self {
        Self {
            published: metrics::counter!(PUBLISHED, "relay" => Arc::clone(relay)),
            publish_duration: metrics::histogram!(PUBLISH_DURATION, "relay" => Arc::clone(relay)),
            commit_to_ack: metrics::histogram!(COMMIT_TO_ACK, "relay" => Arc::clone(relay)),
            circuit_open: metrics::gauge!(CIRCUIT_OPEN, "relay" => Arc::clone(relay)),
        }
    }

    pub(crate) fn circuit(&self, open: bool) {
        self.circuit_open.set(if open { 1.0 } else { 0.0 });
    }

    pub(crate) fn published(&self, took: Duration, created_at: DateTime<Utc>) {
        self.published.increment(1);
        self.publish_duration.record(took.as_secs_f64());
        let age = (Utc::now() - created_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
        self.commit_to_ack.record(age.max(0.0));
    }
}

pub(crate) fn failed(relay: &Arc<str>, class: &'static str, kind: &'static str) {
    metrics::counter!(FAILURES, "relay" => Arc::clone(relay), "class" => class, "kind" => kind)
        .increment(1);
}

pub(crate) fn parked(relay: &Arc<str>, events: usize) {
    metrics::counter!(PARKED, "relay" => Arc::clone(relay)).increment(events as u64);
}
