//! Webhook sink (`webhook` feature): an HTTP POST per event.
//!
//! The request follows the Standard Webhooks layout: the body is the
//! event's JSON payload, `webhook-id` is the event id (the receiver's dedup
//! key), `webhook-timestamp` the send time in Unix seconds, and, when the
//! relay has a secret (`OUTBOX_RELAY_<NAME>_SECRET`, raw or `whsec_` and
//! base64), `webhook-signature` is `v1,` and the base64 HMAC-SHA256 of
//! `id.timestamp.body`. The event's headers travel as `outbox-<name>`
//! (and `traceparent` as itself).
//!
//! A 2xx response acknowledges; 408, 429 and 5xx are transient (a
//! `Retry-After` is honoured); any other status is permanent; so is a
//! redirect (not followed: a receiver that moved is a configuration error).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use hmac::{KeyInit, Mac};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::sink::{Message, PublishError, PublishFuture, Sink};

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A webhook sink.
pub struct WebhookSink {
    client: HttpsClient,
    url: hyper::Uri,
    secret: Option<Vec<u8>>,
    timeout: Duration,
}

impl WebhookSink {
    /// Posts to `url`, signing with `secret` when given, each request
    /// bounded by `timeout`.
    pub fn new(url: &str, secret: Option<&str>, timeout: Duration) -> Result<Self, String> {
        let secret = match secret {
            None => None,
            Some(s) => Some(match s.strip_prefix("whsec_") {
                Some(b64) => base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|e| format!("the webhook secret after whsec_ is not base64: {e}"))?,
                None => s.as_bytes().to_vec(),
            }),
        };
        let url: hyper::Uri = url
            .parse()
            .map_err(|e| format!("webhook URL {url:?}: {e}"))?;
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout.min(Duration::from_secs(5))));
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            client,
            url,
            secret,
            timeout,
        })
    }

    async fn publish_one(&self, message: &Message) -> Result<(), PublishError> {
        let timestamp = chrono::Utc::now().timestamp().to_string();
        let mut request = hyper::Request::post(self.url.clone())
            .header("content-type", "application/json")
            .header(
                "user-agent",
                concat!("outbox-relay/", env!("CARGO_PKG_VERSION")),
            )
            .header("webhook-id", &message.event_id)
            .header("webhook-timestamp", &timestamp);
        if let Some(secret) = &self.secret {
            request = request.header(
                "webhook-signature",
                signature(secret, &message.event_id, &timestamp, &message.payload),
            );
        }
        for (name, value) in &message.headers {
            request = if name == "traceparent" || name == "tracestate" {
                request.header(name.as_str(), value.as_str())
            } else {
                request.header(format!("outbox-{name}"), value.as_str())
            };
        }
        let request = request
            .body(Full::new(Bytes::from(message.payload.clone())))
            // Headers were checked at emit; a value HTTP cannot carry is
            // this message's fault.
            .map_err(|e| PublishError::permanent("bad_header", e))?;
        let response = match tokio::time::timeout(self.timeout, self.client.request(request)).await
        {
            Err(_) => {
                return Err(PublishError::transient(
                    "timeout",
                    format!("{} did not answer within {:?}", self.url, self.timeout),
                ));
            }
            Ok(Err(e)) => {
                return Err(PublishError::transient(
                    "connection",
                    crate::error::with_causes(&e),
                ));
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let code = status.as_u16();
        let reason = format!("{} answered {status}", self.url);
        if code == 408 || code == 429 || status.is_server_error() {
            Err(PublishError::Transient {
                kind: if code == 429 {
                    "rate_limited"
                } else {
                    "http_transient"
                },
                reason,
                retry_after,
            })
        } else {
            Err(PublishError::permanent("http_refused", reason))
        }
    }
}

/// The Standard Webhooks signature of one request.
pub fn signature(secret: &[u8], id: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// A `Retry-After` in seconds or as an HTTP date; capped at an hour.
fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    let wait = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
        (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
            .to_std()
            .unwrap_or_default()
    };
    Some(wait.min(Duration::from_secs(3600)))
}

impl Sink for WebhookSink {
    fn kind(&self) -> &'static str {
        "webhook"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a> {
        Box::pin(self.publish_one(message))
    }
}

/// Builds the sink for an `http://` or `https://` URL: the relay's own
/// options are taken out of the query, the rest of the URL is the
/// endpoint. The signing secret comes from `OUTBOX_RELAY_<NAME>_SECRET`.
pub(crate) fn from_url(
    url: &::url::Url,
    params: &mut super::url::Params,
    name: &str,
) -> Result<Arc<dyn Sink>, String> {
    let timeout = params.parse_range("request_timeout_ms", 10_000, 10, 600_000)?;
    let mut endpoint = url.clone();
    // Whatever query the endpoint itself has stays on it.
    let rest: Vec<(String, String)> = params.drain();
    if rest.is_empty() {
        endpoint.set_query(None);
    } else {
        endpoint.query_pairs_mut().clear().extend_pairs(rest);
    }
    if endpoint.password().is_some() {
        return Err(format!(
            "relay {name:?}: a password in the webhook URL shows up in process lists; \
             sign with {} instead",
            super::url::secret_var(name)
        ));
    }
    let secret = params.secret(name);
    if secret.is_none() {
        // Meant, for an endpoint inside the network; or a secret's
        // variable misspelt, which nothing else would show.
        tracing::warn!(
            relay = %name,
            "the webhook relay's requests are not signed: set {} (whsec_...) to sign them",
            super::url::secret_var(name)
        );
    }
    Ok(Arc::new(
        WebhookSink::new(
            endpoint.as_str(),
            secret.as_deref(),
            Duration::from_millis(timeout),
        )
        .map_err(|e| {
            format!(
                "relay {name:?}: {e} (its secret comes from {}, unless the application gave one)",
                super::url::secret_var(name)
            )
        })?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connection_says_so() {
        let sink = WebhookSink::new("http://127.0.0.1:1/hook", None, Duration::from_secs(5))
            .expect("an http client");
        let message = Message::for_test("", &[]);
        let error = sink.publish(&message).await.unwrap_err().to_string();
        // hyper's own text is "client error (Connect)" whatever went wrong.
        assert!(error.contains("refused"), "{error}");
    }

    #[test]
    fn signature_matches_the_standard_webhooks_example() {
        // The example from the Standard Webhooks specification.
        let secret = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        let sig = signature(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            "1614265330",
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[tokio::test]
    async fn https_builds_with_ring_and_an_unreachable_endpoint_is_transient() {
        let sink = WebhookSink::new(
            "https://127.0.0.1:1/hook",
            Some("s"),
            Duration::from_secs(2),
        )
        .expect("an https client");
        let message = Message {
            event_id: "e".into(),
            aggregate_type: "order".into(),
            aggregate_id: "1".into(),
            event_type: "t".into(),
            payload: b"{}".to_vec(),
            headers: Vec::new(),
            sequence: 1,
            created_at: chrono::Utc::now(),
            destination: String::new(),
        };
        let error = sink.publish(&message).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
    }

    #[tokio::test]
    async fn a_secret_that_is_not_base64_names_its_relay_and_variable() {
        let Err(error) = crate::relay::Relay::from_url_with_secret(
            "hooks-1",
            "http://127.0.0.1:1/hook",
            "whsec_!!!notbase64",
        )
        .await
        else {
            panic!("a secret that is not base64 was taken");
        };
        assert!(
            error.starts_with("relay \"hooks-1\": the webhook secret after whsec_ is not base64")
                && error.contains("OUTBOX_RELAY_HOOKS_1_SECRET"),
            "{error}"
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(parse_retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("99999"), Some(Duration::from_secs(3600)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
