//! Events and relays in one process: emit in the caller's transaction, the
//! message a relay builds, what transient and permanent failures do, the
//! inbox, the Debezium mirror, and bad input refused with nothing written.
//! The same against real brokers, with kills, is in tests/relays.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::events::{self, Event, emit, emit_all, inbox};
use outbox::relay::{Message, PublishError, PublishFuture, Relay, Sink};
use outbox::{TaskEventKind, Worker};
use outbox_tests::{RunningWorker, TestDb};
use serde_json::json;

/// A sink that records what it was given and fails as told.
#[derive(Clone, Default)]
struct Capture {
    got: Arc<Mutex<Vec<Message>>>,
    /// Transient failures still to give.
    transient: Arc<Mutex<u32>>,
    /// Aggregate ids refused for good.
    refuse: Arc<Mutex<Vec<String>>>,
}

impl Sink for Capture {
    fn kind(&self) -> &'static str {
        "capture"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a> {
        Box::pin(async move {
            {
                let mut left = self.transient.lock().unwrap();
                if *left > 0 {
                    *left -= 1;
                    return Err(PublishError::transient("down", "broker down"));
                }
            }
            if self.refuse.lock().unwrap().contains(&message.aggregate_id) {
                return Err(PublishError::permanent("too_large", "message too large"));
            }
            self.got.lock().unwrap().push(message.clone());
            Ok(())
        })
    }
}

fn relay_worker(db: &TestDb, sink: &Capture, relay: Relay) -> RunningWorker {
    let _ = sink;
    RunningWorker::start(
        Worker::builder(db.pool.clone())
            .poll_interval(Duration::from_millis(50))
            .relay(relay)
            .build()
            .expect("a relay worker"),
    )
}

