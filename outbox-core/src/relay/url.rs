//! Relays from URLs: the scheme picks the sink, query parameters set the
//! options, so the stock binary's `--relay NAME=URL` needs no other flags.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Relay, Sink};

/// The URL schemes this build can relay to, with the cargo feature each
/// needs and the query parameters its sink reads.
pub fn sink_kinds() -> Vec<(&'static str, &'static str, bool)> {
    vec![
        ("nats", "nats", cfg!(feature = "nats")),
        ("redis", "redis", cfg!(feature = "redis")),
        ("amqp", "rabbitmq", cfg!(feature = "rabbitmq")),
        ("http/https", "webhook", cfg!(feature = "webhook")),
        ("kafka", "kafka", cfg!(feature = "kafka")),
    ]
}

/// Query parameters not yet taken, and the secret given in code (which
/// wins over `OUTBOX_RELAY_<NAME>_SECRET`).
pub(crate) struct Params(BTreeMap<String, String>, Option<String>);

impl Params {
    /// Relay `name`'s secret: the one given in code, else the environment's.
    #[allow(dead_code, reason = "used by the sinks with secrets")]
    pub(crate) fn secret(&self, name: &str) -> Option<String> {
        self.1.clone().or_else(|| secret_from_env(name))
    }

    /// Takes parameter `name`.
    pub(crate) fn take(&mut self, name: &str) -> Option<String> {
        self.0.remove(name)
    }

    /// Refuses the URL when a parameter is left that nothing took: a typo
    /// must not be ignored. Sinks that connect while they are built call
    /// it first, so the mistake is named before any connection is tried.
    pub(crate) fn refuse_rest(&self, name: &str) -> Result<(), String> {
        match self.0.keys().next() {
            Some(k) => Err(format!("relay {name:?}: unknown option {k:?} in its URL")),
            None => Ok(()),
        }
    }

    /// Takes every parameter left.
    #[allow(dead_code, reason = "used by the webhook sink")]
    pub(crate) fn drain(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.0).into_iter().collect()
    }

    /// Takes a number in `min..=max`, or `default`.
    pub(crate) fn parse_range(
        &mut self,
        name: &str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, String> {
        let Some(text) = self.take(name) else {
            return Ok(default);
        };
        match text.parse::<i128>() {
            Ok(v) if (i128::from(min)..=i128::from(max)).contains(&v) => Ok(v as u64),
            Ok(_) => Err(format!(
                "option {name}={text:?} is out of range: use a whole number from {min} to {max}"
            )),
            Err(_) => Err(format!(
                "option {name}={text:?} is not a whole number: use one from {min} to {max}"
            )),
        }
    }
}

/// Builds the relay `name` from `url`. Every error names the relay: a
/// worker run with several says which URL is wrong.
pub(crate) async fn relay_from_url(
    name: &str,
    url: &str,
    secret: Option<String>,
) -> Result<Relay, String> {
    let named = format!("relay {name:?}");
    build(name, url, secret).await.map_err(|e| {
        // A bad name's own message names it already.
        if e.starts_with(&named) || e.starts_with("relay name ") {
            e
        } else {
            format!("{named}: {e}")
        }
    })
}

