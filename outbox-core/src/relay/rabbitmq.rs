//! RabbitMQ sink (`rabbitmq` feature), with `lapin`.
//!
//! Each event is published to the relay's exchange with the routed
//! routing key, `mandatory` (an unroutable message comes back instead of
//! vanishing), persistent (delivery mode 2), `message_id` = event id, and
//! the event's headers in the message's header table, on a channel with
//! publisher confirms: the broker's ack means it has the message (on disk,
//! for a durable queue). A returned message is a permanent failure (no
//! queue is bound for it: publishing again will not change that); a nack
//! is transient (the broker could not take it now).
//!
//! Each channel carries one publish at a time, from a pool of channels on
//! one connection. lapin hands a `basic.return` to the next confirmation
//! it resolves on the channel; with several publishes in flight on one
//! channel, an unroutable message could be reported as published and a
//! routed one as returned (the relay scenario caught it: a poison event
//! "published", an order event refused once).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lapin::Confirmation;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::{Mutex, MutexGuard};

use super::sink::{Message, Preflight, PreflightFuture, PublishError, PublishFuture, Route, Sink};

/// A RabbitMQ sink.
pub struct RabbitSink {
    uri: String,
    exchange: String,
    /// Declare the exchange (durable, this kind) when connecting.
    declare: Option<ExchangeKind>,
    /// Declare this durable queue and bind it to every routing key (`#`).
    bind_queue: Option<String>,
    /// The connection, declared on (exchange, queue) when made.
    connection: Mutex<Option<Connection>>,
    /// Channels with confirms on, each used by one publish at a time.
    channels: Vec<Mutex<Option<Channel>>>,
    /// Which channel the next publish takes.
    next: AtomicUsize,
}

/// Channels per sink: publishes at once (each waits for its confirm).
const CHANNELS: usize = 64;