#[tokio::test]
async fn an_event_commits_with_its_transaction_and_reaches_the_sink_with_its_headers() {
    let db = TestDb::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    emit(
        &mut tx,
        Event::new("order", "7", "order.placed", json!({"total": 1})),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.task_count().await, 0, "a rolled-back event is gone");

    let mut tx = db.pool.begin().await.unwrap();
    let first = emit(
        &mut tx,
        Event::new("order", "7", "order.placed", json!({"total": 990}))
            .header("tenant", "acme")
            .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    )
    .await
    .unwrap();
    let given = "6F1C2A4E-0B5D-4C7A-9E3F-2A1B0C9D8E7F";
    let second = emit(
        &mut tx,
        Event::new("order", "7", "order.paid", json!({})).id(given),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (key, queue): (String, String) =
        sqlx::query_as("SELECT ordering_key, queue FROM outbox_tasks WHERE id = $1")
            .bind(first)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((key.as_str(), queue.as_str()), ("order/7", "events"));

    let sink = Capture::default();
    let mut worker = relay_worker(&db, &sink, Relay::new("capture", sink.clone()));
    worker
        .wait_for(TaskEventKind::Completed, 2, Duration::from_secs(20))
        .await;
    worker.stop().await;

    let got = sink.got.lock().unwrap().clone();
    assert_eq!(got.len(), 2);
    let derived = events::event_id(&mut *db.conn().await, first)
        .await
        .unwrap()
        .unwrap();
    let sql: String = sqlx::query_scalar("SELECT outbox_event_id($1)::text")
        .bind(first)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        got[0].event_id, derived,
        "the relay derives the id SQL derives"
    );
    assert_eq!(derived, sql);
    assert_eq!(
        got[1].event_id,
        given.to_ascii_lowercase(),
        "a given id travels, normalised"
    );
    assert_eq!(
        events::event_id(&mut *db.conn().await, second)
            .await
            .unwrap()
            .unwrap(),
        given.to_ascii_lowercase()
    );
    let m = &got[0];
    assert_eq!(m.destination, "outbox.event.order");
    assert_eq!(
        (m.aggregate_type.as_str(), m.aggregate_id.as_str()),
        ("order", "7")
    );
    assert_eq!(m.payload, br#"{"total":990}"#);
    let header = |m: &Message, name: &str| {
        m.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(header(m, "tenant"), "acme");
    assert!(header(m, "traceparent").starts_with("00-4bf9"));
    assert_eq!(header(m, "event-type"), "order.placed");
    assert_eq!(header(m, "event-id"), m.event_id);
    assert!(
        m.sequence > 0 && got[1].sequence > m.sequence,
        "sequence follows commit order"
    );
    assert_eq!(header(&got[1], "sequence"), got[1].sequence.to_string());
}

#[tokio::test]
async fn transient_failures_spend_no_attempt_and_permanent_ones_kill_only_their_aggregate() {
    let db = TestDb::migrated().await;
    let sink = Capture::default();
    *sink.transient.lock().unwrap() = 8;
    sink.refuse.lock().unwrap().push("bad".to_owned());
    let mut tx = db.pool.begin().await.unwrap();
    let mut batch = Vec::new();
    for agg in ["a", "bad", "b"] {
        for n in 0..3 {
            batch.push(Event::new("order", agg, "order.step", json!({"n": n})));
        }
    }
    emit_all(&mut tx, batch).await.unwrap();
    tx.commit().await.unwrap();

    let mut worker = relay_worker(
        &db,
        &sink,
        Relay::new("capture", sink.clone()).give_up_after(2),
    );
    worker
        .wait_for_all(
            &[(TaskEventKind::Completed, 6), (TaskEventKind::Dead, 1)],
            Duration::from_secs(60),
        )
        .await;
    worker.stop().await;

    // Eight transient failures in a row opened the circuit and backed off;
    // none counted as an attempt.
    let max_retries: i32 = sqlx::query_scalar(
        "SELECT max(retry_count) FROM outbox_all_tasks WHERE payload->>'aggregate_id' <> 'bad'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(max_retries, 0, "transient failures spend no attempt");
    let (dead, waiting, dead_error): (i64, i64, String) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE dead_at IS NOT NULL),
                count(*) FILTER (WHERE dead_at IS NULL AND state <> 'completed'),
                coalesce(max(last_error), '')
         FROM outbox_tasks WHERE payload->>'aggregate_id' = 'bad'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (dead, waiting),
        (1, 2),
        "the first is dead, the rest wait behind it"
    );
    assert!(
        dead_error.contains("capture refused the event (too_large)"),
        "{dead_error}"
    );
    let got = sink.got.lock().unwrap().clone();
    for agg in ["a", "b"] {
        let seqs: Vec<i64> = got
            .iter()
            .filter(|m| m.aggregate_id == agg)
            .map(|m| m.sequence)
            .collect();
        assert_eq!(seqs.len(), 3);
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{agg} in order: {seqs:?}"
        );
    }
    let backlog = outbox::relay::backlog(&db.pool).await.unwrap();
    assert_eq!(backlog.len(), 1);
    assert_eq!(
        (backlog[0].pending, backlog[0].dead, backlog[0].blocked_keys),
        (2, 1, 1)
    );
}

