//! Relays: publish the event log to a broker, at least once, in
//! per-aggregate commit order.
//!
//! A relay is a subscription to the log (named after the relay) with a
//! [`Sink`]. It reads what committed in batches by position, keeping the
//! positions of transactions still open as gaps to read again, publishes each aggregate's events in order and different
//! aggregates in parallel, and moves its cursor once the broker
//! acknowledged the whole batch. Nothing in the log is updated: every
//! subscription has its own cursor, so one emit reaches Kafka and a
//! webhook alike, and a new subscription starts at the start of what the
//! log keeps (or at its head). A worker runs any number of relays:
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
//! Scale: a subscription's aggregates are split into [`Relay::partitions`]
//! by hash; each partition is leased to one relay worker at a time (the
//! lease runs out on the database's clock unless renewed, and every write
//! names the lease's fence, so a worker that lost it writes nothing), and
//! partitions are shared out again as relay workers come and go.
//!
//! What a sink's failure means:
//! - transient (broker down or slow): the event is tried again after a
//!   backoff with jitter, and the batch waits for it; five failures in a
//!   row open the relay's circuit, and publishes wait at the gate until a
//!   probe gets through. The cursor stays where it was, so nothing is lost
//!   if the relay worker dies meanwhile;
//! - permanent (the broker refuses this message): the event's aggregate is
//!   parked: the event and its aggregate's later events wait in
//!   `outbox_event_parked`, every other aggregate goes on, and an operator
//!   retries or skips it (`outbox-worker events retry|skip`).

mod admin;
mod circuit;
mod event_status;
mod lease_clock;
pub mod metrics;
mod partition;
mod publish;
mod service;
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

pub use admin::{
    Deleted, ParkedEvent, Subscription, SubscriptionRecord, delayed_until, delete_subscription,
    parked, retry_all_parked, retry_parked, retry_parked_now, rewind_subscription,
    sequence_problem, skip_parked, skip_parked_event, stream_has_subscription, subscription_exists,
    subscription_record, subscriptions,
};
pub use event_status::{EventAt, EventLookup, EventStatus, event_status};
pub use sink::{Message, Preflight, PreflightFuture, PublishError, PublishFuture, Route, Sink};
pub use url::sink_kinds;

pub(crate) use service::run;

use crate::events::EVENTS_QUEUE;

/// Concurrency of a relay that was not given one: aggregates publishing
/// at once in each partition (one event each).
pub const DEFAULT_RELAY_CONCURRENCY: usize = 256;

/// Positions a batch spans at most, unless told otherwise.
pub const DEFAULT_BATCH: i64 = 10_000;

/// How long a relay waits before looking at the log again after finding
/// nothing new, unless told otherwise.
pub const DEFAULT_POLL: Duration = Duration::from_millis(5);

/// How long a partition's lease lasts unless renewed, unless told
/// otherwise: a relay worker that dies hands its partitions over within it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// The most partitions a subscription may have.
pub const MAX_PARTITIONS: i32 = 1024;

/// The route of a relay that was not given one: Debezium's default topic
/// (`outbox.event.order` for an `order` aggregate).
pub const DEFAULT_ROUTE: &str = "outbox.event.{aggregate_type}";

/// How long a publish may take before it counts as a transient failure.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a new subscription starts reading the log. An existing
/// subscription goes on from its cursor whatever its relay says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// The start of what the log keeps (the default).
    #[default]
    Beginning,
    /// The log's head: only events emitted from then on.
    Head,
    /// The event at this position (1 or more) and every later one: a
    /// replay from a retained position (`events parked`, the log's
    /// `position` column, an inbox's `sequence` header). At the head at
    /// most.
    Position(i64),
    /// Every event emitted at or after this time: the subscription starts
    /// after the last event emitted before it (so an event of a
    /// transaction open then, emitted just before it, may come too).
    Time(chrono::DateTime<chrono::Utc>),
}

impl std::str::FromStr for Start {
    type Err = String;

    /// `start`, `head`, a position (1 or more) or an RFC 3339 time, as a
    /// relay URL's `start=` and `events rewind --to` take them.
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "start" => Ok(Start::Beginning),
            "head" => Ok(Start::Head),
            other => match (
                other.parse::<i64>(),
                chrono::DateTime::parse_from_rfc3339(other),
            ) {
                (Ok(p), _) if p >= 1 => Ok(Start::Position(p)),
                (_, Ok(t)) => Ok(Start::Time(t.with_timezone(&chrono::Utc))),
                _ => Err(format!(
                    "{other:?}: use start (the start of what the log keeps), head, \
                     a position (1 or more) or an RFC 3339 time (2026-11-28T09:00:00Z)"
                )),
            },
        }
    }
}

