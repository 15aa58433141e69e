//! Relays: publish events to a broker, at least once, in per-aggregate
//! order.
//!
//! A relay is the handler of `outbox.event` tasks on one queue (`events`
//! unless told otherwise) with a [`Sink`]: each event is a task, claimed,
//! published, and completed once the broker acknowledged it. A worker runs
//! any number of relays, one per queue:
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> outbox::Result<()> {
//! # #[cfg(feature = "nats")] {
//! use outbox::relay::Relay;
//! let relay = Relay::from_url("nats", "nats://127.0.0.1:4222?subject=events.{aggregate_type}")
//!     .await
//!     .map_err(outbox::Error::InvalidOption)?;
//! let worker = outbox::Worker::builder(pool).relay(relay).build()?;
//! # }
//! # Ok(()) }
//! ```
//!
//! What a sink's failure means:
//! - transient (broker down or slow): the event goes back without
//!   spending an attempt, after a backoff with jitter; five in a row open
//!   the relay's circuit, and its handlers wait at the gate (holding the
//!   relay's concurrency, so it claims nothing more) until a probe gets
//!   through;
//! - permanent (the broker refuses this message): the attempt fails and
//!   the retry table applies; at the end the event is dead and its
//!   aggregate's later events wait behind it, as ordering keys do, until an
//!   operator retries, skips or cancels it.

mod circuit;
mod handler;
pub mod metrics;
mod sink;
mod url;

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "webhook")]
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

pub use metrics::{Backlog, backlog};
pub use sink::{Message, PublishError, PublishFuture, Route, Sink};
pub use url::sink_kinds;

pub(crate) use handler::RelayHandler;

use crate::events::EVENTS_QUEUE;

/// Concurrency of a relay that was not given one: events in flight to the
/// broker at once.
pub const DEFAULT_RELAY_CONCURRENCY: usize = 100;

/// The route of a relay that was not given one: Debezium's default topic
/// (`outbox.event.order` for an `order` aggregate).
pub const DEFAULT_ROUTE: &str = "outbox.event.{aggregate_type}";

/// How long a publish may take before it counts as a transient failure.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// One relay: a name (for logs and metrics), a sink, the queue it serves
/// and how it routes.
#[derive(Clone)]
pub struct Relay {
    pub(crate) name: String,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) queue: String,
    pub(crate) concurrency: usize,
    pub(crate) route: Result<Route, String>,
    pub(crate) give_up_after: Option<i32>,
    pub(crate) publish_timeout: Duration,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("name", &self.name)
            .field("sink", &self.sink.kind())
            .field("queue", &self.queue)
            .field("concurrency", &self.concurrency)
            .field("route", &self.route)
            .finish()
    }
}

impl Relay {
    /// A relay named `name` publishing through `sink`, serving the
    /// `events` queue, routing by aggregate type.
    pub fn new(name: impl Into<String>, sink: impl Sink) -> Self {
        Self::from_arc(name, Arc::new(sink))
    }

    /// [`Relay::new`] with a shared sink.
    pub fn from_arc(name: impl Into<String>, sink: Arc<dyn Sink>) -> Self {
        Self {
            name: name.into(),
            sink,
            queue: EVENTS_QUEUE.to_owned(),
            concurrency: DEFAULT_RELAY_CONCURRENCY,
            route: Route::parse(DEFAULT_ROUTE),
            give_up_after: None,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
        }
    }

    /// A relay from a URL: the scheme picks the sink (`nats://`,
    /// `redis://`, `kafka://`, `http://` or `https://` for webhooks; each
    /// needs its cargo feature), and query parameters set the routing and
    /// the relay's options (`queue`, `concurrency`, `route`,
    /// `give_up_after`, `timeout_ms`, and the sink's own: see
    /// [`sink_kinds`]). Connects
    /// lazily: a broker that is down at start is a transient failure later,
    /// not an error now.
    pub async fn from_url(name: &str, url: &str) -> Result<Self, String> {
        url::relay_from_url(name, url).await
    }

    /// Serves this queue instead of `events`.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Publishes at most this many events at once.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Routes by this template (see [`Route`]); a bad template is reported
    /// when the worker is built.
    pub fn route(mut self, template: &str) -> Self {
        self.route = Route::parse(template);
        self
    }

    /// Makes an event dead after this many permanent failures, before the
    /// retry table's end (1: dead at the first).
    pub fn give_up_after(mut self, attempts: i32) -> Self {
        self.give_up_after = Some(attempts);
        self
    }

    /// How long one publish may take before it counts as a transient
    /// failure.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Replaces the sink with what `wrap` makes of it (a decorator that
    /// times or counts publishes, say).
    pub fn wrap_sink(mut self, wrap: impl FnOnce(Arc<dyn Sink>) -> Arc<dyn Sink>) -> Self {
        self.sink = wrap(self.sink);
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue it serves.
    pub fn queue_name(&self) -> &str {
        &self.queue
    }

    /// What is wrong with it, if anything.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let valid_name = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
        if !valid_name {
            out.push(format!(
                "relay name {:?}: use 1 to 64 ASCII letters, digits, '-' or '_'",
                self.name
            ));
        }
        if let Err(e) = &self.route {
            out.push(format!("relay {:?}: {e}", self.name));
        }
        if let Some(n) = self.give_up_after
            && n < 1
        {
            out.push(format!(
                "relay {:?}: give_up_after {n} is out of range: use 1 or more",
                self.name
            ));
        }
        if self.publish_timeout < Duration::from_millis(10)
            || self.publish_timeout > Duration::from_secs(600)
        {
            out.push(format!(
                "relay {:?}: publish timeout {:?} is out of range: use 10ms to 10m",
                self.name, self.publish_timeout
            ));
        }
        out
    }
}
