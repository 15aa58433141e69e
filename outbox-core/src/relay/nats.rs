//! NATS JetStream sink (`nats` feature), with `async-nats`.
//!
//! Each event is published to its routed subject with `Nats-Msg-Id` set to
//! the event id and the subject (`<event id>:<subject>`, see
//! `message_id`), and the PubAck is awaited: the stream has the message
//! once the ack arrives. JetStream drops a second message with the same
//! `Nats-Msg-Id` within the stream's duplicate window and acks it as a
//! duplicate, which counts as success here. A relay republishes an event
//! after a lost ack within its backoff (at most 30 s), and after a worker's
//! crash once its partition's lease runs out: keep the duplicate window
//! (JetStream's default is 2 minutes; a stream made here gets 10) longer
//! than the lease plus 30 s, or consumers see those rare duplicates (the
//! inbox catches them anyway).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind};
use tokio::sync::Mutex;

use super::sink::{Message, Preflight, PreflightFuture, PublishError, PublishFuture, Route, Sink};

/// A NATS JetStream sink.
pub struct NatsSink {
    js: jetstream::Context,
    /// The client under `js`, for its connection's state.
    client: async_nats::Client,
    /// The stream to create when the subject has none (`stream=NAME`), with
    /// the subjects it listens on and its duplicate window.
    stream: Option<StreamSpec>,
    /// Set once the stream was found or created: read without a lock by
    /// every publish (hundreds are in flight at once).
    stream_ready: AtomicBool,
    /// Held while the stream is being found or made, so that it is made
    /// once.
    making_stream: Mutex<()>,
    /// The subjects of a stream given none ([`StreamSpec::subjects`]
    /// empty): those of the relay's route, set when the worker checks it
    /// ([`Sink::check_route`]).
    route_subjects: std::sync::OnceLock<Vec<String>>,
    /// Events JetStream acknowledged as repeats (not stored again) since
    /// the last warning, and when that warning was: see
    /// [`NatsSink::note_duplicate`].
    repeats: std::sync::Mutex<(u64, Option<std::time::Instant>)>,
    /// Every such repeat since the sink was made.
    repeats_total: std::sync::atomic::AtomicU64,
}

/// The least time between two warnings about repeats JetStream dropped.
const REPEATS_WARNING_EVERY: Duration = Duration::from_secs(30);

/// A stream the sink makes when it is missing.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Its name.
    pub name: String,
    /// The subjects it listens on (`events.>`). Empty: the relay's
    /// route's fixed part and `>` (`outbox.event.>` for the default route),
    /// from the route the relay has when the worker is built, so a route
    /// set after [`super::Relay::from_url`] counts.
    pub subjects: Vec<String>,
    /// JetStream's dedup window for `Nats-Msg-Id`.
    pub duplicate_window: Duration,
}

impl NatsSink {
    /// Connects to `url` (`nats://host:port`) in the background: a server
    /// that is down now is a transient failure later, not an error now.
    pub async fn connect(url: &str, stream: Option<StreamSpec>) -> Result<Self, String> {
        Self::connect_with(async_nats::ConnectOptions::new(), url, stream).await
    }

    /// [`NatsSink::connect`] with the client's own options (credentials,
    /// TLS).
    pub async fn connect_with(
        options: async_nats::ConnectOptions,
        url: &str,
        stream: Option<StreamSpec>,
    ) -> Result<Self, String> {
        let client = options
            .name("outbox-relay")
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(|e| format!("NATS URL {url:?}: {e}"))?;
        let mut js = jetstream::new(client.clone());
        // The relay's own publish timeout bounds the wait; this is a floor.
        js.set_timeout(Duration::from_secs(30));
        Ok(Self {
            js,
            client,
            stream,
            stream_ready: AtomicBool::new(false),
            repeats: std::sync::Mutex::new((0, None)),
            repeats_total: std::sync::atomic::AtomicU64::new(0),
            making_stream: Mutex::new(()),
            route_subjects: std::sync::OnceLock::new(),
        })
    }

    /// Finds or creates the configured stream (once).
    async fn ensure_stream(&self) -> Result<(), PublishError> {
        match &self.stream {
            Some(spec) if !self.stream_ready.load(Ordering::Acquire) => {
                // Boxed: finding or making the stream is a large future,
                // which would otherwise be part of every publish's and be
                // copied with it into its box, tens of thousands of times
                // a second.
                Box::pin(self.make_stream(spec)).await
            }
            _ => Ok(()),
        }
    }

