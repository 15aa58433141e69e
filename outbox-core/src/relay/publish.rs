//! Publishing a batch: each aggregate's events one at a time, in order,
//! different aggregates at once; transient failures waited out behind the
//! circuit breaker, permanent ones parking the aggregate.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;

use super::circuit::{Admit, Circuit};
use super::lease_clock::LeaseClock;
use super::metrics as m;
use super::{Message, PublishError, Route, Sink};
use crate::db::event_log::{LogEvent, Parking};

/// What stops publishing before the broker has taken everything: `abandon`
/// (the shutdown's grace is over) at once; `stop` (no new batch: a
/// shutdown, or the partition handed to another worker) only while the
/// relay's circuit is open (the broker keeps failing), whose closing the
/// shutdown would otherwise wait for the whole grace. The cursor stays
/// where it was: the next holder publishes the batch again (duplicates of
/// what the broker took, with their event ids). A single transient failure
/// does not stop a batch: it is retried, as it would be without the stop.
#[derive(Clone, Copy)]
pub(crate) struct Halt<'a> {
    pub(crate) stop: &'a CancellationToken,
    pub(crate) abandon: &'a CancellationToken,
}

/// One relay, running: what every partition of it shares.
pub(crate) struct Running {
    pub(crate) name: Arc<str>,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) route: Route,
    pub(crate) give_up_after: i32,
    pub(crate) publish_timeout: Duration,
    pub(crate) concurrency: usize,
    pub(crate) circuit: Circuit,
    pub(crate) instruments: m::Instruments,
}

/// An aggregate: its type and id.
pub(crate) type Aggregate = (String, String);

/// Why publishing stopped before the batch was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interrupted {
    /// The worker is shutting down and its grace is over.
    Abandoned,
    /// The lease may have run out: another relay worker may own the
    /// partition now.
    LeaseExpired,
}

/// What became of a batch.
#[derive(Debug, Default)]
pub(crate) struct Done {
    /// Events the broker acknowledged.
    pub(crate) published: i64,
    /// Events held back, to write with the cursor.
    pub(crate) parked: Vec<Parking>,
    /// Aggregates parked by this batch.
    pub(crate) newly_parked: Vec<Aggregate>,
}

/// What became of one event.
enum Sent {
    Published,
    /// Not due yet: held back until then.
    NotYet(chrono::DateTime<Utc>),
    /// Refused for good.
    Refused(String),
}

/// Publishes `events` (in position order): each aggregate in order, up to
/// the relay's concurrency of aggregates at once. Events of aggregates in
/// `parked` join the parked list behind them.
pub(crate) async fn batch(
    relay: &Running,
    events: Vec<LogEvent>,
    parked: &HashSet<Aggregate>,
    lease: &LeaseClock,
    halt: Halt<'_>,
) -> Result<Done, Interrupted> {
    let mut done = Done::default();
    let (mut keys, mut groups) = (Vec::new(), Vec::new());
    for (key, group) in by_aggregate(events) {
        if parked.contains(&key) {
            done.parked.extend(group.into_iter().map(behind));
        } else {
            keys.push(key);
            groups.push(group);
        }
    }
    let results = aggregates(relay, groups, lease, halt).await?;
    for (key, (published, parking)) in keys.into_iter().zip(results) {
        done.published += published;
        if !parking.is_empty() {
            done.newly_parked.push(key);
        }
        done.parked.extend(parking);
    }
    Ok(done)
}

/// `events` (in position order) split by aggregate, each group in order,
/// the groups in the order of their first events. Each event's key is
/// built once, here.
pub(crate) fn by_aggregate(
    events: impl IntoIterator<Item = LogEvent>,
) -> Vec<(Aggregate, Vec<LogEvent>)> {
    let mut groups: Vec<Vec<LogEvent>> = Vec::new();
    let mut index: HashMap<Aggregate, usize> = HashMap::new();
    for event in events {
        let key = (event.aggregatetype.clone(), event.aggregateid.clone());
        let i = *index.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(event);
    }
    let mut keys: Vec<Option<Aggregate>> = vec![None; groups.len()];
    for (key, i) in index {
        keys[i] = Some(key);
    }
    keys.into_iter().flatten().zip(groups).collect()
}

