//! Kafka sink (`kafka` feature), with `rdkafka` (librdkafka, built from
//! the crate's bundled source).
//!
//! Each event is produced to its routed topic with the aggregate id as the
//! key and every header of the event (`event-id` first) as a record
//! header, and the delivery report is awaited: the partition's in-sync
//! replicas have the record once it arrives (`acks=all`).
//!
//! The producer is idempotent (`enable.idempotence=true`): librdkafka's own
//! retries (a lost connection, a leader that moved) neither duplicate nor
//! reorder records within a partition. Kafka has no dedup by a field of
//! ours, so a record the relay republishes after a lost delivery report or
//! a worker's crash reaches the topic twice: consumers dedup on the
//! `event-id` header (the inbox does). Keys are hashed with
//! `murmur2_random`, the Java client's partitioner, so an aggregate's events
//! land on the partition Java producers and Debezium put them on, and stay
//! in order there.
//!
//! This build has no TLS, SASL or compression (librdkafka is compiled
//! without OpenSSL, Cyrus SASL, zlib or zstd): it talks plaintext to
//! brokers on a trusted network. [`KafkaSink::from_config`] takes any other
//! librdkafka setting.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};

use super::sink::{Message, PublishError, PublishFuture, Sink};

/// How long librdkafka holds a record for a batch: a few milliseconds buy
/// batches of the relay's concurrent publishes at little latency.
const LINGER: Duration = Duration::from_millis(5);

/// The Kafka relay's default concurrency: each publish waits at least a
/// linger for its acknowledgement, so 256 aggregates in flight cap a relay
/// near 256 / 5 ms = 51k events/s; 1,024 lets the batches fill (measured
/// with `bench --relay kafka`: 37k events/s at 256, 83k at 1,024). A
/// publish in flight is a record queued in librdkafka, not a connection.
pub const KAFKA_CONCURRENCY: usize = 1024;

/// The producer, with librdkafka's logs sent to `tracing`.
type Producer = FutureProducer<LogContext>;

/// A Kafka sink.
pub struct KafkaSink {
    /// Replaced after a fatal error (an idempotent producer whose sequence
    /// numbers the broker no longer accepts is unusable for good).
    producer: RwLock<Arc<Producer>>,
    /// What the producer was made from, to make the next one.
    config: ClientConfig,
    context: LogContext,
}

impl KafkaSink {
    /// A producer for `bootstrap_servers` (`host:port,host:port`) with the
    /// relay's settings (see [`KafkaSink::config`]). Connects in the
    /// background: brokers that are down now are a transient failure later,
    /// not an error now.
    pub fn new(bootstrap_servers: &str, message_timeout: Duration) -> Result<Self, String> {
        Self::from_config(Self::config(bootstrap_servers, message_timeout))
    }