    /// The subjects stream `spec` listens on: its own, or else the relay's
    /// route's (the default route's, for a sink no worker checked).
    fn subjects_of(&self, spec: &StreamSpec) -> Vec<String> {
        if !spec.subjects.is_empty() {
            return spec.subjects.clone();
        }
        self.route_subjects
            .get()
            .cloned()
            .unwrap_or_else(|| route_subjects(super::DEFAULT_ROUTE))
    }

    /// Finds or creates the stream `spec`, once among concurrent publishes.
    async fn make_stream(&self, spec: &StreamSpec) -> Result<(), PublishError> {
        let _making = self.making_stream.lock().await;
        if self.stream_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        self.js
            .get_or_create_stream(jetstream::stream::Config {
                name: spec.name.clone(),
                subjects: self.subjects_of(spec),
                duplicate_window: spec.duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                PublishError::transient(
                    "stream",
                    format!("cannot make stream {:?}: {e}", spec.name),
                )
            })?;
        self.stream_ready.store(true, Ordering::Release);
        Ok(())
    }

    async fn publish_one(&self, message: &Message) -> Result<(), PublishError> {
        // Also here: a wrapper (Relay::wrap_sink) may not forward `check`.
        refuse_control_headers(message)?;
        self.ensure_stream().await?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, message_id(message));
        for (name, value) in &message.headers {
            match relay_header(name) {
                Some(name) => headers.append(name, value.as_str()),
                None => headers.append(name.as_str(), value.as_str()),
            }
        }
        let ack = self
            .js
            .publish_with_headers(
                message.destination.clone(),
                headers,
                message.payload.clone().into(),
            )
            .await
            .map_err(classify)?;
        match ack.await {
            // A duplicate within the window: the stream has it already.
            Ok(ack) => {
                if ack.duplicate {
                    self.note_duplicate(&ack.stream);
                }
                Ok(())
            }
            Err(e) => {
                match &self.stream {
                    Some(spec) if e.kind() == PublishErrorKind::StreamNotFound => {
                        // Deleted under us: make it again on the next try.
                        // Or it was there before the relay, listening on
                        // other subjects: then retries go on failing
                        // until an operator changes it, so say so.
                        self.stream_ready.store(false, Ordering::Release);
                        Err(PublishError::transient(
                            "no_stream",
                            format!(
                                "{e}: subject {:?}; if stream {:?} exists, its subjects do not \
                                 take it (it was made before, not from stream_subjects=)",
                                message.destination, spec.name
                            ),
                        ))
                    }
                    _ => Err(classify(e)),
                }
            }
        }
    }
}

impl NatsSink {
    /// How many events JetStream acknowledged as repeats, without storing
    /// them again, since this sink was made (see the warning it logs).
    pub fn repeats_acknowledged(&self) -> u64 {
        self.repeats_total.load(Ordering::Relaxed)
    }

    /// Counts an event JetStream acknowledged without storing it (a repeat
    /// of a `Nats-Msg-Id` within its duplicate window) and warns, at most
    /// every 30 s, with the count. A relay's republish after a crash is
    /// such a repeat, and harmless; an operator's `events rewind` within
    /// the window is too, and then the events are not delivered again,
    /// which the operator would not see otherwise (the relay counts them
    /// published: JetStream acknowledged them).
    fn note_duplicate(&self, stream: &str) {
        self.repeats_total.fetch_add(1, Ordering::Relaxed);
        let mut repeats = self.repeats.lock().unwrap_or_else(|e| e.into_inner());
        repeats.0 += 1;
        let now = std::time::Instant::now();
        if repeats
            .1
            .is_some_and(|at| now.duration_since(at) < REPEATS_WARNING_EVERY)
        {
            return;
        }
        tracing::warn!(
            stream,
            repeats = repeats.0,
            "JetStream acknowledged events as repeats of messages it stored within its \
             duplicate window (same Nats-Msg-Id) and did not store them again: after a \
             relay's restart that is expected; after `events rewind`, those events were not \
             delivered again (wait the window out, duplicate_window_s, or replay to a new \
             subscription with start=)"
        );
        *repeats = (0, Some(now));
    }
}

