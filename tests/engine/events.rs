//! Events and relays in one process: emit appends to the log in the
//! caller's transaction (at every isolation level), concurrent emitters
//! keep each aggregate's commit order, relays publish committed events in
//! that order (never a rolled-back one, never skipping an open
//! transaction's), subscriptions fan out, poison parks its aggregate, a
//! silent relay worker is fenced, and bad input is refused with nothing
//! written. The same against real brokers, with kills, is in tests/relays.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::Worker;
use outbox::events::{Emitted, Event, emit, emit_all, inbox};
use outbox::relay::{Message, Relay};
use outbox_tests::TestDb;
use outbox_tests::proxy::FaultProxy;
use outbox_tests::sinks::Capture;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// A relay worker running in the background.
pub(crate) struct RelayWorker {
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<outbox::Result<()>>,
}

impl RelayWorker {
    pub(crate) fn start(pool: &PgPool, relays: Vec<Relay>) -> Self {
        let mut builder = Worker::builder(pool.clone()).poll_interval(Duration::from_millis(50));
        for relay in relays {
            builder = builder.relay(relay.poll_interval(Duration::from_millis(5)));
        }
        let worker = builder.build().expect("a relay worker");
        let stop = CancellationToken::new();
        let handle = tokio::spawn(worker.run(stop.clone()));
        Self { stop, handle }
    }

    pub(crate) async fn stop(self) {
        self.stop.cancel();
        self.handle.await.expect("worker task").expect("worker run");
    }
}