#[tokio::test]
async fn the_inbox_says_first_time_once_per_committed_event() {
    let db = TestDb::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    assert!(inbox::first_time(&mut tx, "billing", "e1").await.unwrap());
    tx.rollback().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    assert!(
        inbox::first_time(&mut tx, "billing", "e1").await.unwrap(),
        "the rolled-back record is gone"
    );
    assert!(!inbox::first_time(&mut tx, "billing", "e1").await.unwrap());
    assert!(
        inbox::first_time(&mut tx, "shipping", "e1").await.unwrap(),
        "per consumer"
    );
    tx.commit().await.unwrap();
    let mut conn = db.conn().await;
    assert!(!inbox::first_time(&mut conn, "billing", "e1").await.unwrap());
    assert!(inbox::first_time(&mut conn, "", "e1").await.is_err());
    assert!(
        inbox::first_time(&mut conn, "billing", &"x".repeat(300))
            .await
            .is_err()
    );
    assert_eq!(
        inbox::prune(&mut conn, Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        inbox::prune(&mut conn, Duration::ZERO, 100).await.unwrap(),
        2
    );
}

#[tokio::test]
async fn the_debezium_mirror_writes_the_router_layout_only_while_on() {
    let db = TestDb::migrated().await;
    assert!(!events::debezium_mirror(&db.pool).await.unwrap());
    emit(
        &mut *db.conn().await,
        Event::new("order", "1", "a", json!({})),
    )
    .await
    .unwrap();
    events::set_debezium_mirror(&db.pool, true).await.unwrap();
    assert!(events::debezium_mirror(&db.pool).await.unwrap());
    let task = emit(
        &mut *db.conn().await,
        Event::new("order", "2", "order.placed", json!({"total": 5})).header("tenant", "acme"),
    )
    .await
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    emit(&mut tx, Event::new("order", "3", "rolled.back", json!({})))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    events::set_debezium_mirror(&db.pool, false).await.unwrap();
    emit(
        &mut *db.conn().await,
        Event::new("order", "4", "b", json!({})),
    )
    .await
    .unwrap();

    let rows: Vec<(String, String, String, String, serde_json::Value, i64)> = sqlx::query_as(
        "SELECT id::text, aggregatetype, aggregateid, type, payload, task_id FROM outbox_events",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let id = events::event_id(&mut *db.conn().await, task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        rows,
        vec![(
            id,
            "order".into(),
            "2".into(),
            "order.placed".into(),
            json!({"total": 5}),
            task.0
        )]
    );
}

#[tokio::test]
async fn bad_events_and_relays_are_refused_and_write_nothing() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    let bad = [
        Event::new("", "1", "t", json!({})),
        Event::new("a/b", "1", "t", json!({})),
        Event::new("order", "1", "t", json!({})).id("not-a-uuid"),
        Event::new("order", "1", "t", json!({})).header("sequence", "9"),
        Event::new("order", "1", "t", json!({"nul": "\u{0}"})),
    ];
    for event in bad {
        let err = emit(&mut conn, event).await.unwrap_err().to_string();
        assert!(err.contains("outbox.event"), "{err}");
    }
    assert_eq!(db.task_count().await, 0);

    let sink = Capture::default();
    let built = Worker::builder(db.pool.clone())
        .relay(Relay::new("one", sink.clone()))
        .relay(Relay::new("two", sink.clone()))
        .relay(
            Relay::new("bad name", sink.clone())
                .queue("q")
                .route("x.{aggregate_id}"),
        )
        .build();
    let Err(outbox::Error::Startup(problems)) = built else {
        panic!("two relays on one queue must be refused")
    };
    let text = problems.to_string();
    assert!(text.contains("two relays serve queue \"events\""), "{text}");
    assert!(text.contains("relay name \"bad name\""), "{text}");
    assert!(text.contains("unknown field {aggregate_id}"), "{text}");
    for (url, needle) in [
        ("ftp://host", "no sink for URL scheme \"ftp\""),
        (
            "nats://127.0.0.1:1?concurrency=0",
            "concurrency=\"0\" is out of range",
        ),
        ("nats://127.0.0.1:1?colour=red", "unknown option \"colour\""),
        ("redis://:pw@127.0.0.1:1", "OUTBOX_RELAY_R_SECRET"),
        (
            "http://127.0.0.1:1/hook?give_up_after=0",
            "give_up_after=\"0\" is out of range",
        ),
        ("nats://127.0.0.1:1?route=x.{nope}", "unknown field {nope}"),
    ] {
        let err = Relay::from_url("r", url).await.unwrap_err();
        assert!(err.contains(needle), "{url}: {err}");
    }
}