/// The message's `Nats-Msg-Id`: the event id and the subject,
/// `<event id>:<subject>`. JetStream drops a second message with the same
/// id anywhere in the stream, so the event id alone would make a second
/// subscription publishing the event to another subject of the same
/// stream look like a repeat of the first's: acknowledged, never stored.
/// A relay's own republish goes to the same subject, so it is still
/// dropped.
fn message_id(message: &Message) -> String {
    let mut id = String::with_capacity(message.event_id.len() + 1 + message.destination.len());
    id.push_str(&message.event_id);
    id.push(':');
    id.push_str(&message.destination);
    id
}

/// Refuses for good (its aggregate parks) an event carrying a header
/// JetStream would act on: `Nats-Rollup` deletes messages already stored,
/// `Nats-TTL` expires this one, `Nats-Expected-*` make the server refuse
/// it. Every `Nats-` name is JetStream's, so none is passed on.
fn refuse_control_headers(message: &Message) -> Result<(), PublishError> {
    match message.headers.iter().find(|(name, _)| {
        name.as_bytes()
            .get(..5)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"nats-"))
    }) {
        Some((name, _)) => Err(PublishError::permanent(
            "control_header",
            format!("header {name:?}: JetStream reads Nats-* headers as instructions; rename it"),
        )),
        None => Ok(()),
    }
}

/// One of the relay's own header names (`RESERVED_HEADERS`) as a static
/// name: a name given as text is checked and copied at every publish.
fn relay_header(name: &str) -> Option<async_nats::HeaderName> {
    crate::events::RESERVED_HEADERS
        .iter()
        .find(|own| **own == name)
        .map(|own| async_nats::HeaderName::from_static(own))
}