impl RabbitSink {
    /// A sink on `uri` (`amqp://host:port/vhost`) publishing to `exchange`;
    /// connects on first use.
    pub fn new(uri: &str, exchange: &str) -> Self {
        Self {
            uri: uri.to_owned(),
            exchange: exchange.to_owned(),
            declare: None,
            bind_queue: None,
            connection: Mutex::new(None),
            channels: (0..CHANNELS).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Declares the exchange (durable) as `kind` (`topic`, `direct`,
    /// `fanout` or `headers`) on each connection.
    pub fn declare_exchange(mut self, kind: &str) -> Result<Self, String> {
        self.declare = Some(match kind {
            "topic" => ExchangeKind::Topic,
            "direct" => ExchangeKind::Direct,
            "fanout" => ExchangeKind::Fanout,
            "headers" => ExchangeKind::Headers,
            other => {
                return Err(format!(
                    "exchange type {other:?}: use topic, direct, fanout or headers"
                ));
            }
        });
        Ok(self)
    }

    /// Declares a durable queue bound to the (topic) exchange for every
    /// routing key, on each connection: for demos and benchmarks, where no
    /// consumer has declared its own yet.
    pub fn bind_queue(mut self, queue: &str) -> Self {
        self.bind_queue = Some(queue.to_owned());
        self
    }

    /// A new channel with confirms on, connecting (and declaring) first
    /// when there is no connection or it broke.
    async fn open_channel(&self) -> Result<Channel, PublishError> {
        let mut held = self.connection.lock().await;
        if let Some(conn) = held.as_ref()
            && conn.status().connected()
        {
            return confirming(conn).await;
        }
        *held = None;
        let conn = Connection::connect(&self.uri, ConnectionProperties::default())
            .await
            .map_err(|e| PublishError::transient("connect", e))?;
        let channel = confirming(&conn).await?;
        if let Some(kind) = &self.declare {
            channel
                .exchange_declare(
                    self.exchange.as_str().into(),
                    kind.clone(),
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| PublishError::transient("declare", e))?;
        }
        if let Some(queue) = &self.bind_queue {
            channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| PublishError::transient("declare", e))?;
            channel
                .queue_bind(
                    queue.as_str().into(),
                    self.exchange.as_str().into(),
                    "#".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| PublishError::transient("declare", e))?;
        }
        *held = Some(conn);
        Ok(channel)
    }

    /// [`Sink::preflight`]: the broker takes a connection, and the
    /// exchange exists when the sink does not declare it (a passive
    /// declare, on a connection of its own closed after).
    async fn look_before_start(&self) -> Result<(), Preflight> {
        let wait = std::time::Duration::from_secs(5);
        let unreachable = |e: String| Preflight::Unreachable(format!("RabbitMQ: {e}"));
        let conn = tokio::time::timeout(
            wait,
            Connection::connect(&self.uri, ConnectionProperties::default()),
        )
        .await
        .map_err(|_| unreachable(format!("no connection within {wait:?}")))?
        .map_err(|e| unreachable(format!("cannot connect: {e}")))?;
        // The default exchange ("") always exists and cannot be declared.
        let looked = if self.declare.is_some() || self.exchange.is_empty() {
            Ok(())
        } else {
            self.look_for_exchange(&conn, wait).await
        };
        let _ = conn
            .close(200, "looked before the relay starts".into())
            .await;
        looked
    }

    async fn look_for_exchange(
        &self,
        conn: &Connection,
        wait: std::time::Duration,
    ) -> Result<(), Preflight> {
        let asked = async {
            let channel = conn.create_channel().await?;
            channel
                .exchange_declare(
                    self.exchange.as_str().into(),
                    ExchangeKind::Topic, // not compared: passive
                    ExchangeDeclareOptions {
                        passive: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
        };
        match tokio::time::timeout(wait, asked).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 404) => {
                Err(Preflight::Missing(format!(
                    "RabbitMQ has no exchange {:?}, so every publish would fail: declare it \
                     (rabbitmqadmin declare exchange name={} type=topic durable=true), or give \
                     the relay exchange_type=topic to declare it",
                    self.exchange, self.exchange
                )))
            }
            Ok(Err(e)) => Err(Preflight::Unreachable(format!(
                "RabbitMQ: cannot look for exchange {:?}: {e}",
                self.exchange
            ))),
            Err(_) => Err(Preflight::Unreachable(format!(
                "RabbitMQ: no answer within {wait:?} about exchange {:?}",
                self.exchange
            ))),
        }
    }

    async fn publish_one(&self, message: &Message) -> Result<(), PublishError> {
        // What the message itself makes impossible is refused before a
        // channel is taken (a refusal after it would close the channel).
        let routing_key = short(&message.destination, "bad_routing_key", "routing key")?;
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            // Emit caps names at 255 bytes; a row written another way may
            // not be.
            let name = short(name, "bad_header", "header name")?;
            headers.insert(name, AMQPValue::LongString(value.as_str().into()));
        }
        let slot = &self.channels[self.next.fetch_add(1, Ordering::Relaxed) % CHANNELS];
        // Held until the confirm: one publish per channel at a time.
        let mut held = slot.lock().await;
        let channel = match held.take() {
            Some(c) if c.status().connected() => c,
            _ => self.open_channel().await?,
        };
        let lease = Lease {
            slot: held,
            channel: Some(channel.clone()),
        };
        let broken = |e: lapin::Error| PublishError::transient("connection", e);
        let properties = BasicProperties::default()
            .with_message_id(message.event_id.as_str().into())
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_timestamp(message.created_at.timestamp().max(0) as u64)
            .with_headers(headers);
        // An error drops the lease: the channel is closed and made again by
        // the next publish that takes this slot.
        let confirm = channel
            .basic_publish(
                self.exchange.as_str().into(),
                routing_key,
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.payload,
                properties,
            )
            .await
            .map_err(broken)?;
        let confirmed = confirm.await.map_err(broken)?;
        lease.give_back();
        match confirmed {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(PublishError::permanent(
                "returned",
                format!(
                    "no queue takes routing key {:?} on exchange {:?} ({} {})",
                    message.destination, self.exchange, returned.reply_code, returned.reply_text
                ),
            )),
            Confirmation::Nack(_) => Err(PublishError::transient(
                "nack",
                "the broker could not take the message now",
            )),
            Confirmation::NotRequested => Err(PublishError::transient(
                "no_confirm",
                "the channel has no publisher confirms",
            )),
        }
    }
}

/// A channel out of its slot for one publish. It goes back only when the
/// publish got its confirmation: a publish abandoned half-way (the relay's
/// timeout drops its future) or failed leaves a confirm pending on the
/// channel, which lapin would hand to the slot's next publish (a returned
/// message could then count as published), so such a channel is closed
/// and the slot makes a new one.
struct Lease<'a> {
    slot: MutexGuard<'a, Option<Channel>>,
    channel: Option<Channel>,
}