/// Publishes each group of one aggregate's events in order, up to the
/// relay's concurrency of groups at once; returns what became of each
/// group (as [`aggregate`] does), in the groups' order.
pub(crate) async fn aggregates(
    relay: &Running,
    groups: Vec<Vec<LogEvent>>,
    lease: &LeaseClock,
    halt: Halt<'_>,
) -> Result<Vec<(i64, Vec<Parking>)>, Interrupted> {
    let mut results: Vec<Option<(i64, Vec<Parking>)>> = Vec::new();
    results.resize_with(groups.len(), || None);
    let mut running = FuturesUnordered::new();
    let mut groups = groups.into_iter().enumerate();
    loop {
        while running.len() < relay.concurrency.max(1) {
            let Some((i, group)) = groups.next() else {
                break;
            };
            running.push(async move { (i, aggregate(relay, group, lease, halt).await) });
        }
        let Some((i, result)) = running.next().await else {
            break;
        };
        results[i] = Some(result?);
    }
    Ok(results.into_iter().flatten().collect())
}

/// Publishes one aggregate's events in order; returns how many went out
/// and what is held back (the first not sent and everything after it).
pub(crate) async fn aggregate(
    relay: &Running,
    events: Vec<LogEvent>,
    lease: &LeaseClock,
    halt: Halt<'_>,
) -> Result<(i64, Vec<Parking>), Interrupted> {
    let mut published = 0;
    let mut events = events.into_iter();
    while let Some(event) = events.next() {
        let (retry_at, error) = match one(relay, &event, lease, halt).await? {
            Sent::Published => {
                published += 1;
                continue;
            }
            Sent::NotYet(at) => (Some(at), None),
            Sent::Refused(reason) => (None, Some(reason)),
        };
        let mut parking = vec![Parking {
            event,
            retry_at,
            error,
        }];
        parking.extend(events.map(behind));
        return Ok((published, parking));
    }
    Ok((published, Vec::new()))
}

/// An event joining its parked aggregate: tried as soon as it is first.
fn behind(event: LogEvent) -> Parking {
    Parking {
        event,
        retry_at: Some(Utc::now()),
        error: None,
    }
}

