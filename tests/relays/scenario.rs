//! The one run every sink goes through (issues 13 and 22): 20,000 events
//! over 200 aggregates from 8 concurrent writers, a tenth of the
//! transactions rolled back, one transaction held open across many batch
//! cuts before it commits; two relay worker processes sharing the
//! subscription's four partitions, one killed with SIGKILL three times and
//! restarted; the broker killed and restarted on the same port and data;
//! every engine session of both relay workers terminated (as
//! `pg_terminate_backend` or a failover does); one poison event. Then what
//! reached the broker is checked against what committed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::events::{Event, emit_all};
use outbox_tests::TestDb;
use outbox_tests::process::WorkerProcess;
use serde_json::json;

use crate::WORKER;

/// Events in the run.
pub(crate) const EVENTS: usize = 20_000;
const WRITERS: usize = 8;
const KEYS: u64 = 200;
/// Events each relay worker publishes at once.
pub(crate) const CONCURRENCY: usize = 32;
/// The subscription's partitions, shared by the two relay workers.
const PARTITIONS: usize = 4;
/// Positions one batch spans at most.
const BATCH: usize = 200;
/// The poison event's aggregate.
pub(crate) const POISON_TYPE: &str = "poison";
const POISON_ID: &str = "p1";
/// Events emitted behind the poison event on its aggregate: blocked.
const BEHIND_POISON: usize = 3;
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// One message as the broker holds it.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    /// The `event-id` header (or the broker's own dedup field).
    pub event_id: String,
    /// The aggregate id (the message key).
    pub aggregate_id: String,
    /// The `sequence` header.
    pub sequence: i64,
}

impl Published {
    /// From the relay's headers, read by `get` (empty when missing).
    pub(crate) fn from_headers(get: impl Fn(&str) -> String) -> Self {
        Self {
            event_id: get("event-id"),
            aggregate_id: get("aggregate-id"),
            sequence: get("sequence").parse().expect("a sequence header"),
        }
    }
}