async fn build(name: &str, url: &str, secret: Option<String>) -> Result<Relay, String> {
    // First: a sink may name the secret's variable after it (a webhook's
    // warning that its requests go unsigned).
    if let Some(problem) = super::name_problem(name) {
        return Err(problem);
    }
    let (url, hosts) = split_host_list(url);
    let parsed = ::url::Url::parse(&url).map_err(|e| format!("relay {name:?}: bad URL: {e}"))?;
    if hosts.is_some() && parsed.scheme() != "kafka" {
        return Err(format!(
            "relay {name:?}: a list of hosts is for kafka:// URLs; {}:// takes one",
            parsed.scheme()
        ));
    }
    let secret = secret.filter(|s| !s.is_empty());
    if secret.is_some() && parsed.scheme() == "kafka" {
        return Err(format!(
            "relay {name:?}: kafka:// takes no secret (this build has no SASL)"
        ));
    }
    let mut params = Params(BTreeMap::new(), secret);
    for (k, v) in parsed.query_pairs() {
        if params.0.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!("relay {name:?}: option {k:?} is given twice"));
        }
    }
    let queue = params.take("queue");
    // Without it, the sink's own default (Sink::default_concurrency).
    let concurrency = match params.0.contains_key("concurrency") {
        true => Some(params.parse_range("concurrency", 1, 1, crate::MAX_CONCURRENCY as u64)?),
        false => None,
    };
    let route_given = params.take("route");
    if route_given.is_some() && matches!(parsed.scheme(), "http" | "https") {
        // It would be taken and never used.
        return Err(
            "option route= names a broker's subject, topic or stream; a webhook posts every \
             event to its URL (route by the URL's path, one relay per endpoint)"
                .to_owned(),
        );
    }
    let route = route_given.unwrap_or_else(|| super::DEFAULT_ROUTE.to_owned());
    let give_up_after = params.take("give_up_after");
    let timeout_ms = params.parse_range(
        "timeout_ms",
        super::DEFAULT_PUBLISH_TIMEOUT.as_millis() as u64,
        10,
        600_000,
    )?;
    let partitions = params.parse_range("partitions", 1, 1, super::MAX_PARTITIONS as u64)?;
    let batch = params.parse_range("batch", super::DEFAULT_BATCH as u64, 1, 1_000_000)?;
    let poll_ms =
        params.parse_range("poll_ms", super::DEFAULT_POLL.as_millis() as u64, 1, 10_000)?;
    let lease_ms = params.parse_range(
        "lease_ms",
        super::DEFAULT_LEASE.as_millis() as u64,
        1000,
        600_000,
    )?;
    let start = match params.take("start") {
        None => super::Start::Beginning,
        Some(text) => text.parse::<super::Start>().map_err(|e| {
            // A URL's query reads `+` as a space: a time's offset
            // `+01:00` arrives as ` 01:00`.
            let hint = if text.contains(' ') {
                " (a + in a URL's query reads as a space: write an offset's + as %2B, or the \
                 time in UTC with Z)"
            } else {
                ""
            };
            format!("option start={e}{hint}")
        })?,
    };
    let sink: Arc<dyn Sink> = match parsed.scheme() {
        #[cfg(feature = "nats")]
        "nats" | "tls" => super::nats::from_url(&parsed, &mut params, name).await,
        #[cfg(feature = "redis")]
        "redis" | "rediss" => super::redis::from_url(&parsed, &mut params, name),
        #[cfg(feature = "rabbitmq")]
        "amqp" | "amqps" => super::rabbitmq::from_url(&parsed, &mut params, name),
        #[cfg(feature = "webhook")]
        "http" | "https" => super::webhook::from_url(&parsed, &mut params, name),
        #[cfg(feature = "kafka")]
        "kafka" => super::kafka::from_url(
            &parsed,
            hosts.as_deref(),
            &mut params,
            Duration::from_millis(timeout_ms),
            name,
        ),
        other => Err(unknown_scheme(name, other)),
    }?;
    params.refuse_rest(name)?;
    let mut relay = Relay::from_arc(name, sink);
    if let Some(concurrency) = concurrency {
        relay = relay.concurrency(concurrency as usize);
    }
    let mut relay = relay
        .route(&route)
        .publish_timeout(Duration::from_millis(timeout_ms))
        .partitions(partitions as i32)
        .batch(batch as i64)
        .poll_interval(Duration::from_millis(poll_ms))
        .lease(Duration::from_millis(lease_ms));
    relay = relay.start_at(start);
    if let Some(q) = queue {
        relay = relay.queue(q);
    }
    if let Some(n) = give_up_after {
        let n: i32 = n
            .parse()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| format!("option give_up_after={n:?} is out of range: use 1 to 1000"))?;
        relay = relay.give_up_after(n);
    }
    let problems = relay.problems();
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(relay)
}

/// `url` with its host list (`kafka://a:9092,b:9092`, which `url::Url`
/// refuses) cut to the first host, and the whole list when there was one.
fn split_host_list(url: &str) -> (String, Option<String>) {
    let Some(at) = url.find("://") else {
        return (url.to_owned(), None);
    };
    let start = at + 3;
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let authority = &url[start..end];
    let (user, hosts) = match authority.rfind('@') {
        Some(i) => (&authority[..=i], &authority[i + 1..]),
        None => ("", authority),
    };
    if !hosts.contains(',') {
        return (url.to_owned(), None);
    }
    let first = hosts.split(',').next().unwrap_or_default();
    (
        format!("{}{user}{first}{}", &url[..start], &url[end..]),
        Some(hosts.to_owned()),
    )
}