fn header(m: &Message, name: &str) -> String {
    m.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

async fn log_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_event_log")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Waits (at most a minute) until the events `subscription` holds back
/// satisfy `done` (all subscriptions' for none); returns them.
pub(crate) async fn wait_parked(
    pool: &PgPool,
    subscription: Option<&str>,
    what: &str,
    done: impl Fn(&[outbox::relay::ParkedEvent]) -> bool,
) -> Vec<outbox::relay::ParkedEvent> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let parked = outbox::relay::parked(pool, subscription, 100)
            .await
            .unwrap();
        if done(&parked) {
            return parked;
        }
        assert!(Instant::now() < deadline, "{what}: {parked:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    assert_eq!(log_rows(&db.pool).await, 0, "a rolled-back event is gone");

    let mut tx = db.pool.begin().await.unwrap();
    let first = emit(
        &mut tx,
        Event::new(
            "order",
            "7",
            "order.placed",
            json!({"total": 990, "note": "a, b: \"c\""}),
        )
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
    assert_eq!(
        second.id,
        given.to_ascii_lowercase(),
        "a given id, normalised"
    );
    assert_eq!(
        &first.id[14..15],
        "7",
        "a made id is a UUIDv7: {}",
        first.id
    );
    // Debezium's outbox layout, one row each, nothing else written.
    let rows: Vec<(String, String, String, String, serde_json::Value)> = sqlx::query_as(
        "SELECT id::text, aggregatetype, aggregateid, type, payload FROM outbox_event_log ORDER BY position",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[0],
        (
            first.id.clone(),
            "order".into(),
            "7".into(),
            "order.placed".into(),
            json!({"total": 990, "note": "a, b: \"c\""})
        )
    );
    assert_eq!(db.task_count().await, 0, "events are no tasks");

    let sink = Capture::default();
    let worker = RelayWorker::start(&db.pool, vec![Relay::new("capture", sink.clone())]);
    let got = sink.wait_until("both published", |g| g.len() == 2).await;
    worker.stop().await;
    let m = &got[0];
    assert_eq!(m.event_id, first.id);
    assert_eq!(got[1].event_id, second.id);
    assert_eq!(m.destination, "outbox.event.order");
    assert_eq!(
        (m.aggregate_type.as_str(), m.aggregate_id.as_str()),
        ("order", "7")
    );
    // The JSON as PostgreSQL keeps it, without the spaces between tokens
    // (and only those).
    assert_eq!(m.payload, br#"{"note":"a, b: \"c\"","total":990}"#);
    assert_eq!(header(m, "tenant"), "acme");
    assert!(header(m, "traceparent").starts_with("00-4bf9"));
    assert_eq!(header(m, "event-type"), "order.placed");
    assert_eq!(header(m, "event-id"), m.event_id);
    assert_eq!(m.sequence, first.position);
    assert_eq!(header(&got[1], "sequence"), second.position.to_string());
    let subs = outbox::relay::subscriptions(&db.pool).await.unwrap();
    assert_eq!(subs.len(), 1);
    assert_eq!(
        (subs[0].name.as_str(), subs[0].published, subs[0].behind),
        ("capture", 2, 0)
    );
}

/// How a test transaction's commit order is recorded.
#[derive(Clone, Copy, PartialEq)]
enum CommitOrder {
    /// The transaction bumps its aggregate's counter (a row lock held to
    /// commit) and records it beside its event: the counter's values are
    /// the order in which the aggregate's transactions committed.
    SharedCounter,
    /// The transactions share no row, so nothing in them orders their
    /// commits but the emit's lock; the server's commit timestamps
    /// (`track_commit_timestamp`, on in the harness's cluster) say in what
    /// order they committed. At SERIALIZABLE a shared counter would
    /// order them by itself: a transaction that updates the row after a
    /// concurrent one committed it fails, so only the ones that began
    /// after the previous commit survive, lock or no lock.
    CommitTimestamps,
}

/// Emitters of 20 aggregates from 8 tasks at `isolation`, a tenth rolled
/// back on purpose and serialization failures retried, each transaction
/// recording its event beside what orders its commit (`how`). The relay
/// must publish every committed event, no rolled-back one, each aggregate
/// in the order its transactions committed. With `batch`, the relay's
/// batches span that many positions: a small one keeps them full, so each
/// is published while the next is read.
async fn concurrent_emitters_keep_commit_order(
    isolation: &str,
    how: CommitOrder,
    batch: Option<i64>,
) {
    let db = TestDb::migrated().await;
    if how == CommitOrder::CommitTimestamps {
        let on: String = sqlx::query_scalar("SHOW track_commit_timestamp")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(
            on, "on",
            "this test reads commit timestamps: set track_commit_timestamp = on on the test server"
        );
    }
    sqlx::raw_sql(
        "CREATE TABLE agg_counter (agg text PRIMARY KEY, c bigint NOT NULL);
         INSERT INTO agg_counter SELECT g::text, 0 FROM generate_series(0, 19) g;
         CREATE TABLE commit_order (event_id text PRIMARY KEY, agg text NOT NULL, c bigint,
                                    xid xid8 NOT NULL DEFAULT pg_current_xact_id());",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let sink = Capture::default();
    // The relay runs while they write: batches are cut between their
    // commits, with transactions open across the cuts.
    let relay = Relay::new("capture", sink.clone());
    let relay = match batch {
        Some(positions) => relay.batch(positions),
        None => relay,
    };
    let worker = RelayWorker::start(&db.pool, vec![relay]);
    let rolled_back = Arc::new(Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for w in 0..8u64 {
        let pool = db.pool.clone();
        let isolation = isolation.to_owned();
        let rolled_back = Arc::clone(&rolled_back);
        writers.push(tokio::spawn(async move {
            let mut seed = w * 7919 + 1;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let mut done = 0;
            while done < 60 {
                let agg = (next() % 20).to_string();
                let roll_back = next().is_multiple_of(10);
                let mut tx = pool.begin().await.unwrap();
                let attempt: Result<String, sqlx::Error> = async {
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "SET TRANSACTION ISOLATION LEVEL {isolation}"
                    )))
                    .execute(&mut *tx)
                    .await?;
                    let e = emit(
                        &mut tx,
                        Event::new("account", agg.clone(), "account.moved", json!({"w": w})),
                    )
                    .await
                    .map_err(|e| match e {
                        outbox::Error::Database(e) => e,
                        other => panic!("{other}"),
                    })?;
                    let c: Option<i64> = match how {
                        CommitOrder::SharedCounter => Some(
                            sqlx::query_scalar(
                                "UPDATE agg_counter SET c = c + 1 WHERE agg = $1 RETURNING c",
                            )
                            .bind(&agg)
                            .fetch_one(&mut *tx)
                            .await?,
                        ),
                        CommitOrder::CommitTimestamps => None,
                    };
                    sqlx::query("INSERT INTO commit_order (event_id, agg, c) VALUES ($1, $2, $3)")
                        .bind(&e.id)
                        .bind(&agg)
                        .bind(c)
                        .execute(&mut *tx)
                        .await?;
                    Ok(e.id)
                }
                .await;
                match attempt {
                    Ok(id) if roll_back => {
                        tx.rollback().await.unwrap();
                        rolled_back.lock().unwrap().push(id);
                    }
                    Ok(_) => match tx.commit().await {
                        Ok(()) => done += 1,
                        Err(e) if outbox::is_transient(&e) => {}
                        Err(e) => panic!("commit: {e}"),
                    },
                    // Serialization failures at REPEATABLE READ and above.
                    Err(e) if outbox::is_transient(&e) => {
                        let _ = tx.rollback().await;
                    }
                    Err(e) => panic!("emit: {e}"),
                }
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    // Each committed event with the rank of its transaction's commit
    // among all of them (ties share a rank and count as out of order).
    let order: Vec<(String, String, i64)> = sqlx::query_as(match how {
        CommitOrder::SharedCounter => "SELECT event_id, agg, c FROM commit_order",
        CommitOrder::CommitTimestamps => {
            "SELECT event_id, agg,
                    rank() OVER (ORDER BY pg_xact_commit_timestamp((xid::text::bigint % 4294967296)::text::xid))
             FROM commit_order"
        }
    })
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(order.len(), 480);
    let got = sink
        .wait_until("every committed event published", |g| {
            let ids: std::collections::HashSet<&str> =
                g.iter().map(|m| m.event_id.as_str()).collect();
            order.iter().all(|(id, _, _)| ids.contains(id.as_str()))
        })
        .await;
    worker.stop().await;
    let rolled_back = rolled_back.lock().unwrap().clone();
    assert!(!rolled_back.is_empty());
    let commit_of: HashMap<&str, i64> = order.iter().map(|(id, _, c)| (id.as_str(), *c)).collect();
    let mut per_agg: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for m in &got {
        assert!(
            !rolled_back.contains(&m.event_id),
            "{isolation}: rolled-back event {} published",
            m.event_id
        );
        let c = commit_of[m.event_id.as_str()];
        per_agg.entry(m.aggregate_id.clone()).or_default().push(c);
    }
    for (agg, commits) in &per_agg {
        assert!(
            commits.windows(2).all(|w| w[0] < w[1]),
            "{isolation}: aggregate {agg} published out of commit order: {commits:?}"
        );
    }
    assert_eq!(got.len(), 480, "{isolation}: no duplicates without a fault");
}

#[tokio::test]
async fn concurrent_emitters_at_read_committed_keep_each_aggregates_commit_order() {
    concurrent_emitters_keep_commit_order("READ COMMITTED", CommitOrder::SharedCounter, None).await;
}

#[tokio::test]
async fn concurrent_emitters_at_serializable_keep_each_aggregates_commit_order() {
    concurrent_emitters_keep_commit_order("SERIALIZABLE", CommitOrder::CommitTimestamps, None)
        .await;
}

#[tokio::test]
async fn concurrent_emitters_keep_commit_order_through_small_batches_read_ahead() {
    concurrent_emitters_keep_commit_order("SERIALIZABLE", CommitOrder::CommitTimestamps, Some(4))
        .await;
}

#[tokio::test]
async fn concurrent_emitters_at_read_committed_sharing_no_row_keep_each_aggregates_commit_order() {
    concurrent_emitters_keep_commit_order("READ COMMITTED", CommitOrder::CommitTimestamps, None)
        .await;
}

#[tokio::test]
async fn an_open_transaction_is_published_after_it_commits_and_never_skipped() {
    let db = TestDb::migrated().await;
    let sink = Capture::default();
    let worker = RelayWorker::start(&db.pool, vec![Relay::new("capture", sink.clone())]);
    // Open early, with an event of aggregate "slow", while many batches
    // are cut past it.
    let mut open = db.pool.begin().await.unwrap();
    let early = emit(&mut open, Event::new("order", "slow", "first", json!({})))
        .await
        .unwrap();
    let mut doomed = db.pool.begin().await.unwrap();
    emit(
        &mut doomed,
        Event::new("order", "doomed", "never", json!({})),
    )
    .await
    .unwrap();
    for i in 0..50 {
        emit(
            &mut *db.conn().await,
            Event::new("order", format!("k{i}"), "other", json!({})),
        )
        .await
        .unwrap();
    }
    sink.wait_until("the other events published", |g| g.len() == 50)
        .await;
    doomed.rollback().await.unwrap();
    open.commit().await.unwrap();
    let late = emit(
        &mut *db.conn().await,
        Event::new("order", "slow", "second", json!({})),
    )
    .await
    .unwrap();
    let got = sink
        .wait_until("the open transaction's event and the later one", |g| {
            g.len() == 52
        })
        .await;
    worker.stop().await;
    let slow: Vec<&str> = got
        .iter()
        .filter(|m| m.aggregate_id == "slow")
        .map(|m| m.event_id.as_str())
        .collect();
    assert_eq!(slow, [early.id.as_str(), late.id.as_str()], "in order");
    assert!(got.iter().all(|m| m.aggregate_id != "doomed"));
}

#[tokio::test]
async fn two_subscriptions_each_get_every_event_and_a_new_one_can_start_at_the_head() {
    let db = TestDb::migrated().await;
    for i in 0..20 {
        emit(
            &mut *db.conn().await,
            Event::new("order", (i % 3).to_string(), "e", json!({"i": i})),
        )
        .await
        .unwrap();
    }
    let (a, b, head) = (Capture::default(), Capture::default(), Capture::default());
    let worker = RelayWorker::start(
        &db.pool,
        vec![
            Relay::new("kafka-like", a.clone()),
            Relay::new("webhook-like", b.clone()).partitions(4),
        ],
    );
    a.wait_until("20 events", |g| g.len() == 20).await;
    b.wait_until("20 events", |g| g.len() == 20).await;
    worker.stop().await;
    let worker = RelayWorker::start(
        &db.pool,
        vec![Relay::new("late", head.clone()).start_at_head()],
    );
    // Wait until the new subscription exists before emitting past it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !outbox::relay::subscriptions(&db.pool)
        .await
        .unwrap()
        .iter()
        .any(|s| s.name == "late")
    {
        assert!(Instant::now() < deadline, "the subscription never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = emit(
        &mut *db.conn().await,
        Event::new("order", "1", "after", json!({})),
    )
    .await
    .unwrap();
    let got = head.wait_until("the new event", |g| !g.is_empty()).await;
    worker.stop().await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].event_id, after.id);
    let subs = outbox::relay::subscriptions(&db.pool).await.unwrap();
    let names: Vec<&str> = subs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["kafka-like", "late", "webhook-like"]);
    assert_eq!(subs[2].partitions, 4);
    assert_eq!(subs[0].behind, 1, "the first has not seen the last event");
}

/// Emits ten events over three aggregates, one transaction each.
async fn emit_ten(pool: &PgPool) -> Vec<Emitted> {
    let mut emitted = Vec::new();
    for i in 0..10 {
        let mut conn = pool.acquire().await.unwrap();
        let event = Event::new("order", (i % 3).to_string(), "e", json!({"i": i}));
        emitted.push(emit(&mut conn, event).await.unwrap());
    }
    emitted
}

/// A replay: new subscriptions that start at a retained position, or at a
/// time, publish that event and every later one, and nothing before it;
/// one asked to start past the head starts at the head.
#[tokio::test]
async fn a_new_subscription_can_start_at_a_retained_position_or_time() {
    let db = TestDb::migrated().await;
    let emitted = emit_ten(&db.pool).await;
    let sixth_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT created_at FROM outbox_event_log WHERE position = $1")
            .bind(emitted[6].position)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let (at_position, at_time, past) = (Capture::default(), Capture::default(), Capture::default());
    let worker = RelayWorker::start(
        &db.pool,
        vec![
            Relay::new("from-4", at_position.clone())
                .start_at(outbox::relay::Start::Position(emitted[4].position)),
            Relay::new("from-6", at_time.clone()).start_at(outbox::relay::Start::Time(sixth_at)),
            Relay::new("past", past.clone())
                .start_at(outbox::relay::Start::Position(emitted[9].position + 1000)),
        ],
    );
    // Aggregates publish at once: compared as sets.
    let ids = |got: Vec<Message>| {
        let mut ids: Vec<String> = got.into_iter().map(|m| m.event_id).collect();
        ids.sort();
        ids
    };
    let want = |from: usize| {
        let mut ids: Vec<String> = emitted[from..].iter().map(|e| e.id.clone()).collect();
        ids.sort();
        ids
    };
    let got = at_position.wait_until("six events", |g| g.len() == 6).await;
    assert_eq!(ids(got), want(4));
    let got = at_time.wait_until("four events", |g| g.len() == 4).await;
    assert_eq!(ids(got), want(6));
    let later = emit(
        &mut *db.conn().await,
        Event::new("order", "1", "after", json!({})),
    )
    .await
    .unwrap();
    let got = past.wait_until("the new event", |g| !g.is_empty()).await;
    assert_eq!(ids(got), [later.id]);
    at_time.wait_until("five events", |g| g.len() == 5).await;
    worker.stop().await;
    assert_eq!(at_position.messages().len(), 7);
}

/// A subscription started at a time while a transaction that emitted
/// after that time is still open: its event is published once it commits,
/// not skipped because a later event committed first (the cursor starts
/// after the last event emitted before the time).
#[tokio::test]
async fn a_subscription_started_at_a_time_publishes_an_event_of_a_transaction_open_then() {
    let db = TestDb::migrated().await;
    for i in 0..3 {
        emit(
            &mut *db.conn().await,
            Event::new("order", "1", "before", json!({"i": i})),
        )
        .await
        .unwrap();
    }
    let t: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let mut open = db.pool.begin().await.unwrap();
    let late = emit(&mut open, Event::new("order", "2", "open", json!({})))
        .await
        .unwrap();
    let after = emit(
        &mut *db.conn().await,
        Event::new("order", "3", "after", json!({})),
    )
    .await
    .unwrap();
    let sink = Capture::default();
    let worker = RelayWorker::start(
        &db.pool,
        vec![Relay::new("from-t", sink.clone()).start_at(outbox::relay::Start::Time(t))],
    );
    sink.wait_until("the committed event after the time", |g| !g.is_empty())
        .await;
    open.commit().await.unwrap();
    let got = sink.wait_until("both", |g| g.len() == 2).await;
    worker.stop().await;
    let mut ids: Vec<&str> = got.iter().map(|m| m.event_id.as_str()).collect();
    ids.sort();
    let mut want = [late.id.as_str(), after.id.as_str()];
    want.sort();
    assert_eq!(ids, want);
}

/// An operator rewinds a live subscription to a retained position: its
/// relay worker lets its partition go, takes it again from there once the
/// old lease has run out (never while it runs) and publishes those events
/// again, each aggregate in order.
#[tokio::test]
async fn a_rewound_subscription_publishes_again_from_there() {
    let db = TestDb::migrated().await;
    let emitted = emit_ten(&db.pool).await;
    let sink = Capture::default();
    // A lease of 20 s (renewed every 5 s, acquired every 5 s): a stall of
    // the machine does not lose it.
    let relay = Relay::new("capture", sink.clone()).lease(Duration::from_secs(20));
    let worker = RelayWorker::start(&db.pool, vec![relay]);
    sink.wait_until("all ten", |g| g.len() == 10).await;
    let at = outbox::relay::rewind_subscription(
        &db.pool,
        "capture",
        outbox::relay::Start::Position(emitted[4].position),
    )
    .await
    .unwrap();
    assert_eq!(at, Some(emitted[4].position - 1));
    // The old holder may still be publishing from the old cursor until
    // its next renewal tells it: no relay worker takes the partition
    // again (from the new cursor) while the old lease runs, so one
    // aggregate's events from the two cursors never go out side by side.
    // The acquire statement itself, as a second worker runs it.
    // A partition with its fence, position and gaps.
    type Taken = (i32, i64, i64, Vec<i64>, Vec<i64>);
    let taken: Vec<Taken> = sqlx::query_as(include_str!(
        "../../outbox-core/src/db/sql/event_acquire.sql"
    ))
    .bind("capture")
    .bind("intruder")
    .bind(20_000_000_i64)
    .bind(1_i64)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(taken.is_empty(), "taken while the old lease ran: {taken:?}");
    // The holder stays too: a relay of the build before (whose acquire
    // took any partition without a holder) keeps out as well.
    let old_rule: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event_cursors \
         WHERE subscription = 'capture' AND (holder IS NULL OR lease_until < now())",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(old_rule, 0);
    // The partition is taken again once the old lease has run out: its
    // time moved back here, as 20 s passing would.
    sqlx::query("UPDATE outbox_event_cursors SET lease_until = now() - interval '1 second'")
        .execute(&db.pool)
        .await
        .unwrap();
    let got = sink.wait_until("six again", |g| g.len() == 16).await;
    worker.stop().await;
    let mut again: Vec<&str> = got[10..].iter().map(|m| m.event_id.as_str()).collect();
    again.sort();
    let mut want: Vec<&str> = emitted[4..].iter().map(|e| e.id.as_str()).collect();
    want.sort();
    assert_eq!(again, want);
    for agg in ["0", "1", "2"] {
        let seqs: Vec<i64> = got[10..]
            .iter()
            .filter(|m| m.aggregate_id == agg)
            .map(|m| m.sequence)
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{agg}: {seqs:?}");
    }
    assert_eq!(
        outbox::relay::rewind_subscription(&db.pool, "nobody", outbox::relay::Start::Head)
            .await
            .unwrap(),
        None
    );
}

/// Rewound forward to the head while its broker is down, a subscription
/// passes its backlog: the worker holding its partition (publishing into
/// the failing broker) lets it go, and once the broker is back only what
/// was emitted after the rewind is published.
#[tokio::test]
async fn a_subscription_rewound_to_the_head_passes_its_backlog() {
    let db = TestDb::migrated().await;
    let sink = Capture::default();
    *sink.transient.lock().unwrap() = u32::MAX;
    let relay = Relay::new("capture", sink.clone()).lease(Duration::from_secs(2));
    let worker = RelayWorker::start(&db.pool, vec![relay]);
    for i in 0..5 {
        emit(
            &mut *db.conn().await,
            Event::new("order", "1", "old", json!({"i": i})),
        )
        .await
        .unwrap();
    }
    wait_tried_down(&sink).await;
    let fence_before: i64 =
        sqlx::query_scalar("SELECT fence FROM outbox_event_cursors WHERE subscription = 'capture'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    outbox::relay::rewind_subscription(&db.pool, "capture", outbox::relay::Start::Head)
        .await
        .unwrap()
        .expect("the subscription");
    // Taken again (after the old holder let it go) before the broker is
    // back: the old holder publishes nothing more.
    outbox_tests::process::wait_until(
        &db.pool,
        &format!(
            "SELECT holder IS NOT NULL AND fence > {} FROM outbox_event_cursors \
             WHERE subscription = 'capture'",
            fence_before + 1
        ),
        Duration::from_secs(60),
    )
    .await;
    let sub = outbox::relay::subscriptions(&db.pool).await.unwrap()[0].clone();
    assert_eq!(sub.behind, 0, "{sub:?}");
    *sink.transient.lock().unwrap() = 0;
    let after = emit(
        &mut *db.conn().await,
        Event::new("order", "1", "new", json!({})),
    )
    .await
    .unwrap();
    let got = sink.wait_until("the new event", |g| !g.is_empty()).await;
    worker.stop().await;
    assert_eq!(got[0].event_id, after.id);
    assert_eq!(sink.messages().len(), 1, "{:?}", sink.messages());
}

/// A subscription from the start of a log whose positions run far past
/// its events (retention dropped the early ones, or rolled-back emits drew
/// them) reads the stretch by its events: a batch of positions at a time,
/// with a gap kept for each, would take a hundred million reads here.
#[tokio::test]
async fn a_new_subscription_passes_a_long_stretch_without_a_gap_per_position() {
    let db = TestDb::migrated().await;
    sqlx::query("SELECT setval('outbox_event_position_seq', 1000000000000)")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut emitted = Vec::new();
    for i in 0..3 {
        let e = emit(
            &mut *db.conn().await,
            Event::new("order", "1", "e", json!({"i": i})),
        )
        .await
        .unwrap();
        emitted.push(e.id);
    }
    let sink = Capture::default();
    let worker = RelayWorker::start(&db.pool, vec![Relay::new("from-start", sink.clone())]);
    let got = sink.wait_until("the three events", |g| g.len() == 3).await;
    let ids: Vec<&str> = got.iter().map(|m| m.event_id.as_str()).collect();
    assert_eq!(ids, emitted.iter().map(String::as_str).collect::<Vec<_>>());
    // The cursor is saved at the head, with no gap left below it.
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT position >= 1000000000003 AND cardinality(gaps) = 0 FROM outbox_event_cursors \
         WHERE subscription = 'from-start'",
        Duration::from_secs(60),
    )
    .await;
    worker.stop().await;
}

/// What this test's thread logs (every task of a `#[tokio::test]` runs on
/// it), as text.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Captures this thread's logs until the guard is dropped.
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Waits (at most a minute) until a line contains `what`, unless
    /// `instead` says something else happened first.
    async fn wait_for(&self, what: &str, instead: impl Fn() -> Option<String>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.text().contains(what) {
            if let Some(other) = instead() {
                panic!("{other} before the log said {what:?}");
            }
            assert!(
                Instant::now() < deadline,
                "the log never said {what:?}:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn execute(pool: &PgPool, sql: &'static str) {
    sqlx::raw_sql(sql).execute(pool).await.unwrap();
}

/// A position sequence that hands sessions cached runs (a DBA's tuning) or
/// was set back (setval, a restore, a logical replica that left it
/// behind) would make a relay pass over committed events without a word:
/// it reads nothing until the sequence is put right, says why in its log
/// and in `events subscriptions`, and then publishes what waited, in
/// order.
#[tokio::test]
async fn a_relay_reads_nothing_while_the_position_sequence_caches_or_went_back() {
    let db = TestDb::migrated().await;
    let (logs, _capture) = Logs::capture();
    let sink = Capture::default();
    let worker = RelayWorker::start(&db.pool, vec![Relay::new("capture", sink.clone())]);
    let order = |n: i32| Event::new("order", "1", "order.step", json!({"n": n}));
    let mut ids = vec![emit(&mut *db.conn().await, order(0)).await.unwrap().id];
    sink.wait_until("the first event", |g| g.len() == 1).await;

    // Cached: one session draws a run of positions, its later emits come
    // from that run.
    execute(
        &db.pool,
        "ALTER SEQUENCE outbox_event_position_seq CACHE 20",
    )
    .await;
    let mut session = db.pool.acquire().await.unwrap();
    ids.push(emit(&mut session, order(1)).await.unwrap().id);
    let published = || {
        let n = sink.messages().len();
        (n > 1).then(|| format!("{n} events were published"))
    };
    logs.wait_for("caches 20 positions per session", published)
        .await;
    let sub = &outbox::relay::subscriptions(&db.pool).await.unwrap()[0];
    let problem = sub.problem.as_deref().unwrap_or_default();
    assert!(problem.contains("CACHE 1"), "{sub:?}");
    let light = outbox::relay::sequence_problem(&db.pool).await.unwrap();
    assert_eq!(light.as_deref(), Some(problem), "the same message");
    ids.push(emit(&mut session, order(2)).await.unwrap().id);
    assert_eq!(sink.messages().len(), 1, "nothing read while it caches");
    execute(&db.pool, "ALTER SEQUENCE outbox_event_position_seq CACHE 1").await;
    // The session's cached positions end with it.
    session.close().await.unwrap();
    let got = sink
        .wait_until("the events that waited", |g| g.len() == 3)
        .await;
    let got: Vec<&str> = got.iter().map(|m| m.event_id.as_str()).collect();
    assert_eq!(
        got,
        ids.iter().map(String::as_str).collect::<Vec<_>>(),
        "in order"
    );
    assert!(
        outbox::relay::subscriptions(&db.pool).await.unwrap()[0]
            .problem
            .is_none()
    );
    assert_eq!(
        outbox::relay::sequence_problem(&db.pool).await.unwrap(),
        None
    );

    // Set back behind the relay's cursor.
    execute(&db.pool, "SELECT setval('outbox_event_position_seq', 1)").await;
    emit(&mut *db.conn().await, order(3)).await.unwrap();
    logs.wait_for("is at 2, behind position", || {
        let n = sink.messages().len();
        (n > 3).then(|| format!("{n} events were published"))
    })
    .await;
    let sub = &outbox::relay::subscriptions(&db.pool).await.unwrap()[0];
    assert!(
        sub.problem
            .as_deref()
            .unwrap_or_default()
            .contains("setval"),
        "{sub:?}"
    );
    // Put right as the message says, the relay goes on with what comes
    // next (the event emitted meanwhile sits below its cursor).
    execute(
        &db.pool,
        "SELECT setval('outbox_event_position_seq', greatest( \
         (SELECT max(position) FROM outbox_event_log), \
         (SELECT max(position) FROM outbox_event_cursors)))",
    )
    .await;
    let next = emit(&mut *db.conn().await, order(4)).await.unwrap().id;
    let got = sink.wait_until("the next event", |g| g.len() == 4).await;
    assert_eq!(got[3].event_id, next);
    worker.stop().await;
}

#[tokio::test]
async fn poison_parks_its_aggregate_and_an_operator_retries_or_skips_it() {
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
    let emitted = emit_all(&mut tx, batch).await.unwrap();
    tx.commit().await.unwrap();
    let worker = RelayWorker::start(
        &db.pool,
        vec![Relay::new("capture", sink.clone()).give_up_after(2)],
    );
    sink.wait_until("the healthy aggregates", |g| g.len() == 6)
        .await;
    // The bad aggregate waits in the parked list, its refused event first.
    let parked = wait_parked(&db.pool, Some("capture"), "never parked", |p| p.len() == 3).await;
    assert_eq!(parked[0].id, emitted[3].id);
    assert!(
        parked[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("capture refused the event (too_large)"),
        "{parked:?}"
    );
    assert!(parked[0].retry_at.is_none(), "waits for an operator");
    let sub = &outbox::relay::subscriptions(&db.pool).await.unwrap()[0];
    assert_eq!(
        (
            sub.parked,
            sub.parked_aggregates,
            sub.refused_aggregates,
            sub.behind
        ),
        (3, 1, 1, 0)
    );
    let got = sink.messages();
    for agg in ["a", "b"] {
        let seqs: Vec<i64> = got
            .iter()
            .filter(|m| m.aggregate_id == agg)
            .map(|m| m.sequence)
            .collect();
        assert_eq!(seqs.len(), 3);
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{agg}: {seqs:?}");
    }
    // A later event of the parked aggregate joins the queue behind it.
    emit(
        &mut *db.conn().await,
        Event::new("order", "bad", "order.step", json!({"n": 3})),
    )
    .await
    .unwrap();
    wait_parked(&db.pool, None, "the later event was not held back", |p| {
        p.len() >= 4
    })
    .await;
    assert!(sink.messages().iter().all(|m| m.aggregate_id != "bad"));

    // Skip drops the refused event; the rest go, in order, once the broker
    // takes them.
    sink.refuse.lock().unwrap().clear();
    let skipped = outbox::relay::skip_parked(&db.pool, "capture", "order", "bad")
        .await
        .unwrap();
    assert_eq!(skipped.as_deref(), Some(emitted[3].id.as_str()));
    let got = sink
        .wait_until("the parked aggregate's other events", |g| g.len() == 9)
        .await;
    worker.stop().await;
    let bad: Vec<i64> = got
        .iter()
        .filter(|m| m.aggregate_id == "bad")
        .map(|m| m.sequence)
        .collect();
    assert_eq!(bad.len(), 3);
    assert!(bad.windows(2).all(|w| w[0] < w[1]), "{bad:?}");
    assert!(
        outbox::relay::parked(&db.pool, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        outbox::relay::retry_parked(&db.pool, "capture", "order", "bad")
            .await
            .unwrap(),
        None,
        "nothing left to retry"
    );
    // Held-back events count as published once they go, like the rest;
    // the skipped one does not.
    wait_published(&db.pool, 9).await;
}

/// An operator's retry of an aggregate the broker still refuses, tried
/// for longer than the relay's lease (eight refusals a second apart against
/// a lease of five seconds): the lease is renewed meanwhile, the
/// aggregate parks again and the rest of the log goes on. Before, the
/// retry lost the lease part-way and started over at the next one, again
/// and again: the aggregate never parked again, and the partition's log
/// waited behind every round (this test failed at "not parked again").
#[tokio::test]
async fn a_retry_that_outlasts_the_lease_parks_again_and_the_log_goes_on() {
    let db = TestDb::migrated().await;
    let sink = Capture::default();
    sink.refuse.lock().unwrap().push("bad".to_owned());
    let bad = emit(
        &mut *db.conn().await,
        Event::new("order", "bad", "order.step", json!({"n": 0})),
    )
    .await
    .unwrap();
    let relay = Relay::new("capture", sink.clone())
        .give_up_after(8)
        .lease(Duration::from_secs(5));
    let worker = RelayWorker::start(&db.pool, vec![relay]);
    let refused = async || {
        let parked = outbox::relay::parked(&db.pool, Some("capture"), 10)
            .await
            .unwrap();
        parked.len() == 1 && parked[0].id == bad.id && parked[0].retry_at.is_none()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !refused().await {
        assert!(Instant::now() < deadline, "never parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        outbox::relay::retry_parked(&db.pool, "capture", "order", "bad")
            .await
            .unwrap()
            .as_deref(),
        Some(bad.id.as_str())
    );
    emit(
        &mut *db.conn().await,
        Event::new("order", "good", "order.step", json!({"n": 1})),
    )
    .await
    .unwrap();
    sink.wait_until("the other aggregate's event", |got| {
        got.iter().any(|m| m.aggregate_id == "good")
    })
    .await;
    // Refused eight more times, it waits for an operator again.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !refused().await {
        assert!(Instant::now() < deadline, "not parked again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await;
    assert!(sink.messages().iter().all(|m| m.aggregate_id != "bad"));
}

/// Waits (at most a minute) until the relay has tried `sink`, set up to
/// fail every publish (`transient` at `u32::MAX`), a few times.
async fn wait_tried_down(sink: &Capture) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while *sink.transient.lock().unwrap() > u32::MAX - 3 {
        assert!(
            Instant::now() < deadline,
            "the relay never tried the broker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_delayed_aggregate_is_held_back_but_not_counted_as_refused() {
    let db = TestDb::migrated().await;
    emit_a_delayed_aggregate(&db.pool, Duration::from_secs(3600)).await;
    let sink = Capture::default();
    let worker = RelayWorker::start(&db.pool, vec![Relay::new("capture", sink.clone())]);
    sink.wait_until("the other aggregate", |g| g.len() == 1)
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let sub = loop {
        let sub = outbox::relay::subscriptions(&db.pool).await.unwrap()[0].clone();
        if sub.parked == 2 {
            break sub;
        }
        assert!(Instant::now() < deadline, "never held back: {sub:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    worker.stop().await;
    // Held back until the delay runs out, with the event behind it; no
    // operator is needed, so nothing counts as refused.
    assert_eq!(
        (sub.parked_aggregates, sub.refused_aggregates),
        (1, 0),
        "{sub:?}"
    );
}

/// Emits, in one transaction, an event of aggregate order/1 delayed by
/// `delay`, one more of order/1, and one of order/2.
async fn emit_a_delayed_aggregate(pool: &PgPool, delay: Duration) -> Vec<Emitted> {
    let mut tx = pool.begin().await.unwrap();
    let emitted = emit_all(
        &mut tx,
        [
            Event::new("order", "1", "delayed", json!({})).delay(delay),
            Event::new("order", "1", "after", json!({})),
            Event::new("order", "2", "now", json!({})),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    emitted
}

/// Waits until the first subscription says it published `n` events, then
/// checks that it does not go past them.
async fn wait_published(pool: &PgPool, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let subs = outbox::relay::subscriptions(pool).await.unwrap();
        let published = subs[0].published;
        if published == n {
            return;
        }
        assert!(
            published < n && Instant::now() < deadline,
            "published {published}, expected {n}: {subs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_delayed_event_waits_with_its_aggregate_behind_it() {
    let db = TestDb::migrated().await;
    // Before the emit: the delay counts from its statement, and a stall
    // between the commit and a clock read after it would eat the margin.
    let emitted_at = Instant::now();
    let later = emit_a_delayed_aggregate(&db.pool, Duration::from_millis(1500)).await;
    let sink = Capture::default();
    let worker = RelayWorker::start(&db.pool, vec![Relay::new("capture", sink.clone())]);
    sink.wait_until("all three", |g| g.len() == 3).await;
    worker.stop().await;
    let got = sink.got.lock().unwrap().clone();
    assert_eq!(
        got[0].0.event_id, later[2].id,
        "the other aggregate went first"
    );
    assert_eq!(got[1].0.event_id, later[0].id);
    assert_eq!(got[2].0.event_id, later[1].id);
    assert!(got[1].1.duration_since(emitted_at) >= Duration::from_millis(1000));
    // The two held back count as published too.
    wait_published(&db.pool, 3).await;
}

/// Many aggregates held back by delayed events that come due together are
/// published at once (as a batch's aggregates are), each in order, and
/// what became of each is written to the right event: one aggregate's
/// first event is refused (it waits for an operator, with the broker's
/// error), another's second is delayed an hour more (it waits with no
/// error), and the rest go, the events behind them too.
async fn delayed_aggregates_come_due_together(batch: i64) {
    let db = TestDb::migrated().await;
    let sink = Capture::default();
    sink.refuse.lock().unwrap().push("bad".to_owned());
    let soon = Duration::from_millis(1500);
    let mut events = Vec::new();
    for agg in 0..200 {
        let agg = agg.to_string();
        events.push(Event::new("order", &agg, "first", json!({})).delay(soon));
        events.push(Event::new("order", &agg, "second", json!({})));
        events.push(Event::new("order", &agg, "third", json!({})));
    }
    events.push(Event::new("order", "bad", "first", json!({})).delay(soon));
    events.push(Event::new("order", "bad", "second", json!({})));
    events.push(Event::new("order", "mixed", "first", json!({})).delay(soon));
    events.push(Event::new("order", "mixed", "later", json!({})).delay(Duration::from_secs(3600)));
    events.push(Event::new("order", "mixed", "last", json!({})));
    let mut tx = db.pool.begin().await.unwrap();
    let emitted = emit_all(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    let relay = Relay::new("capture", sink.clone())
        .give_up_after(1)
        .batch(batch);
    let worker = RelayWorker::start(&db.pool, vec![relay]);
    let got = sink
        .wait_until("the due aggregates", |g| g.len() == 601)
        .await;
    // Held back: bad's two (its first refused), mixed's last two (its
    // second not due for an hour).
    let parked = wait_parked(
        &db.pool,
        Some("capture"),
        "not held back as expected",
        |p| p.len() == 4 && p.iter().any(|p| p.error.is_some()),
    )
    .await;
    worker.stop().await;
    for agg in 0..200 {
        let agg = agg.to_string();
        let types: Vec<&str> = got
            .iter()
            .filter(|m| m.aggregate_id == agg)
            .map(|m| m.event_type.as_str())
            .collect();
        assert_eq!(types, ["first", "second", "third"], "aggregate {agg}");
    }
    let mixed: Vec<&str> = got
        .iter()
        .filter(|m| m.aggregate_id == "mixed")
        .map(|m| m.event_type.as_str())
        .collect();
    assert_eq!(mixed, ["first"]);
    assert!(got.iter().all(|m| m.aggregate_id != "bad"));
    let by_id: HashMap<&str, &outbox::relay::ParkedEvent> =
        parked.iter().map(|p| (p.id.as_str(), p)).collect();
    let (bad, later) = (&emitted[600], &emitted[603]);
    let refused = by_id[bad.id.as_str()];
    assert!(
        refused.retry_at.is_none()
            && refused
                .error
                .as_deref()
                .is_some_and(|e| e.contains("capture refused the event")),
        "{parked:?}"
    );
    let waiting = by_id[later.id.as_str()];
    assert!(
        waiting.error.is_none()
            && waiting
                .retry_at
                .is_some_and(|at| at > chrono::Utc::now() + chrono::Duration::minutes(50)),
        "{parked:?}"
    );
    for behind in [&emitted[601], &emitted[604]] {
        assert!(by_id[behind.id.as_str()].error.is_none(), "{parked:?}");
    }
    wait_published(&db.pool, 601).await;
}

#[tokio::test]
async fn delayed_aggregates_coming_due_together_go_out_at_once_each_in_order() {
    delayed_aggregates_come_due_together(outbox::relay::DEFAULT_BATCH).await;
}

/// The same through batches of 50: the due events are tried 50 at a time,
/// an aggregate's sometimes split between two tries.
#[tokio::test]
async fn delayed_aggregates_coming_due_together_go_out_through_small_batches() {
    delayed_aggregates_come_due_together(50).await;
}

/// An event its relay's cursor passed while its transaction was open (a
/// gap), committed while the broker is down: it counts in the backlog and
/// its wait in the lag, as an event past the cursor does. Before, the
/// subscription said it was behind by nothing (so did the backlog metric
/// and its alert) for as long as the broker stayed down.
#[tokio::test]
async fn an_event_committed_in_a_gap_behind_a_down_broker_counts_in_the_backlog() {
    let db = TestDb::migrated().await;
    let sink = Capture::default();
    *sink.transient.lock().unwrap() = u32::MAX;
    let worker = RelayWorker::start(&db.pool, vec![Relay::new("capture", sink.clone())]);
    let mut open = db.pool.begin().await.unwrap();
    let late = emit(
        &mut open,
        Event::new("order", "1", "order.placed", json!({})),
    )
    .await
    .unwrap();
    // The cursor passes it as a gap, written when the partition is idle.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let passed: bool = sqlx::query_scalar(
            "SELECT coalesce(bool_or(position >= $1 AND $1 = ANY (gaps)), false) \
             FROM outbox_event_cursors WHERE subscription = 'capture'",
        )
        .bind(late.position)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if passed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cursor never passed the open emit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    open.commit().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let sub = loop {
        let sub = outbox::relay::subscriptions(&db.pool).await.unwrap()[0].clone();
        if sub.behind == 1 && sub.lag_s > 0.0 {
            break sub;
        }
        assert!(Instant::now() < deadline, "not counted behind: {sub:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(sub.position >= late.position, "{sub:?}");
    worker.stop().await;
    assert!(sink.messages().is_empty());
}

/// A relay worker told to stop while its broker is down stops without
/// waiting out the shutdown grace (two minutes here) for the broker, and
/// loses nothing: its cursor stays, and the next worker publishes the
/// event. Before, the stop waited for the whole grace.
#[tokio::test]
async fn a_relay_stops_at_once_while_its_broker_is_down_and_loses_nothing() {
    let db = TestDb::migrated().await;
    let down = Capture::default();
    *down.transient.lock().unwrap() = u32::MAX;
    let worker = Worker::builder(db.pool.clone())
        .config(outbox::WorkerConfig {
            shutdown_grace: Duration::from_secs(120),
            ..outbox::WorkerConfig::default()
        })
        .relay(Relay::new("capture", down.clone()).poll_interval(Duration::from_millis(5)))
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let event = emit(
        &mut *db.conn().await,
        Event::new("order", "1", "order.placed", json!({})),
    )
    .await
    .unwrap();
    wait_tried_down(&down).await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("stopped before the shutdown grace ran out")
        .unwrap()
        .unwrap();
    assert!(down.messages().is_empty());
    let up = Capture::default();
    let worker = RelayWorker::start(&db.pool, vec![Relay::new("capture", up.clone())]);
    let got = up.wait_until("the event", |g| !g.is_empty()).await;
    worker.stop().await;
    assert_eq!(got[0].event_id, event.id);
}

/// A sink whose first publish waits for the test, then fails once for now;
/// the rest go to `inner`.
#[derive(Clone)]
struct FailsOnceWhenLetGo {
    entered: Arc<tokio::sync::Notify>,
    go: Arc<tokio::sync::Notify>,
    first: Arc<std::sync::atomic::AtomicBool>,
    inner: Capture,
}

impl outbox::relay::Sink for FailsOnceWhenLetGo {
    fn kind(&self) -> &'static str {
        "fails-once"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> outbox::relay::PublishFuture<'a> {
        Box::pin(async move {
            if self.first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                self.entered.notify_one();
                self.go.notified().await;
                return Err(outbox::relay::PublishError::transient("blip", "one 503"));
            }
            self.inner.publish(message).await
        })
    }
}

/// One transient failure while a relay worker stops (its circuit closed)
/// is retried as it would be otherwise: the batch goes out and its cursor
/// is written before the worker stops, nothing left to publish twice.
#[tokio::test]
async fn a_single_failure_while_stopping_is_retried_not_abandoned() {
    let db = TestDb::migrated().await;
    let sink = FailsOnceWhenLetGo {
        entered: Arc::default(),
        go: Arc::default(),
        first: Arc::new(true.into()),
        inner: Capture::default(),
    };
    let event = emit(
        &mut *db.conn().await,
        Event::new("order", "1", "order.placed", json!({})),
    )
    .await
    .unwrap();
    let worker = RelayWorker::start(&db.pool, vec![Relay::new("capture", sink.clone())]);
    sink.entered.notified().await;
    worker.stop.cancel();
    sink.go.notify_one();
    worker.handle.await.unwrap().unwrap();
    let got = sink.inner.messages();
    assert_eq!(got.len(), 1, "published before the stop");
    assert_eq!(got[0].event_id, event.id);
    let sub = &outbox::relay::subscriptions(&db.pool).await.unwrap()[0];
    assert_eq!((sub.published, sub.behind), (1, 0), "{sub:?}");
}

#[tokio::test]
async fn partitions_are_shared_between_relay_workers_and_a_silent_one_is_fenced() {
    let db = TestDb::migrated().await;
    let (a, b) = (Capture::default(), Capture::default());
    let relay = |sink: &Capture| {
        Relay::new("shared", sink.clone())
            .partitions(4)
            .lease(Duration::from_secs(2))
            // Batches of 2 positions are full whenever a partition is
            // behind by two, so it reads ahead, and the silent worker's
            // reads ahead meet the black hole too.
            .batch(2)
    };
    // Worker A reaches the database through a proxy the test can cut.
    let (proxy, proxied_url) = FaultProxy::start(&db.url).await;
    let pool_a = TestDb::pool_on(&proxied_url, 4).await;
    let worker_a = RelayWorker::start(&pool_a, vec![relay(&a)]);
    let worker_b = RelayWorker::start(&db.pool, vec![relay(&b)]);
    let holders = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(DISTINCT holder) FROM outbox_event_cursors WHERE lease_until > now()",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while holders(db.pool.clone()).await < 2 {
        assert!(
            Instant::now() < deadline,
            "the partitions were never shared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..200 {
        emit(
            &mut *db.conn().await,
            Event::new("order", (i % 40).to_string(), "e", json!({"i": i})),
        )
        .await
        .unwrap();
    }
    // Distinct events: a batch may reach both sinks while a lease moves.
    let total = |a: &Capture, b: &Capture| {
        a.messages()
            .iter()
            .chain(b.messages().iter())
            .map(|m| m.event_id.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while total(&a, &b) < 200 {
        assert!(
            Instant::now() < deadline,
            "{} of 200 published",
            total(&a, &b)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!a.messages().is_empty() && !b.messages().is_empty());

    // A goes silent: its leases run out, B takes every partition, and A,
    // when it hears again, has published nothing since it lost them.
    proxy.blackhole();
    let cut_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    while holders(db.pool.clone()).await != 1 {
        assert!(Instant::now() < deadline, "B never took A's partitions");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let taken_at = Instant::now();
    for i in 200..400 {
        emit(
            &mut *db.conn().await,
            Event::new("order", (i % 40).to_string(), "e", json!({"i": i})),
        )
        .await
        .unwrap();
    }
    // Counted by value: B may also publish earlier events again (those A
    // published without committing its cursor), and a prefix test of the
    // payload would count i = 2 or 20..39 among them.
    b.wait_until("B publishes everything new", |g| {
        g.iter()
            .filter_map(|m| serde_json::from_slice::<serde_json::Value>(&m.payload).ok())
            .filter_map(|v| v["i"].as_u64())
            .filter(|i| *i >= 200)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            >= 200
    })
    .await;
    proxy.pass();
    let a_after: Vec<Instant> = a
        .got
        .lock()
        .unwrap()
        .iter()
        .map(|(_, t)| *t)
        .filter(|t| *t > taken_at)
        .collect();
    assert!(
        a_after.is_empty(),
        "the silent worker published {} events after its leases were taken",
        a_after.len()
    );
    worker_b.stop().await;
    worker_a.stop().await;
    drop(proxy);
    // Every event reached one sink or the other, each aggregate in order
    // within the sink that published it.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for m in a.messages().iter().chain(b.messages().iter()) {
        *seen.entry(m.event_id.clone()).or_default() += 1;
    }
    assert_eq!(seen.len(), 400, "silent for {:?}", cut_at.elapsed());
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
async fn bad_events_and_relays_are_refused_and_write_nothing() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    let bad = [
        Event::new("", "1", "t", json!({})),
        Event::new("a/b", "1", "t", json!({})),
        Event::new("order", "1", "t", json!({})).id("not-a-uuid"),
        Event::new("order", "1", "t", json!({})).header("sequence", "9"),
        Event::new("order", "1", "t", json!({"nul": "\u{0}"})),
        Event::new("order", "1", "t", json!({})).queue(""),
    ];
    for event in bad {
        let err = emit(&mut conn, event).await.unwrap_err().to_string();
        assert!(err.contains("event refused"), "{err}");
    }
    assert_eq!(log_rows(&db.pool).await, 0);

    let sink = Capture::default();
    let built = Worker::builder(db.pool.clone())
        .relay(Relay::new("one", sink.clone()))
        .relay(Relay::new("one", sink.clone()))
        .relay(
            Relay::new("bad name", sink.clone())
                .route("x.{aggregate_id}")
                .partitions(0)
                .batch(0),
        )
        .build();
    let Err(outbox::Error::Startup(problems)) = built else {
        panic!("two relays of one name must be refused")
    };
    let text = problems.to_string();
    assert!(text.contains("two relays are named \"one\""), "{text}");
    assert!(text.contains("relay name \"bad name\""), "{text}");
    assert!(text.contains("unknown field {aggregate_id}"), "{text}");
    assert!(text.contains("0 partitions is out of range"), "{text}");
    assert!(text.contains("batch 0 is out of range"), "{text}");
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
        (
            "nats://127.0.0.1:1?partitions=2000",
            "partitions=\"2000\" is out of range",
        ),
        ("nats://127.0.0.1:1?start=middle", "start=\"middle\""),
        ("nats://127.0.0.1:1?start=0", "start=\"0\""),
        (
            "nats://127.0.0.1:1?start=2026-13-01T00:00:00Z",
            "an RFC 3339 time",
        ),
        (
            "nats://127.0.0.1:1?start=2026-11-28T09:00:00+01:00",
            "write an offset's + as %2B",
        ),
        (
            "nats://127.0.0.1:1?poll_ms=0",
            "poll_ms=\"0\" is out of range",
        ),
    ] {
        let err = Relay::from_url("r", url).await.unwrap_err();
        assert!(err.contains(needle), "{url}: {err}");
    }
    for (start, shown) in [
        ("head", "Head"),
        ("42", "Position(42)"),
        ("2026-11-28T09:00:00%2B01:00", "Time(2026-11-28T08:00:00Z)"),
    ] {
        let url = format!("http://127.0.0.1:1/hook?start={start}");
        let relay = Relay::from_url("r", &url).await.unwrap();
        assert!(format!("{relay:?}").contains(shown), "{url}: {relay:?}");
    }
}

/// Waits (at most a minute) until a session of this database runs a
/// statement containing `what` (no quotes in it) and waits for a lock.
/// (pg_stat_activity keeps a statement's first kilobyte: `what` must come
/// early in it.)
async fn wait_for_lock_wait(pool: &PgPool, what: &str) {
    outbox_tests::process::wait_until(
        pool,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                            WHERE datname = current_database() AND pid <> pg_backend_pid()
                              AND wait_event_type = 'Lock' AND strpos(query, '{what}') > 0)"
        ),
        Duration::from_secs(60),
    )
    .await;
}

/// Making a partition moves the rows the default partition holds for its
/// range (maintenance down for days): a relay's read running meanwhile
/// must see them in their new place, not miss them in both. It waits for
/// the move before it plans (migration 20).
#[tokio::test]
async fn a_read_while_a_partition_is_made_sees_the_rows_moved_into_it() {
    let db = TestDb::migrated().await;
    // Five events where no partition covers their day: in the default one.
    // (One reading of the clock for the rows and the partition, which
    // would otherwise be for different days across a midnight.)
    let day: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now() + interval '10 days'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    sqlx::query(
        "INSERT INTO outbox_event_log (id, aggregatetype, aggregateid, type, payload, created_at)
         SELECT gen_random_uuid(), 'order', g::text, 'e', '{}', $1
         FROM generate_series(1, 5) AS g",
    )
    .bind(day)
    .execute(&db.pool)
    .await
    .unwrap();
    let mut maker = db.pool.begin().await.unwrap();
    let made: bool = sqlx::query_scalar("SELECT outbox_event_log_cover($1, interval '1 day')")
        .bind(day)
        .fetch_one(&mut *maker)
        .await
        .unwrap();
    assert!(made);
    let pool = db.pool.clone();
    let read = tokio::spawn(async move {
        sqlx::query(include_str!("../../outbox-core/src/db/sql/event_read.sql"))
            .bind(0_i64)
            .bind(5_i64)
            .bind(Vec::<i64>::new())
            .bind("events")
            .bind(1_i32)
            .bind(0_i32)
            .bind(10_000_i64)
            .fetch_all(&pool)
            .await
            .unwrap()
    });
    wait_for_lock_wait(&db.pool, "The next batch of one partition").await;
    maker.commit().await.unwrap();
    let rows = read.await.unwrap();
    let mine = rows
        .iter()
        .filter(|r| sqlx::Row::try_get::<Option<bool>, _>(*r, "mine").unwrap() == Some(true))
        .count();
    assert_eq!(mine, 5, "the read saw every moved event");
}

/// A partition three days old with one event (type `first`), and
/// subscription `r` whose cursor has not passed it.
async fn a_day_past_with_a_subscription_at_its_start(pool: &PgPool) {
    execute(
        pool,
        "SELECT outbox_event_log_cover(now() - interval '3 days', interval '1 day');
         INSERT INTO outbox_event_subscriptions (name, stream, partitions) VALUES ('r', 'events', 1);
         INSERT INTO outbox_event_cursors (subscription, part, position) VALUES ('r', 0, 0);
         INSERT INTO outbox_event_log (id, aggregatetype, aggregateid, type, payload, created_at)
         VALUES (gen_random_uuid(), 'order', 'a', 'first', '{}',
                 date_trunc('day', now() - interval '3 days', 'UTC') + interval '1 hour')",
    )
    .await;
}

/// Retention looks at a partition only once it holds it: an event whose
/// transaction was still open when the drop began (a long or prepared
/// transaction) keeps its partition, even when it commits while the drop
/// waits (migration 20).
#[tokio::test]
async fn retention_keeps_a_partition_whose_last_event_commits_while_the_drop_waits() {
    let db = TestDb::migrated().await;
    a_day_past_with_a_subscription_at_its_start(&db.pool).await;
    // The partition's last event, its transaction still open.
    let mut open = db.pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO outbox_event_log (id, aggregatetype, aggregateid, type, payload, created_at)
         VALUES (gen_random_uuid(), 'order', 'a', 'last', '{}',
                 (SELECT created_at FROM outbox_event_log WHERE type = 'first') + interval '22 hours')",
    )
    .execute(&mut *open)
    .await
    .unwrap();
    // A relay passed the day, with the open event's position a gap.
    execute(
        &db.pool,
        "INSERT INTO outbox_event_log (id, aggregatetype, aggregateid, type, payload)
         VALUES (gen_random_uuid(), 'order', 'b', 'today', '{}');
         UPDATE outbox_event_cursors SET position = 3, gaps = '{2}', gap_bounds = '{9223372036854775807}'",
    )
    .await;
    let pool = db.pool.clone();
    let drop = tokio::spawn(async move {
        sqlx::query_as::<_, (Option<String>, Option<bool>)>(
            "SELECT dropped, forced FROM outbox_event_log_drop(now() - interval '1 hour', now() - interval '14 days')",
        )
        .fetch_one(&pool)
        .await
    });
    wait_for_lock_wait(&db.pool, "outbox_event_log_drop").await;
    open.commit().await.unwrap();
    match drop.await.unwrap() {
        // It looked after the commit: the cursor has not passed the event.
        Ok((dropped, _)) => assert_eq!(dropped, None, "dropped with an unpublished event"),
        // Or it gave up waiting (lock_timeout), for a later round.
        Err(e) => assert!(e.to_string().contains("lock timeout"), "{e}"),
    }
    let last: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_event_log WHERE type = 'last'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(last, 1, "the event is kept until a relay publishes it");
}

/// A retention round that has nothing to drop (a subscription has not
/// passed the oldest partition) takes no lock on the log, so emitters
/// never wait for it, and an open emitter does not make it fail.
#[tokio::test]
async fn a_retention_round_with_nothing_to_drop_does_not_wait_for_emitters() {
    let db = TestDb::migrated().await;
    a_day_past_with_a_subscription_at_its_start(&db.pool).await;
    let mut open = db.pool.begin().await.unwrap();
    emit(&mut open, Event::new("order", "b", "e", json!({})))
        .await
        .unwrap();
    let (dropped, _): (Option<String>, Option<bool>) = sqlx::query_as(
        "SELECT dropped, forced FROM outbox_event_log_drop(now() - interval '1 hour', now() - interval '14 days')",
    )
    .fetch_one(&db.pool)
    .await
    .expect("no lock taken, so no lock timeout");
    assert_eq!(dropped, None, "the subscription has not passed it");
    open.commit().await.unwrap();
}