/// Whether NATS subject pattern `pattern` (`*` one token, a last `>` one
/// or more) takes `subject`.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    let mut pattern = pattern.split('.').peekable();
    while let Some(p) = pattern.next() {
        if p == ">" && pattern.peek().is_none() {
            return subject.next().is_some();
        }
        match subject.next() {
            Some(s) if p == "*" || p == s => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

/// The subjects a stream given none listens on for `route`: its fixed
/// part up to the first field, and `>` (`outbox.event.>`); a route without
/// a field is its one subject. A route whose first field is not preceded
/// by a dot gives the route itself, which takes no event: the check
/// refuses it and asks for `stream_subjects`.
fn route_subjects(route: &str) -> Vec<String> {
    match route.find('{') {
        Some(at) if route[..at].ends_with('.') => vec![format!("{}>", &route[..at])],
        _ => vec![route.to_owned()],
    }
}

/// Whether some pattern of `subjects` takes every subject `route` can
/// make. A field may fill one token or several (an event type
/// `order.placed`), so only a `>` at or before the token where the route's
/// first field begins takes them all; a route without a field is one
/// subject.
fn covers_route(subjects: &[String], route: &Route) -> bool {
    let tokens: Vec<&str> = route.template().split('.').collect();
    let Some(field_at) = tokens.iter().position(|t| t.contains('{')) else {
        return subjects
            .iter()
            .any(|p| subject_matches(p, route.template()));
    };
    subjects.iter().any(|pattern| {
        let pattern: Vec<&str> = pattern.split('.').collect();
        let Some((last, before)) = pattern.split_last() else {
            return false;
        };
        *last == ">"
            && before.len() <= field_at
            && before.iter().zip(&tokens).all(|(p, t)| *p == "*" || p == t)
    })
}

/// Checks a stream (`stream=`) against the route's subjects. Refused when
/// it cannot take even an event whose aggregate type and type are one
/// token each: its events would find no stream, and the relay would retry
/// them for ever as a broker outage. A warning when it takes that one but
/// not every subject the route can make (a pattern with `*` where a field
/// is, or a subject of one aggregate type): events it does not take are
/// retried the same way, until a stream listens on their subject.
fn refuse_uncovered_route(stream: &str, subjects: &[String], route: &Route) -> Result<(), String> {
    if covers_route(subjects, route) {
        return Ok(());
    }
    let sample = route.destination("order", "placed");
    let template = route.template();
    if subjects.iter().any(|p| subject_matches(p, &sample)) {
        tracing::warn!(
            stream,
            ?subjects,
            route = template,
            "the stream takes only some of the route's subjects (a field may fill several \
             tokens: use > where the first one begins); events whose subject it does not take \
             are retried until a stream does"
        );
        return Ok(());
    }
    Err(format!(
        "stream {stream:?} would listen on {subjects:?}, which do not take the route \
         {template:?} (an event \"placed\" of aggregate type \"order\" goes to {sample:?}): \
         set stream_subjects= to cover the route, or the route to a subject of the stream"
    ))
}

/// How long the look before the relay runs waits for the server to be
/// connected, and then for its answer.
const PREFLIGHT_WAIT: Duration = Duration::from_secs(5);

/// A subject pattern that overlaps every subject `route` can make: its
/// fixed tokens before the first field, then `>` (`outbox.event.>`); the
/// route itself when it has no field. JetStream's stream lookup by subject
/// finds the streams whose subjects overlap it.
fn lookup_subject(route: &str) -> String {
    let Some(at) = route.find('{') else {
        return route.to_owned();
    };
    match route[..at].rfind('.') {
        Some(dot) => format!("{}>", &route[..=dot]),
        None => ">".to_owned(),
    }
}

impl NatsSink {
    /// [`Sink::preflight`]: the server connected within
    /// [`PREFLIGHT_WAIT`], with JetStream, and, for a sink that makes no
    /// stream, some stream listening on the route's subjects.
    async fn look_before_start(&self, route: &Route) -> Result<(), Preflight> {
        let connected = async {
            while self.client.connection_state() != async_nats::connection::State::Connected {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if tokio::time::timeout(PREFLIGHT_WAIT, connected)
            .await
            .is_err()
        {
            return Err(Preflight::Unreachable(format!(
                "the NATS server is not connected after {PREFLIGHT_WAIT:?} (the client is {})",
                self.client.connection_state()
            )));
        }
        let subject = lookup_subject(route.template());
        let found = tokio::time::timeout(PREFLIGHT_WAIT, self.js.stream_by_subject(&subject)).await;
        let template = route.template();
        match found {
            Ok(Ok(_)) => Ok(()),
            // Made at the first publish.
            Ok(Err(e))
                if e.kind() == jetstream::context::GetStreamByNameErrorKind::NotFound
                    && self.stream.is_some() =>
            {
                Ok(())
            }
            Ok(Err(e)) if e.kind() == jetstream::context::GetStreamByNameErrorKind::NotFound => {
                Err(Preflight::Missing(format!(
                    "no JetStream stream on the NATS server listens on {subject:?} (the route \
                     is {template:?}), so every publish would fail: make one that does, or \
                     give the relay stream=NAME to make it"
                )))
            }
            Ok(Err(e)) if format!("{e:?}").contains("NoResponders") => {
                Err(Preflight::Missing(format!(
                    "the NATS server did not answer JetStream's API ({e}): JetStream is not \
                     enabled on it (start nats-server with -js, or enable it for this account)"
                )))
            }
            Ok(Err(e)) => Err(Preflight::Unreachable(format!(
                "could not ask the NATS server for a stream on {subject:?}: {e}"
            ))),
            Err(_) => Err(Preflight::Unreachable(format!(
                "the NATS server did not say within {PREFLIGHT_WAIT:?} which stream listens on \
                 {subject:?}"
            ))),
        }
    }
}

/// Transient unless the message itself is at fault.
fn classify(e: jetstream::context::PublishError) -> PublishError {
    use std::error::Error as _;
    let api_code = e
        .source()
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(|j| j.error_code());
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded => PublishError::permanent("too_large", e),
        _ if api_code == Some(jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => {
            PublishError::permanent("too_large", e)
        }
        PublishErrorKind::TimedOut => PublishError::transient("timeout", e),
        PublishErrorKind::BrokenPipe => PublishError::transient("connection", e),
        PublishErrorKind::StreamNotFound => PublishError::transient("no_stream", e),
        PublishErrorKind::MaxAckPending => PublishError::transient("backpressure", e),
        _ if api_code.is_some() => PublishError::transient("rejected", e),
        // A subject the client refuses (spaces, empty tokens): no retry
        // changes it.
        PublishErrorKind::Other if e.to_string().contains("subject") => {
            PublishError::permanent("bad_subject", e)
        }
        _ => PublishError::transient("other", e),
    }
}

impl Sink for NatsSink {
    fn kind(&self) -> &'static str {
        "nats"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a> {
        Box::pin(self.publish_one(message))
    }

    fn check(&self, message: &Message) -> Result<(), PublishError> {
        refuse_control_headers(message)
    }

    fn unreachable(&self) -> Option<String> {
        // A publish made meanwhile waits in the client's buffer, and goes
        // out if it reconnects in time (a server restarting).
        let state = self.client.connection_state();
        (state != async_nats::connection::State::Connected)
            .then(|| format!("not connected to the NATS server (the client is {state})"))
    }

    fn preflight<'a>(&'a self, route: &'a Route) -> PreflightFuture<'a> {
        Box::pin(self.look_before_start(route))
    }

    fn check_route(&self, route: &Route) -> Result<(), String> {
        let Some(spec) = &self.stream else {
            return Ok(());
        };
        let subjects = if spec.subjects.is_empty() {
            // The first relay's route decides, should a sink be shared.
            self.route_subjects
                .get_or_init(|| route_subjects(route.template()))
        } else {
            &spec.subjects
        };
        refuse_uncovered_route(&spec.name, subjects, route)
    }
}

/// Builds the sink for a `nats://` URL: `stream=NAME` makes the stream when
/// missing, over `stream_subjects` (comma-separated; default: the relay's
/// route's fixed prefix and `>`, so `outbox.event.>`) with `duplicate_window_s`
/// (default 600: longer than a partition's lease plus the longest
/// backoff, with room to spare). A password or token comes from
/// `OUTBOX_RELAY_<NAME>_SECRET`.
pub(crate) async fn from_url(
    url: &::url::Url,
    params: &mut super::url::Params,
    name: &str,
) -> Result<Arc<dyn Sink>, String> {
    let stream = match params.take("stream") {
        None => None,
        Some(name) => {
            let subjects = params
                .take("stream_subjects")
                .map(|s| s.split(',').map(str::to_owned).collect())
                // The relay's route's, once the worker checks it.
                .unwrap_or_default();
            let window = params.parse_range("duplicate_window_s", 600, 1, 86_400 * 7)?;
            Some(StreamSpec {
                name,
                subjects,
                duplicate_window: Duration::from_secs(window),
            })
        }
    };
    let mut server = url.clone();
    server.set_query(None);
    if server.password().is_some() {
        return Err(format!(
            "relay {name:?}: put the NATS password or token in {}, not in the URL",
            super::url::secret_var(name)
        ));
    }
    let mut options = async_nats::ConnectOptions::new();
    if let Some(secret) = params.secret(name) {
        options = if server.username().is_empty() {
            options.token(secret)
        } else {
            options.user_and_password(server.username().to_owned(), secret)
        };
        let _ = server.set_username("");
    }
    params.refuse_rest(name)?;
    Ok(Arc::new(
        NatsSink::connect_with(options, server.as_str(), stream).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(headers: &[(&str, &str)]) -> Message {
        Message::for_test("outbox.event.order", headers)
    }

    /// A sink whose server is not there: nothing listens on port 1, and
    /// the client goes on trying in the background.
    async fn offline(stream: Option<StreamSpec>) -> NatsSink {
        NatsSink::connect("nats://127.0.0.1:1", stream)
            .await
            .unwrap()
    }

    #[test]
    fn jetstreams_control_headers_are_refused_for_good() {
        for name in ["Nats-Rollup", "nats-ttl", "NATS-Expected-Stream"] {
            let refused =
                refuse_control_headers(&message(&[("tenant", "a"), (name, "x")])).expect_err(name);
            assert!(!refused.is_transient(), "{name}: {refused}");
            assert_eq!(refused.kind(), "control_header");
        }
        assert!(refuse_control_headers(&message(&[("tenant", "a"), ("natsy", "b")])).is_ok());
        // Not cut inside a character.
        assert!(refuse_control_headers(&message(&[("natéé", "b")])).is_ok());
    }

    #[test]
    fn subject_patterns_match_as_nats_matches_them() {
        for (pattern, subject, takes) in [
            ("outbox.event.>", "outbox.event.order", true),
            ("outbox.event.>", "outbox.event.order.placed", true),
            ("outbox.event.>", "outbox.event", false),
            ("outbox.*.order", "outbox.event.order", true),
            ("outbox.*", "outbox.event.order", false),
            ("outbox.event.order", "outbox.event.order", true),
            ("outbox.event.order", "outbox.event.orders", false),
            (">", "a", true),
            ("a.>.b", "a.x.b", false),
        ] {
            assert_eq!(
                subject_matches(pattern, subject),
                takes,
                "{pattern} {subject}"
            );
        }
    }

    #[test]
    fn a_stream_that_cannot_take_the_route_is_refused() {
        let subjects = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let route = |r: &str| Route::parse(r).unwrap();
        let check = |patterns: &[&str], r: &str| {
            refuse_uncovered_route("EVENTS", &subjects(patterns), &route(r))
        };
        let refused = check(&["orders.>"], "outbox.event.{aggregate_type}").unwrap_err();
        assert!(refused.contains("\"outbox.event.order\""), "{refused}");
        assert!(refused.contains("stream_subjects="), "{refused}");
        // Taken whole, or (with a warning) in part.
        for (patterns, r) in [
            (
                &["orders.>", "outbox.event.>"][..],
                "outbox.event.{aggregate_type}",
            ),
            (&["outbox.>"][..], "outbox.{aggregate_type}.{event_type}"),
            (&["fixed"][..], "fixed"),
            (&["outbox.event.order"][..], "outbox.event.{aggregate_type}"),
            (&["outbox.*.*"][..], "outbox.{aggregate_type}.{event_type}"),
        ] {
            assert!(check(patterns, r).is_ok(), "{r}");
        }
        // Whole: a > where the first field begins, or before.
        for (pattern, r, whole) in [
            ("outbox.event.>", "outbox.event.{aggregate_type}", true),
            ("outbox.>", "outbox.event.{aggregate_type}", true),
            ("*.event.>", "outbox.event.{aggregate_type}", true),
            (">", "outbox.event.{aggregate_type}", true),
            ("outbox.event.*", "outbox.event.{aggregate_type}", false),
            ("outbox.event.order", "outbox.event.{aggregate_type}", false),
            ("outbox.event.x.>", "outbox.event.{aggregate_type}", false),
            ("other.event.>", "outbox.event.{aggregate_type}", false),
            ("x.>", "x.{aggregate_type}.events", true),
            ("x.*.events", "x.{aggregate_type}.events", false),
            ("x.>", "x.pre{event_type}", true),
            ("fixed", "fixed", true),
            ("fixed.>", "fixed", false),
        ] {
            assert_eq!(
                covers_route(&subjects(&[pattern]), &route(r)),
                whole,
                "{pattern} {r}"
            );
        }
    }

    #[tokio::test]
    async fn a_stream_given_no_subjects_takes_those_of_the_relays_route() {
        let spec = StreamSpec {
            name: "EVENTS".to_owned(),
            subjects: Vec::new(),
            duplicate_window: Duration::from_secs(600),
        };
        let sink = offline(Some(spec.clone())).await;
        assert_eq!(
            sink.subjects_of(&spec),
            ["outbox.event.>"],
            "before a check"
        );
        let route = Route::parse("orders.{aggregate_type}.{event_type}").unwrap();
        sink.check_route(&route).unwrap();
        assert_eq!(sink.subjects_of(&spec), ["orders.>"]);
        // A route whose subjects have no fixed part to listen under.
        let sink = offline(Some(spec)).await;
        let refused = sink
            .check_route(&Route::parse("{aggregate_type}.events").unwrap())
            .unwrap_err();
        assert!(refused.contains("stream_subjects="), "{refused}");
    }

    #[tokio::test]
    async fn a_client_without_a_server_says_it_is_not_connected() {
        let sink = offline(None).await;
        let why = sink.unreachable().expect("not connected");
        assert!(why.contains("not connected to the NATS server"), "{why}");
    }

    #[test]
    fn the_message_id_is_the_event_id_and_the_subject() {
        assert_eq!(
            message_id(&message(&[])),
            "0190a0b0-0000-7000-8000-000000000001:outbox.event.order"
        );
    }
}