/// The error for a scheme this build has no sink for.
fn unknown_scheme(name: &str, scheme: &str) -> String {
    let (built, missing): (Vec<_>, Vec<_>) =
        sink_kinds().into_iter().partition(|(_, _, built)| *built);
    let built: Vec<&str> = built.iter().map(|(scheme, _, _)| *scheme).collect();
    let missing: Vec<String> = missing
        .iter()
        .map(|(scheme, feature, _)| format!("{scheme} (cargo feature {feature:?})"))
        .collect();
    let built = if built.is_empty() {
        "none".to_owned()
    } else {
        built.join(", ")
    };
    let missing = if missing.is_empty() {
        String::new()
    } else {
        format!("; not built: {}", missing.join(", "))
    };
    format!("relay {name:?}: no sink for URL scheme {scheme:?}; this build has: {built}{missing}")
}

/// `url` without its query, with the relay's secret (see
/// [`Params::secret`]) as its password when there is one; a password in the
/// URL itself is refused (`what` names the broker in the message).
#[allow(dead_code, reason = "used by the sinks with passwords")]
pub(crate) fn with_secret_password(
    url: &::url::Url,
    params: &Params,
    name: &str,
    what: &str,
) -> Result<::url::Url, String> {
    let mut server = url.clone();
    server.set_query(None);
    if server.password().is_some() {
        return Err(format!(
            "relay {name:?}: put the {what} password in {}, not in the URL",
            secret_var(name)
        ));
    }
    if let Some(secret) = params.secret(name) {
        server
            .set_password(Some(&secret))
            .map_err(|()| format!("relay {name:?}: this URL cannot carry a password"))?;
    }
    Ok(server)
}

/// The variable holding relay `name`'s secret.
pub(crate) fn secret_var(name: &str) -> String {
    format!(
        "OUTBOX_RELAY_{}_SECRET",
        name.to_ascii_uppercase().replace('-', "_")
    )
}

/// The secret of relay `name`, from `OUTBOX_RELAY_<NAME>_SECRET` (never
/// from a URL or a flag, which show up in process lists and shell history).
#[allow(dead_code, reason = "used by the sinks with secrets")]
fn secret_from_env(name: &str) -> Option<String> {
    std::env::var(secret_var(name))
        .ok()
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_are_cut_to_the_first_host() {
        assert_eq!(
            split_host_list("kafka://a:1,b:2?x=1"),
            ("kafka://a:1?x=1".to_owned(), Some("a:1,b:2".to_owned()))
        );
        assert_eq!(
            split_host_list("kafka://u@a,b/"),
            ("kafka://u@a/".to_owned(), Some("a,b".to_owned()))
        );
        assert_eq!(
            split_host_list("nats://a:1?x=a,b"),
            ("nats://a:1?x=a,b".to_owned(), None)
        );
    }

    #[cfg(feature = "kafka")]
    #[tokio::test]
    async fn concurrency_is_the_sinks_unless_the_url_sets_it() {
        let relay = relay_from_url("k", "kafka://127.0.0.1:9", None)
            .await
            .unwrap();
        assert_eq!(
            relay.concurrency_limit(),
            crate::relay::kafka::KAFKA_CONCURRENCY
        );
        let relay = relay_from_url("k", "kafka://127.0.0.1:9?concurrency=5", None)
            .await
            .unwrap();
        assert_eq!(relay.concurrency_limit(), 5);
        let refused = relay_from_url("k", "kafka://127.0.0.1:9?concurrency=0", None).await;
        assert!(refused.unwrap_err().contains("concurrency"));
    }

    #[cfg(feature = "kafka")]
    #[tokio::test]
    async fn a_secret_for_a_sink_that_takes_none_is_refused_not_dropped() {
        let refused = relay_from_url("k", "kafka://127.0.0.1:9", Some("pw".to_owned())).await;
        let Err(message) = refused else {
            panic!("a secret for kafka:// must be refused")
        };
        assert!(message.contains("kafka:// takes no secret"), "{message}");
        // An empty one is none.
        assert!(
            relay_from_url("k", "kafka://127.0.0.1:9", Some(String::new()))
                .await
                .is_ok()
        );
    }
}