    /// The relay's producer settings, to extend before
    /// [`KafkaSink::from_config`]: idempotence, `acks=all`, the Java
    /// client's key hashing, a linger of 5 ms, and `message_timeout` as the
    /// longest librdkafka tries one record (keep it at or below the relay's
    /// publish timeout, so librdkafka's verdict comes before the relay
    /// gives up on the publish; at least 10 ms).
    pub fn config(bootstrap_servers: &str, message_timeout: Duration) -> ClientConfig {
        let timeout_ms = message_timeout.as_millis().max(10);
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap_servers)
            .set("client.id", "outbox-relay")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", LINGER.as_millis().to_string())
            .set("message.timeout.ms", timeout_ms.to_string());
        config
    }

    /// A sink from any librdkafka producer settings (see
    /// [`KafkaSink::config`] for the relay's); a setting librdkafka does
    /// not know, or a bad value, is an error here.
    pub fn from_config(config: ClientConfig) -> Result<Self, String> {
        let context = LogContext;
        let producer: Producer = config
            .create_with_context(context.clone())
            .map_err(|e| format!("Kafka producer: {e}"))?;
        Ok(Self {
            producer: RwLock::new(Arc::new(producer)),
            config,
            context,
        })
    }

    fn producer(&self) -> Arc<Producer> {
        Arc::clone(&self.producer.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Makes a new producer when `used` has hit a fatal error (once, if
    /// several publishes see the same one).
    fn replace_if_fatal(&self, used: &Arc<Producer>) {
        let Some((code, reason)) = used.client().fatal_error() else {
            return;
        };
        let mut held = self.producer.write().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&held, used) {
            return;
        }
        match self
            .config
            .create_with_context::<_, Producer>(self.context.clone())
        {
            Ok(fresh) => {
                tracing::warn!(%code, %reason, "the Kafka producer hit a fatal error: replaced");
                let old = std::mem::replace(&mut *held, Arc::new(fresh));
                // Dropping a producer purges and flushes for up to half a
                // second: not on a runtime thread.
                drop(tokio::task::spawn_blocking(move || drop(old)));
            }
            Err(e) => {
                tracing::warn!(%code, %reason, error = %e, "the Kafka producer hit a fatal error and cannot be replaced");
            }
        }
    }

    async fn publish_one(&self, message: &Message) -> Result<(), PublishError> {
        let producer = self.producer();
        let mut headers = OwnedHeaders::new_with_capacity(message.headers.len() + 1);
        if !message.headers.iter().any(|(name, _)| name == "event-id") {
            headers = headers.insert(Header {
                key: "event-id",
                value: Some(message.event_id.as_str()),
            });
        }
        for (name, value) in &message.headers {
            headers = headers.insert(Header {
                key: name.as_str(),
                value: Some(value.as_str()),
            });
        }
        let record = FutureRecord::to(&message.destination)
            .key(message.aggregate_id.as_bytes())
            .payload(&message.payload[..])
            .headers(headers);
        // Queue full is answered now, not waited out: the relay's backoff
        // and circuit are the waiting.
        let result = match producer.send_result(record) {
            Ok(delivery) => match delivery.await {
                Ok(Ok(_delivered)) => return Ok(()),
                Ok(Err((e, _message))) => classify(&e),
                Err(_canceled) => PublishError::transient(
                    "connection",
                    "the Kafka producer was closed before the delivery report",
                ),
            },
            Err((e, _record)) => classify(&e),
        };
        self.replace_if_fatal(&producer);
        Err(result)
    }
}

/// Permanent when no retry makes the broker take this record (too large,
/// a topic that cannot exist or that this client may not write), transient
/// otherwise (brokers down, timeouts, a leader moving, a topic not there
/// yet, a full queue).
fn classify(e: &KafkaError) -> PublishError {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        // MessageSizeTooLarge is both the producer's own check against
        // `message.max.bytes` and the broker's.
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge) => {
            PublishError::permanent("too_large", e)
        }
        Some(C::InvalidTopic) => PublishError::permanent("bad_topic", e),
        Some(C::TopicAuthorizationFailed) => PublishError::permanent("not_authorized", e),
        // The broker's validation of the record (a compacted topic's
        // rules, a message format without headers).
        Some(C::InvalidRecord | C::UnsupportedForMessageFormat) => {
            PublishError::permanent("rejected", e)
        }
        Some(C::QueueFull) => PublishError::transient("queue_full", e),
        Some(C::MessageTimedOut | C::RequestTimedOut | C::OperationTimedOut | C::TimedOutQueue) => {
            PublishError::transient("timeout", e)
        }
        Some(
            C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::Resolve
            | C::NetworkException
            | C::BrokerNotAvailable,
        ) => PublishError::transient("connection", e),
        // Not created yet, or not yet in this client's metadata.
        Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition) => {
            PublishError::transient("no_topic", e)
        }
        Some(
            C::NotLeaderForPartition
            | C::LeaderNotAvailable
            | C::NotEnoughReplicas
            | C::NotEnoughReplicasAfterAppend,
        ) => PublishError::transient("unavailable", e),
        Some(C::Fatal) => PublishError::transient("fatal", e),
        _ => PublishError::transient("other", e),
    }
}

impl Sink for KafkaSink {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a> {
        Box::pin(self.publish_one(message))
    }

    fn default_concurrency(&self) -> usize {
        KAFKA_CONCURRENCY
    }
}

/// librdkafka's logs and errors, through `tracing`. A broker that went away
/// is logged by librdkafka as an error on every reconnect; here it is a
/// warning, since the relay retries and its metrics count the failures.
#[derive(Clone)]
struct LogContext;

impl ClientContext for LogContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility, "{line}");
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{line}");
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{line}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::Fatal) => {
                tracing::error!(target: "librdkafka", %error, "{reason}");
            }
            // The same failure as the log line just before it.
            Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::Resolve) => {
                tracing::debug!(target: "librdkafka", %error, "{reason}");
            }
            _ => tracing::warn!(target: "librdkafka", %error, "{reason}"),
        }
    }
}