/// A broker under test.
pub(crate) trait Broker {
    /// The `--relay` value's URL for the relay worker processes.
    fn relay_url(&self) -> String;
    /// Environment for the relay worker processes (its secret).
    fn env(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// Makes the poison event refused for good; returns the payload it
    /// must carry.
    async fn prepare_poison(&mut self) -> serde_json::Value;
    /// Kills the broker (SIGKILL, or its server dropped) and starts it
    /// again on the same port and data.
    async fn kill_and_restart(&mut self);
    /// Every message of aggregate type `order`, in the broker's order.
    async fn read_all(&mut self) -> Vec<Published>;
    /// The most duplicates the broker may hold at the end. `unacknowledged`
    /// bounds what the relays can have published without their cursor
    /// moving past it: one batch per partition at each disruption (a kill,
    /// the sessions terminated, the broker restarted). Only those are
    /// published again, so no sink can duplicate more. The default is
    /// tighter, for brokers that drop a republished event by its id.
    fn duplicates_bound(&self, unacknowledged: usize) -> usize {
        let _ = unacknowledged;
        0
    }
}

/// A tiny deterministic generator (xorshift), so runs are repeatable
/// without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[derive(Default)]
struct Written {
    committed: Vec<(String, String)>,
    rolled_back: BTreeSet<String>,
}

/// Runs the scenario against `broker`.
pub(crate) async fn run<B: Broker>(name: &str, broker: &mut B) {
    let started = Instant::now();
    let db = TestDb::migrated().await;
    let poison_payload = broker.prepare_poison().await;
    // Four partitions shared by the two relay workers; a killed worker's
    // leases run out in two seconds.
    let relay = format!(
        "r={}&partitions={PARTITIONS}&lease_ms=2000&batch={BATCH}",
        broker.relay_url()
    );
    let args = [
        "--relay",
        relay.as_str(),
        "--heartbeat-interval",
        "200ms",
        "--heartbeat-timeout",
        "2s",
        "--maintenance-interval",
        "200ms",
        "--poll-interval",
        "100ms",
        "--shutdown-grace",
        "1s",
    ];
    let env = broker.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let spawn = || WorkerProcess::spawn_with_env(WORKER, &db.url, &args, &env);
    let mut killed = spawn();
    let steady = spawn();

    // A transaction that emits, stays open while many batches are cut past
    // it, and commits near the end: published then, before its aggregate's
    // next event, never skipped. (Its own aggregate: it holds that
    // aggregate's lock until it commits.)
    let mut open = db.pool.begin().await.expect("begin the long transaction");
    let open_id = "00000000-0000-4000-8fff-000000000001".to_owned();
    let after_id = "00000000-0000-4000-8fff-000000000002".to_owned();
    emit_all(
        &mut open,
        [
            Event::new("order", "held-open", "order.updated", json!({"open": true}))
                .id(open_id.clone())
                .header("traceparent", TRACEPARENT),
        ],
    )
    .await
    .expect("emit in the long transaction");

    let written = Arc::new(Mutex::new(Written::default()));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let pool = db.pool.clone();
        let written = Arc::clone(&written);
        let poison_payload = poison_payload.clone();
        writers.push(tokio::spawn(async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (w as u64 + 1));
            let mut emitted = 0usize;
            let mut n = 0u64;
            let quota = EVENTS / WRITERS;
            let mut tx_count = 0;
            while emitted < quota {
                tx_count += 1;
                let mut events = Vec::new();
                let mut ids = Vec::new();
                let in_tx = (1 + rng.next() % 3) as usize;
                for _ in 0..in_tx.min(quota - emitted) {
                    n += 1;
                    let key = (rng.next() % KEYS).to_string();
                    let id = format!("00000000-0000-4000-8{w:03x}-{n:012x}");
                    events.push(
                        Event::new(
                            "order",
                            key.clone(),
                            "order.updated",
                            json!({"w": w, "n": n}),
                        )
                        .id(id.clone())
                        .header("traceparent", TRACEPARENT),
                    );
                    ids.push((id, key));
                    emitted += 1;
                }
                let poison_here = w == 0 && tx_count == 50;
                if poison_here {
                    // The poison event, then events of its aggregate that
                    // must stay behind it.
                    events.push(Event::new(
                        POISON_TYPE,
                        POISON_ID,
                        "poison.made",
                        poison_payload.clone(),
                    ));
                    for i in 0..BEHIND_POISON {
                        events.push(Event::new(
                            POISON_TYPE,
                            POISON_ID,
                            "poison.after",
                            json!({"i": i}),
                        ));
                    }
                }
                let mut tx = pool.begin().await.expect("begin");
                emit_all(&mut tx, events).await.expect("emit");
                if rng.next().is_multiple_of(10) && !poison_here {
                    tx.rollback().await.expect("rollback");
                    let mut written = written.lock().unwrap();
                    written
                        .rolled_back
                        .extend(ids.into_iter().map(|(id, _)| id));
                } else {
                    tx.commit().await.expect("commit");
                    written.lock().unwrap().committed.extend(ids);
                }
            }
        }));
    }

    // The faults, while the writers write and the relays publish.
    let wait_for_completed = async |at: i64, logs: &[&WorkerProcess]| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while published(&db.pool).await < at {
            assert!(
                Instant::now() < deadline,
                "never {at} events published\nrelay logs:\n{}",
                logs.iter()
                    .map(|w| w.log())
                    .collect::<Vec<_>>()
                    .join("\n----\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let mut kills = 0;
    for (at, what) in [
        (1_500, "relay"),
        (3_500, "sessions"),
        (5_000, "broker"),
        (8_000, "relay"),
        (11_000, "relay"),
    ] {
        wait_for_completed(at, &[&killed, &steady]).await;
        if what == "sessions" {
            let terminated: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name LIKE $1 \
                   AND pid <> pg_backend_pid()) t",
            )
            .bind(format!("{} %", outbox::ENGINE_APPLICATION_NAME))
            .fetch_one(&db.pool)
            .await
            .expect("terminate the relay workers' sessions");
            assert!(terminated > 0, "the relay workers have engine sessions");
            eprintln!(
                "{name}: {terminated} engine sessions of the relay workers terminated at {at} published"
            );
        } else if what == "relay" {
            killed.signal("KILL");
            killed.wait(Duration::from_secs(10)).await;
            kills += 1;
            eprintln!("{name}: relay worker killed with SIGKILL at {at} published ({kills} of 3)");
            tokio::time::sleep(Duration::from_millis(300)).await;
            killed = spawn();
        } else {
            eprintln!("{name}: broker killed and restarted at {at} published");
            broker.kill_and_restart().await;
        }
    }
    for w in writers {
        w.await.expect("writer");
    }
    open.commit().await.expect("commit the long transaction");
    emit_all(
        &mut db.pool.acquire().await.expect("a connection"),
        [Event::new(
            "order",
            "held-open",
            "order.updated",
            json!({"open": false}),
        )
        .id(after_id.clone())
        .header("traceparent", TRACEPARENT)],
    )
    .await
    .expect("emit after the long transaction");
    written.lock().unwrap().committed.extend([
        (open_id.clone(), "held-open".to_owned()),
        (after_id.clone(), "held-open".to_owned()),
    ]);
    let (committed, rolled_back) = {
        let w = written.lock().unwrap();
        (w.committed.clone(), w.rolled_back.clone())
    };
    let committed_ids: BTreeSet<&str> = committed.iter().map(|(id, _)| id.as_str()).collect();
    eprintln!(
        "{name}: {} events committed, {} rolled back, {} behind the poison event",
        committed.len(),
        rolled_back.len(),
        BEHIND_POISON
    );

    // Every committed event of the healthy aggregates published; the
    // poison event parked, its aggregate's later events held behind it.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let sub = subscription(&db.pool).await;
        let parked = outbox::relay::parked(&db.pool, Some("r"), 100)
            .await
            .expect("the parked list");
        if sub.behind == 0 && parked.len() == 1 + BEHIND_POISON {
            assert!(
                parked.iter().all(|p| p.aggregatetype == POISON_TYPE),
                "only the poison aggregate is parked: {parked:?}"
            );
            let error = parked[0].error.clone().unwrap_or_default();
            assert!(
                error.contains("refused"),
                "the parked event says why: {error}"
            );
            assert!(parked[1..].iter().all(|p| p.error.is_none()));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {} events behind, {} parked, after 180 s: {:?}\nrelay log:\n{}\n{}",
            sub.behind,
            parked.len(),
            parked
                .iter()
                .filter_map(|p| p.error.as_deref())
                .take(5)
                .collect::<Vec<_>>(),
            killed.log(),
            steady.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let messages = broker.read_all().await;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut per_key: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for m in &messages {
        assert!(
            !rolled_back.contains(&m.event_id),
            "{name}: rolled-back event {} was published",
            m.event_id
        );
        assert!(
            committed_ids.contains(m.event_id.as_str()),
            "{name}: published event {} was never committed",
            m.event_id
        );
        let count = seen.entry(m.event_id.as_str()).or_default();
        *count += 1;
        if *count == 1 {
            per_key
                .entry(m.aggregate_id.as_str())
                .or_default()
                .push(m.sequence);
        }
    }
    let lost: Vec<&&str> = committed_ids
        .iter()
        .filter(|id| !seen.contains_key(**id))
        .collect();
    assert!(
        lost.is_empty(),
        "{name}: {} committed events never reached the broker: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let duplicates = messages.len() - seen.len();
    // Three kills, the sessions terminated once, the broker restarted once:
    // each can leave every partition's batch in flight unacknowledged.
    let disruptions = kills + 2;
    let unacknowledged = disruptions * PARTITIONS * BATCH;
    let bound = broker.duplicates_bound(unacknowledged);
    assert!(
        duplicates <= bound,
        "{name}: {duplicates} duplicates, more than the {bound} the kills allow \
         ({unacknowledged} published in batches never acknowledged)"
    );
    for (key, sequences) in &per_key {
        assert!(
            sequences.windows(2).all(|w| w[0] < w[1]),
            "{name}: aggregate {key} out of order: {sequences:?}"
        );
    }
    assert_eq!(
        per_key.get("held-open").map(Vec::len),
        Some(2),
        "the long transaction's event and the one after it"
    );
    eprintln!(
        "{name}: {} messages, {} distinct, {duplicates} duplicates (bound {bound}, {unacknowledged} unacknowledged); {} aggregates in order; {kills} relay kills, 1 broker restart; {:.1} s",
        messages.len(),
        seen.len(),
        per_key.len(),
        started.elapsed().as_secs_f64()
    );
    drop(steady);
    drop(killed);
}

/// The scenario's subscription (the relay is named `r`).
async fn subscription(pool: &sqlx::PgPool) -> outbox::relay::Subscription {
    outbox::relay::subscriptions(pool)
        .await
        .expect("the subscriptions")
        .into_iter()
        .find(|s| s.name == "r")
        .expect("subscription r")
}

/// Events the relays recorded as published (their cursors moved past).
async fn published(pool: &sqlx::PgPool) -> i64 {
    match outbox::relay::subscriptions(pool).await {
        Ok(subs) => subs
            .iter()
            .find(|s| s.name == "r")
            .map_or(0, |s| s.published),
        Err(_) => 0,
    }
}