impl Lease<'_> {
    fn give_back(mut self) {
        *self.slot = self.channel.take();
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(channel) = self.channel.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = channel.close(200, "abandoned publish".into()).await;
            });
        }
    }
}

/// A channel of `conn` with publisher confirms on.
async fn confirming(conn: &Connection) -> Result<Channel, PublishError> {
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| PublishError::transient("connect", e))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| PublishError::transient("connect", e))?;
    Ok(channel)
}

/// `text` as an AMQP short string (a routing key, a header name). AMQP
/// caps those at 255 bytes, and a route over long aggregate or event types
/// can make a longer key: refused for good as `kind` (its aggregate
/// parks), where lapin's own conversion panics.
fn short(text: &str, kind: &'static str, what: &str) -> Result<ShortString, PublishError> {
    ShortString::try_new(text)
        .map_err(|e| PublishError::permanent(kind, format!("{what} of {} bytes: {e}", text.len())))
}

impl Sink for RabbitSink {
    fn kind(&self) -> &'static str {
        "rabbitmq"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a> {
        Box::pin(self.publish_one(message))
    }

    fn preflight<'a>(&'a self, route: &'a Route) -> PreflightFuture<'a> {
        let _ = route; // every routing key goes to the one exchange
        Box::pin(self.look_before_start())
    }
}

/// Builds the sink for an `amqp://` URL: `exchange` (default `outbox`),
/// `exchange_type` (`topic`, `direct`, `fanout` or `headers`: declare it,
/// durable, when connecting; default: it must exist) and `bind_queue` (a
/// durable queue bound for every routing key). The password comes from
/// `OUTBOX_RELAY_<NAME>_SECRET`.
pub(crate) fn from_url(
    url: &::url::Url,
    params: &mut super::url::Params,
    name: &str,
) -> Result<Arc<dyn Sink>, String> {
    let exchange = params
        .take("exchange")
        .unwrap_or_else(|| "outbox".to_owned());
    let exchange_type = params.take("exchange_type");
    let bind_queue = params.take("bind_queue");
    let server = super::url::with_secret_password(url, params, name, "RabbitMQ")?;
    let mut sink = RabbitSink::new(server.as_str(), &exchange);
    if let Some(kind) = exchange_type {
        sink = sink
            .declare_exchange(&kind)
            .map_err(|e| format!("relay {name:?}: {e}"))?;
    }
    if let Some(queue) = bind_queue {
        sink = sink.bind_queue(&queue);
    }
    Ok(Arc::new(sink))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routing_key_over_255_bytes_is_refused_for_good_not_a_panic() {
        let long = format!("outbox.event.{}", "a".repeat(243));
        assert_eq!(long.len(), 256);
        let refused = short(&long, "bad_routing_key", "routing key").expect_err("too long");
        assert!(!refused.is_transient(), "{refused}");
        assert_eq!(refused.kind(), "bad_routing_key");
        let fits = "b".repeat(255);
        assert_eq!(
            short(&fits, "bad_routing_key", "routing key")
                .expect("255 bytes fit")
                .as_str(),
            fits
        );
    }
}