/// Builds the sink for a `kafka://host:port[,host:port...]` URL (the port
/// defaults to 9092; `hosts` is the URL's whole host list, which
/// `url::Url` cannot hold): `message_max_bytes` caps a record's size
/// (librdkafka's `message.max.bytes`; default 1,000,000, like the broker's),
/// and librdkafka gives up on a record after `timeout` (the relay's publish
/// timeout, less a tenth so librdkafka's verdict comes first).
pub(crate) fn from_url(
    url: &::url::Url,
    hosts: Option<&str>,
    params: &mut super::url::Params,
    timeout: Duration,
    name: &str,
) -> Result<Arc<dyn Sink>, String> {
    let max_bytes = params.parse_range("message_max_bytes", 1_000_000, 1_000, 1_000_000_000)?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "relay {name:?}: this build's Kafka client has no SASL: take the user out of the URL"
        ));
    }
    if !matches!(url.path(), "" | "/") {
        return Err(format!(
            "relay {name:?}: a kafka:// URL has no path (topics come from the route): {:?}",
            url.path()
        ));
    }
    let first = format!(
        "{}:{}",
        url.host_str().unwrap_or_default(),
        url.port().unwrap_or(9092)
    );
    let servers = match hosts {
        None => first,
        Some(list) => list
            .split(',')
            .map(|host| bootstrap_server(host, name))
            .collect::<Result<Vec<_>, _>>()?
            .join(","),
    };
    if servers.starts_with(':') {
        return Err(format!("relay {name:?}: a kafka:// URL needs a host"));
    }
    params.refuse_rest(name)?;
    let mut config = KafkaSink::config(&servers, timeout - timeout / 10);
    config
        .set("client.id", format!("outbox-relay-{name}"))
        .set("message.max.bytes", max_bytes.to_string());
    Ok(Arc::new(
        KafkaSink::from_config(config).map_err(|e| format!("relay {name:?}: {e}"))?,
    ))
}

/// One `host[:port]` of a host list, checked, with the default port.
fn bootstrap_server(host: &str, name: &str) -> Result<String, String> {
    let parsed = ::url::Url::parse(&format!("kafka://{host}"))
        .ok()
        .filter(|u| u.host_str().is_some_and(|h| !h.is_empty()) && u.path().is_empty())
        .ok_or_else(|| {
            format!("relay {name:?}: {host:?} in the kafka:// host list is not host:port")
        })?;
    Ok(format!(
        "{}:{}",
        parsed.host_str().unwrap_or_default(),
        parsed.port().unwrap_or(9092)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_topic_and_authorization_errors_are_permanent_the_rest_transient() {
        let produce = |code| KafkaError::MessageProduction(code);
        for (code, kind) in [
            (RDKafkaErrorCode::MessageSizeTooLarge, "too_large"),
            (RDKafkaErrorCode::MessageBatchTooLarge, "too_large"),
            (RDKafkaErrorCode::InvalidTopic, "bad_topic"),
            (RDKafkaErrorCode::TopicAuthorizationFailed, "not_authorized"),
        ] {
            let e = classify(&produce(code));
            assert!(!e.is_transient(), "{code:?}");
            assert_eq!(e.kind(), kind);
        }
        for (code, kind) in [
            (RDKafkaErrorCode::QueueFull, "queue_full"),
            (RDKafkaErrorCode::MessageTimedOut, "timeout"),
            (RDKafkaErrorCode::AllBrokersDown, "connection"),
            (RDKafkaErrorCode::BrokerTransportFailure, "connection"),
            (RDKafkaErrorCode::NotLeaderForPartition, "unavailable"),
            (RDKafkaErrorCode::UnknownTopicOrPartition, "no_topic"),
            (RDKafkaErrorCode::Fatal, "fatal"),
            (RDKafkaErrorCode::OutOfOrderSequenceNumber, "other"),
        ] {
            let e = classify(&produce(code));
            assert!(e.is_transient(), "{code:?}");
            assert_eq!(e.kind(), kind);
        }
    }

    #[tokio::test]
    async fn urls_take_host_lists_and_refuse_what_this_build_cannot_do() {
        use super::super::Relay;
        // Nothing listens there: the producer connects in the background.
        let relay = Relay::from_url(
            "k",
            "kafka://127.0.0.1:1,127.0.0.1:2?message_max_bytes=5000&timeout_ms=2000",
        )
        .await
        .unwrap();
        assert_eq!(relay.sink.kind(), "kafka");
        assert_eq!(relay.publish_timeout, Duration::from_secs(2));
        for (url, says) in [
            ("kafka://user@127.0.0.1:1", "no SASL"),
            ("kafka://127.0.0.1:1/topic", "no path"),
            ("kafka://127.0.0.1:1,:2", "not host:port"),
            ("kafka://127.0.0.1:1?message_max_bytes=10", "out of range"),
            ("kafka://127.0.0.1:1?acks=1", "unknown option"),
            ("nats://127.0.0.1:1,127.0.0.1:2", "for kafka:// URLs"),
        ] {
            let error = Relay::from_url("k", url).await.unwrap_err();
            assert!(error.contains(says), "{url}: {error}");
        }
    }

    #[test]
    fn host_lists_get_the_default_port_and_refuse_junk() {
        assert_eq!(bootstrap_server("a", "r").unwrap(), "a:9092");
        assert_eq!(bootstrap_server("b:9093", "r").unwrap(), "b:9093");
        assert_eq!(bootstrap_server("[::1]:9094", "r").unwrap(), "[::1]:9094");
        assert!(bootstrap_server("", "r").is_err());
        assert!(bootstrap_server("a:x", "r").is_err());
        assert!(bootstrap_server("a/b", "r").is_err());
    }
}
