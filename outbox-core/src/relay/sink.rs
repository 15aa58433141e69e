//! What a sink is: a broker client that publishes one message and says
//! whether the broker has it, or why not.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// One event, ready for a broker.
#[derive(Debug, Clone)]
pub struct Message {
    /// The event id: the consumers' dedup key, and the broker's own dedup
    /// field where it has one.
    pub event_id: String,
    /// The aggregate's type.
    pub aggregate_type: String,
    /// The aggregate's id: the message key.
    pub aggregate_id: String,
    /// The event's type.
    pub event_type: String,
    /// The event's JSON body.
    pub payload: Vec<u8>,
    /// Every header: the relay's own (`event-id`, `aggregate-type`,
    /// `aggregate-id`, `event-type`, `sequence`, `created-at`) then the
    /// emitter's (`traceparent` among them).
    pub headers: Vec<(String, String)>,
    /// The event's position in the log: increasing, with gaps, in its
    /// aggregate's commit order (an unordered event's gives no order).
    pub sequence: i64,
    /// When it was emitted (the emitting statement's start).
    pub created_at: DateTime<Utc>,
    /// Where the route sends it: a topic, subject, routing key or stream.
    pub destination: String,
}

#[cfg(test)]
impl Message {
    /// A message to `destination` with `headers`, for the sinks' unit tests.
    #[allow(
        dead_code,
        reason = "the sinks' tests use it, each behind its cargo feature"
    )]
    pub(crate) fn for_test(destination: &str, headers: &[(&str, &str)]) -> Self {
        Self {
            event_id: "0190a0b0-0000-7000-8000-000000000001".to_owned(),
            aggregate_type: "order".to_owned(),
            aggregate_id: "1".to_owned(),
            event_type: "order.placed".to_owned(),
            payload: b"{}".to_vec(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            sequence: 1,
            created_at: chrono::Utc::now(),
            destination: destination.to_owned(),
        }
    }
}

/// Why a publish did not land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishError {
    /// The moment, not the message: the broker is down, slow, full, or
    /// refused for now. Retried with backoff without spending an attempt;
    /// enough in a row open the relay's circuit.
    Transient {
        /// A short label for metrics (`connect`, `timeout`, `nack`, ...).
        kind: &'static str,
        /// What the broker or client said.
        reason: String,
        /// The broker's own "retry after", when it gave one.
        retry_after: Option<Duration>,
    },
    /// The message itself: no retry makes the broker take it (too large, a
    /// destination that cannot exist, returned unroutable). Follows the
    /// retry table, then the event is dead and its aggregate blocked.
    Permanent {
        /// A short label for metrics (`too_large`, `returned`, `rejected`, ...).
        kind: &'static str,
        /// What the broker or client said.
        reason: String,
    },
}

impl PublishError {
    /// A transient failure.
    pub fn transient(kind: &'static str, reason: impl std::fmt::Display) -> Self {
        Self::Transient {
            kind,
            reason: reason.to_string(),
            retry_after: None,
        }
    }

    /// A permanent failure.
    pub fn permanent(kind: &'static str, reason: impl std::fmt::Display) -> Self {
        Self::Permanent {
            kind,
            reason: reason.to_string(),
        }
    }

    /// Its metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Transient { kind, .. } | Self::Permanent { kind, .. } => kind,
        }
    }

    /// True for a transient failure.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transient { kind, reason, .. } => write!(f, "transient ({kind}): {reason}"),
            Self::Permanent { kind, reason } => write!(f, "permanent ({kind}): {reason}"),
        }
    }
}

/// A publish in flight.
pub type PublishFuture<'a> = Pin<Box<dyn Future<Output = Result<(), PublishError>> + Send + 'a>>;

/// A sink's look at its broker before the relay runs ([`Sink::preflight`]).
pub type PreflightFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Preflight>> + Send + 'a>>;

/// What a sink's look at its broker before the relay runs found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preflight {
    /// The broker answered and lacks what the relay publishes to (no NATS
    /// stream listens on the route's subjects, the RabbitMQ exchange does
    /// not exist): every publish fails until an operator makes it. Says
    /// what is missing and how to make it.
    Missing(String),
    /// The broker could not be asked (down, unreachable, too slow): the
    /// relay starts anyway and treats it as any outage.
    Unreachable(String),
}

impl std::fmt::Display for Preflight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing(why) | Self::Unreachable(why) => f.write_str(why),
        }
    }
}