/// One relay: a name (its subscription's, and for logs and metrics), a
/// sink, the stream it reads and how it routes.
#[derive(Clone)]
pub struct Relay {
    pub(crate) name: String,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) queue: String,
    pub(crate) concurrency: usize,
    pub(crate) route: Result<Route, String>,
    pub(crate) give_up_after: Option<i32>,
    pub(crate) publish_timeout: Duration,
    pub(crate) partitions: i32,
    pub(crate) start: Start,
    pub(crate) batch: i64,
    pub(crate) poll: Duration,
    pub(crate) lease: Duration,
    /// Whoever built it already looked at the broker ([`Relay::preflight`]),
    /// so the running relay does not look again.
    pub(crate) preflighted: bool,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("name", &self.name)
            .field("sink", &self.sink.kind())
            .field("queue", &self.queue)
            .field("concurrency", &self.concurrency)
            .field("route", &self.route)
            .field("partitions", &self.partitions)
            .field("start", &self.start)
            .finish()
    }
}

/// What is wrong with a relay's name, if anything: it names the
/// subscription, the metrics' label and its secret's variable
/// (`OUTBOX_RELAY_<NAME>_SECRET`).
pub(crate) fn name_problem(name: &str) -> Option<String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
    (!valid).then(|| format!("relay name {name:?}: use 1 to 64 ASCII letters, digits, '-' or '_'"))
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
            concurrency: sink.default_concurrency(),
            sink,
            queue: EVENTS_QUEUE.to_owned(),
            route: Route::parse(DEFAULT_ROUTE),
            give_up_after: None,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            partitions: 1,
            start: Start::Beginning,
            batch: DEFAULT_BATCH,
            poll: DEFAULT_POLL,
            lease: DEFAULT_LEASE,
            preflighted: false,
        }
    }

    /// A relay from a URL: the scheme picks the sink (`nats://`,
    /// `redis://`, `kafka://`, `http://` or `https://` for webhooks; each
    /// needs its cargo feature), and query parameters set the routing and
    /// the relay's options (`queue`, `concurrency`, `route`,
    /// `give_up_after`, `timeout_ms`, `partitions`, `start=head`, `batch`,
    /// `poll_ms`, `lease_ms`, and the sink's own: see [`sink_kinds`]). Connects
    /// lazily: a broker that is down at start is a transient failure later,
    /// not an error now.
    pub async fn from_url(name: &str, url: &str) -> Result<Self, String> {
        url::relay_from_url(name, url, None).await
    }

    /// [`Relay::from_url`] with the relay's secret given in code (from the
    /// application's secrets store) instead of `OUTBOX_RELAY_<NAME>_SECRET`:
    /// the broker's password (NATS: its token without a user name in the
    /// URL) or the webhook signing key (`whsec_...`). An empty secret is
    /// none.
    pub async fn from_url_with_secret(name: &str, url: &str, secret: &str) -> Result<Self, String> {
        url::relay_from_url(name, url, Some(secret.to_owned())).await
    }

    /// Reads this stream instead of `events` (the events emitted with
    /// [`Event::queue`](crate::Event::queue)).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Publishes at most this many aggregates at once in each partition
    /// (an aggregate's events go one at a time).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Splits the subscription's aggregates into this many partitions,
    /// each published by one relay worker at a time (1 to
    /// [`MAX_PARTITIONS`]). Set when the subscription is created; a
    /// subscription keeps the number it was created with.
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = partitions;
        self
    }

    /// A new subscription starts at the log's head (only events emitted
    /// from then on) instead of the start of what the log keeps. An
    /// existing subscription goes on from its cursor either way.
    pub fn start_at_head(self) -> Self {
        self.start_at(Start::Head)
    }

    /// Where a new subscription starts (see [`Start`]): a replay is a new
    /// subscription from a retained position or time. An existing
    /// subscription goes on from its cursor either way.
    pub fn start_at(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// A batch spans at most this many positions (1 to 1,000,000).
    pub fn batch(mut self, positions: i64) -> Self {
        self.batch = positions;
        self
    }

    /// Looks at the log this often while it has nothing new (1 ms to 10 s):
    /// the floor of the time from commit to publish.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// A partition's lease lasts this long unless renewed (1 s to 10 min):
    /// a relay worker that dies or goes silent hands its partitions over
    /// within it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Routes by this template (see [`Route`]); a bad template is reported
    /// when the worker is built.
    pub fn route(mut self, template: &str) -> Self {
        self.route = Route::parse(template);
        self
    }

    /// Parks an event's aggregate after this many permanent failures of
    /// the event in a row (1, the default: at the first), a second apart.
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
    /// times or counts publishes, say). The decorator forwards
    /// [`Sink::check`], [`Sink::check_route`], [`Sink::unreachable`],
    /// [`Sink::preflight`] and [`Sink::default_concurrency`] to the sink it wraps: the trait's
    /// defaults would silently turn off what the wrapped sink checks.
    pub fn wrap_sink(mut self, wrap: impl FnOnce(Arc<dyn Sink>) -> Arc<dyn Sink>) -> Self {
        self.sink = wrap(self.sink);
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kind of its sink: `nats`, `kafka`, `rabbitmq`, `redis`,
    /// `webhook`, or a custom sink's own.
    pub fn sink_kind(&self) -> &'static str {
        self.sink.kind()
    }

    /// How many aggregates it publishes at once (set, or its sink's
    /// default).
    pub fn concurrency_limit(&self) -> usize {
        self.concurrency
    }

    /// The stream it reads.
    pub fn queue_name(&self) -> &str {
        &self.queue
    }

    /// What the sink says of the route ([`Sink::check_route`]), once the
    /// relay is built: not in [`Relay::from_url`], as a route set after it
    /// ([`Relay::route`]) replaces the URL's.
    pub(crate) fn route_problem(&self) -> Option<String> {
        let route = self.route.as_ref().ok()?;
        let refused = self.sink.check_route(route).err()?;
        Some(format!("relay {:?}: {refused}", self.name))
    }

    /// Asks the broker whether what the relay publishes to can exist there
    /// ([`Sink::preflight`]), for a program that refuses to start on
    /// [`Preflight::Missing`] (the CLI's `run` exits 2). The running relay
    /// then does not ask again; one that was not asked asks when it starts
    /// and logs what it found, publishing anyway (a stream made later is
    /// used as soon as it exists). A relay the worker's build would refuse
    /// is not asked.
    pub async fn preflight(&mut self) -> Result<(), Preflight> {
        self.preflighted = true;
        match &self.route {
            // The worker's build refuses it anyway, saying why.
            Ok(route) if self.problems().is_empty() && self.route_problem().is_none() => {
                self.sink.preflight(route).await
            }
            _ => Ok(()),
        }
    }

    /// What is wrong with it, if anything.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        out.extend(name_problem(&self.name));
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
        if !(1..=MAX_PARTITIONS).contains(&self.partitions) {
            out.push(format!(
                "relay {:?}: {} partitions is out of range: use 1 to {MAX_PARTITIONS}",
                self.name, self.partitions
            ));
        }
        if let Start::Position(p) = self.start
            && p < 1
        {
            out.push(format!(
                "relay {:?}: start position {p} is out of range: positions start at 1",
                self.name
            ));
        }
        if !(1..=1_000_000).contains(&self.batch) {
            out.push(format!(
                "relay {:?}: batch {} is out of range: use 1 to 1000000",
                self.name, self.batch
            ));
        }
        if self.concurrency == 0 || self.concurrency > crate::MAX_CONCURRENCY {
            out.push(format!(
                "relay {:?}: concurrency {} is out of range: use 1 to {}",
                self.name,
                self.concurrency,
                crate::MAX_CONCURRENCY
            ));
        }
        if self.poll < Duration::from_millis(1) || self.poll > Duration::from_secs(10) {
            out.push(format!(
                "relay {:?}: poll interval {:?} is out of range: use 1ms to 10s",
                self.name, self.poll
            ));
        }
        if self.lease < Duration::from_secs(1) || self.lease > Duration::from_secs(600) {
            out.push(format!(
                "relay {:?}: lease {:?} is out of range: use 1s to 10m",
                self.name, self.lease
            ));
        }
        if self.queue.is_empty() || self.queue.len() > crate::events::MAX_EVENT_FIELD {
            out.push(format!(
                "relay {:?}: stream {:?}: use 1 to {} bytes",
                self.name,
                self.queue,
                crate::events::MAX_EVENT_FIELD
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