/// Publishes one event until the broker takes it, refuses it for good
/// (`give_up_after` times), or publishing must stop.
async fn one(
    relay: &Running,
    event: &LogEvent,
    lease: &LeaseClock,
    halt: Halt<'_>,
) -> Result<Sent, Interrupted> {
    if let Some(at) = event.publish_at
        && at > Utc::now()
    {
        return Ok(Sent::NotYet(at));
    }
    let message = message(&relay.route, event);
    if let Err(refused) = relay.sink.check(&message) {
        let kind = refused.kind();
        m::failed(&relay.name, "permanent", kind);
        let reason = match refused {
            PublishError::Permanent { reason, .. } | PublishError::Transient { reason, .. } => {
                reason
            }
        };
        let reason = format!(
            "{} refused the event before sending it ({kind}): {reason}",
            relay.sink.kind()
        );
        tracing::warn!(relay = %relay.name, event_id = %event.id, position = event.position,
            aggregate_type = %event.aggregatetype, aggregate_id = %event.aggregateid,
            %reason, "parking the aggregate: the sink cannot send its event");
        return Ok(Sent::Refused(reason));
    }
    let mut refusals = 0;
    loop {
        if halt.abandon.is_cancelled() {
            return Err(Interrupted::Abandoned);
        }
        match relay.circuit.admit(Duration::from_millis(500)).await {
            Admit::Go => {}
            Admit::Later(_) if halt.stop.is_cancelled() => return Err(Interrupted::Abandoned),
            Admit::Later(_) => continue,
        }
        if !lease.held() {
            return Err(Interrupted::LeaseExpired);
        }
        let started = std::time::Instant::now();
        let result = tokio::select! {
            r = tokio::time::timeout(relay.publish_timeout, relay.sink.publish(&message)) => match r {
                Ok(result) => result,
                Err(_) => Err(match relay.sink.unreachable() {
                    Some(why) => PublishError::transient(
                        "connection",
                        format!("no acknowledgement within {:?}: {why}", relay.publish_timeout),
                    ),
                    None => PublishError::transient(
                        "timeout",
                        format!("no acknowledgement within {:?}", relay.publish_timeout),
                    ),
                }),
            },
            () = halt.abandon.cancelled() => return Err(Interrupted::Abandoned),
        };
        let took = started.elapsed();
        // Waiting for a broker behind an open circuit ends with a stop too.
        let mut down = false;
        let wait = match result {
            Ok(()) => {
                relay.circuit.success();
                relay.instruments.circuit(false);
                relay.instruments.published(took, event.created_at);
                return Ok(Sent::Published);
            }
            Err(PublishError::Transient {
                kind,
                reason,
                retry_after,
            }) => {
                let streak = relay.circuit.failure(&format!("{kind}: {reason}"));
                relay.instruments.circuit(relay.circuit.is_open());
                m::failed(&relay.name, "transient", kind);
                tracing::debug!(relay = %relay.name, event_id = %event.id, kind, %reason, "publish failed for now");
                down = relay.circuit.is_open();
                if down && halt.stop.is_cancelled() {
                    return Err(Interrupted::Abandoned);
                }
                backoff(streak).max(retry_after.unwrap_or_default())
            }
            Err(PublishError::Permanent { kind, reason }) => {
                // The broker answered: it is up.
                relay.circuit.success();
                m::failed(&relay.name, "permanent", kind);
                refusals += 1;
                let reason = format!("{} refused the event ({kind}): {reason}", relay.sink.kind());
                if refusals >= relay.give_up_after {
                    tracing::warn!(relay = %relay.name, event_id = %event.id, position = event.position,
                        aggregate_type = %event.aggregatetype, aggregate_id = %event.aggregateid,
                        %reason, "parking the aggregate: the broker refuses its event");
                    return Ok(Sent::Refused(reason));
                }
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = halt.abandon.cancelled() => return Err(Interrupted::Abandoned),
            () = halt.stop.cancelled(), if down => return Err(Interrupted::Abandoned),
        }
    }
}

/// The message of an event.
pub(crate) fn message(route: &Route, event: &LogEvent) -> Message {
    let mut headers = vec![
        ("event-id".to_owned(), event.id.clone()),
        ("aggregate-type".to_owned(), event.aggregatetype.clone()),
        ("aggregate-id".to_owned(), event.aggregateid.clone()),
        ("event-type".to_owned(), event.event_type.clone()),
        ("sequence".to_owned(), event.position.to_string()),
        ("created-at".to_owned(), rfc3339_micros(event.created_at)),
    ];
    if let Some(serde_json::Value::Object(own)) = &event.headers {
        for (name, value) in own {
            let value = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            headers.push((name.clone(), value));
        }
    }
    let payload = event
        .payload
        .as_deref()
        .map_or_else(|| b"null".to_vec(), compact_json);
    Message {
        destination: route.destination(&event.aggregatetype, &event.event_type),
        event_id: event.id.clone(),
        aggregate_type: event.aggregatetype.clone(),
        aggregate_id: event.aggregateid.clone(),
        event_type: event.event_type.clone(),
        payload,
        headers,
        sequence: event.position,
        created_at: event.created_at,
    }
}

/// `at` as RFC 3339 in UTC to the microsecond (`2026-11-29T00:36:28.123456Z`),
/// as chrono's `to_rfc3339_opts(Micros, true)` writes it, without the
/// formatting machinery it goes through: the relay writes one per event.
/// Years outside 0-9999 (which PostgreSQL allows) are left to chrono.
fn rfc3339_micros(at: chrono::DateTime<Utc>) -> String {
    use chrono::{Datelike, Timelike};
    let year = at.year();
    let micros = at.nanosecond() / 1_000;
    if !(0..=9999).contains(&year) || micros >= 1_000_000 {
        // A year chrono writes with a sign, or a leap second.
        return at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    }
    let mut out = [0u8; 27];
    let mut put = |from: usize, width: usize, mut value: u32| {
        for i in (from..from + width).rev() {
            out[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, year as u32);
    put(5, 2, at.month());
    put(8, 2, at.day());
    put(11, 2, at.hour());
    put(14, 2, at.minute());
    put(17, 2, at.second());
    put(20, 6, micros);
    for (i, b) in [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
        (26, b'Z'),
    ] {
        out[i] = b;
    }
    out.iter().map(|&b| b as char).collect()
}

/// `json` without the whitespace between its tokens: PostgreSQL writes a
/// jsonb value out with a space after each `,` and `:`. Whitespace inside
/// strings is kept (an escaped quote does not end one); every byte of a
/// multi-byte UTF-8 character is above ASCII, so it is copied as it is.
fn compact_json(json: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in json.as_bytes() {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            in_string = b == b'"';
            out.push(b);
        }
    }
    out
}

/// The wait after the `streak`-th transient failure in a row: 100 ms
/// doubling to 30 s, with jitter so a fleet does not retry in step.
pub(crate) fn backoff(streak: u32) -> Duration {
    let base = Duration::from_millis(100) * 2u32.pow(streak.saturating_sub(1).min(9));
    jittered(base.min(Duration::from_secs(30)))
}

/// `d` scaled by a random factor in [0.5, 1.0).
fn jittered(d: Duration) -> Duration {
    let r = getrandom::u32().unwrap_or(u32::MAX / 2);
    d.mul_f64(0.5 + f64::from(r) / f64::from(u32::MAX) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        for streak in 1..20 {
            let full = (Duration::from_millis(100) * 2u32.pow((streak - 1).min(9)))
                .min(Duration::from_secs(30));
            let b = backoff(streak);
            assert!(b >= full / 2 && b <= full, "{streak}: {b:?} vs {full:?}");
        }
    }

    #[test]
    fn created_at_is_written_as_chrono_writes_it() {
        use chrono::TimeZone;
        let mut seconds: i64 = 0;
        let mut at = vec![
            Utc.timestamp_opt(0, 0).unwrap(),
            Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 59).unwrap(),
            Utc.timestamp_opt(1_795_912_588, 999_999_999).unwrap(),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(10_000, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(-44, 3, 15, 12, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(0, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(999, 6, 30, 8, 5, 3).unwrap(),
            Utc.timestamp_opt(-1, 999_999_999).unwrap(),
            // A leap second, as chrono holds one.
            Utc.timestamp_opt(1_483_228_799, 1_500_000_000).unwrap(),
        ];
        for i in 0..2_000u32 {
            seconds = seconds
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // Anywhere from 0000-01-01 to 9999-12-31.
            let s = (seconds >> 1).rem_euclid(253_402_300_800 + 62_167_219_200) - 62_167_219_200;
            at.push(
                Utc.timestamp_opt(s, i.wrapping_mul(2_654_435_761) % 1_000_000_000)
                    .unwrap(),
            );
        }
        for at in at {
            assert_eq!(
                rfc3339_micros(at),
                at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "{at:?}"
            );
        }
    }

    #[test]
    fn compacting_keeps_every_string_as_it_is() {
        let pg = r#"{"a": [1, 2.50, null], "p": "c:\\", "q": " x, y: z ", "é": "ü \" }"}"#;
        assert_eq!(
            String::from_utf8(compact_json(pg)).unwrap(),
            r#"{"a":[1,2.50,null],"p":"c:\\","q":" x, y: z ","é":"ü \" }"}"#
        );
        assert_eq!(compact_json(r#""just text""#), br#""just text""#);
        assert_eq!(compact_json("42"), b"42");
    }

    #[test]
    fn messages_carry_the_relays_headers_then_the_emitters() {
        let event = LogEvent {
            position: 7,
            id: "0190a0b0-0000-7000-8000-000000000001".to_owned(),
            aggregatetype: "order".to_owned(),
            aggregateid: "42".to_owned(),
            event_type: "order.placed".to_owned(),
            payload: Some(
                r#"{"total": 990, "note": "a \"b\" c", "big": 123456789012345678901234}"#
                    .to_owned(),
            ),
            headers: Some(serde_json::json!({"tenant": "acme"})),
            publish_at: None,
            created_at: Utc::now(),
            aggregate_hash: 1,
        };
        let m = message(&Route::parse("x.{aggregate_type}").unwrap(), &event);
        assert_eq!(m.destination, "x.order");
        assert_eq!(m.sequence, 7);
        let names: Vec<&str> = m.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "event-id",
                "aggregate-type",
                "aggregate-id",
                "event-type",
                "sequence",
                "created-at",
                "tenant"
            ]
        );
        // As PostgreSQL wrote it, less the spaces between tokens: keys in
        // the same order, a number beyond 64 bits not rounded.
        assert_eq!(
            m.payload,
            br#"{"total":990,"note":"a \"b\" c","big":123456789012345678901234}"#
        );
    }
}