/// A broker client. `publish` returns once the broker has the message
/// durably (its ack, confirm or 2xx), and is called concurrently, up to the
/// relay's concurrency: a sink keeps one connection and pipelines.
pub trait Sink: Send + Sync + 'static {
    /// The kind of broker, for logs and metrics (`nats`, `redis`, ...).
    fn kind(&self) -> &'static str;

    /// Publishes one message.
    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a>;

    /// Refuses a message the broker would misread whatever happens (a
    /// header it acts on, a field it already has), before it is sent:
    /// its aggregate parks at once, with this reason. Nothing reaches the
    /// broker, so this says nothing of its health (the relay's circuit
    /// and its failing report stay as they are). Accepts every message
    /// unless the sink says otherwise; a sink wrapping another forwards it.
    fn check(&self, message: &Message) -> Result<(), PublishError> {
        let _ = message;
        Ok(())
    }

    /// Why a publish that got no acknowledgement in time may never have
    /// reached the broker (a client that is not connected), for the
    /// relay's report of the timeout: a "connection" failure naming this,
    /// rather than a missing acknowledgement. None when it cannot tell (the
    /// default); a sink wrapping another forwards it.
    fn unreachable(&self) -> Option<String> {
        None
    }

    /// Refuses a route whose destinations this sink cannot take whatever
    /// happens (a NATS stream it makes that listens on other subjects),
    /// when the relay is checked before it starts: its events would
    /// otherwise be retried for ever as an outage. Accepts every route
    /// unless the sink says otherwise; a sink wrapping another forwards it.
    fn check_route(&self, route: &Route) -> Result<(), String> {
        let _ = route;
        Ok(())
    }

    /// Asks the broker, once before the relay runs, whether what `route`
    /// sends to can exist there (a stream or an exchange it does not make
    /// itself): without this, a missing one shows only as publishes that
    /// fail as an outage, retried for ever. Bounded in time by the sink.
    /// Accepts everything unless the sink says otherwise; a sink wrapping
    /// another forwards it.
    fn preflight<'a>(&'a self, route: &'a Route) -> PreflightFuture<'a> {
        let _ = route;
        Box::pin(async { Ok(()) })
    }

    /// The relay's concurrency unless one is set: how many aggregates
    /// publish at once. One aggregate's events go one after another, each
    /// waiting for its acknowledgement, so a sink whose acknowledgements
    /// wait for a batch to fill (Kafka's linger) needs more aggregates in
    /// flight to keep the broker busy.
    fn default_concurrency(&self) -> usize {
        super::DEFAULT_RELAY_CONCURRENCY
    }
}

/// Where a message goes, from a template over the event's fields:
/// `{aggregate_type}` and `{event_type}` are replaced, everything else is
/// kept (`orders.{aggregate_type}` sends an `invoice` event to
/// `orders.invoice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    template: String,
    /// The template cut at its fields, so that filling it in is one
    /// allocation per event rather than a search and a copy per field.
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    AggregateType,
    EventType,
}

impl Part {
    /// This part of an event's destination.
    fn fill<'a>(&'a self, aggregate_type: &'a str, event_type: &'a str) -> &'a str {
        match self {
            Self::Text(text) => text,
            Self::AggregateType => aggregate_type,
            Self::EventType => event_type,
        }
    }
}

impl Route {
    /// Parses a template; an unknown `{field}` is an error.
    pub fn parse(template: &str) -> Result<Self, String> {
        if template.is_empty() {
            return Err("a route template cannot be empty".to_owned());
        }
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                return Err(format!("route {template:?}: a '{{' is not closed"));
            };
            let field = match &rest[open + 1..open + close] {
                "aggregate_type" => Part::AggregateType,
                "event_type" => Part::EventType,
                field => {
                    return Err(format!(
                        "route {template:?}: unknown field {{{field}}} (use {{aggregate_type}} or {{event_type}})"
                    ));
                }
            };
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            parts.push(field);
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Self {
            template: template.to_owned(),
            parts,
        })
    }

    /// The destination of an event.
    pub fn destination(&self, aggregate_type: &str, event_type: &str) -> String {
        let filled = |p| Part::fill(p, aggregate_type, event_type);
        let mut out = String::with_capacity(self.parts.iter().map(|p| filled(p).len()).sum());
        for p in &self.parts {
            out.push_str(filled(p));
        }
        out
    }

    /// The template as given.
    pub fn template(&self) -> &str {
        &self.template
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_fill_fields_and_refuse_unknown_ones() {
        let r = Route::parse("events.{aggregate_type}.{event_type}").unwrap();
        assert_eq!(r.destination("order", "placed"), "events.order.placed");
        assert!(Route::parse("x.{aggregate_id}").is_err());
        assert!(Route::parse("x.{aggregate_type").is_err());
        assert!(Route::parse("").is_err());
        assert_eq!(
            Route::parse("plain").unwrap().destination("a", "b"),
            "plain"
        );
        // Fields first, side by side, twice, and text after them.
        let r = Route::parse("{event_type}{aggregate_type}.x.{event_type}-").unwrap();
        assert_eq!(r.destination("order", "placed"), "placedorder.x.placed-");
        // A value is put in as it is, never read as a template itself.
        let r = Route::parse("{aggregate_type}.{event_type}").unwrap();
        assert_eq!(r.destination("{event_type}", "e"), "{event_type}.e");
        assert_eq!(r.template(), "{aggregate_type}.{event_type}");
    }
}
