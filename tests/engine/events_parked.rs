//! What a relay holds back, at scale: only an aggregate's first held-back
//! event carries a time (migration 37), so a look at what is due reads the
//! due aggregates through an index instead of the whole list. These check
//! that what the look no longer reads is still published: the events
//! behind a first one, more than a batch of them, and an aggregate whose
//! first event lost its time in a race (or was written by a relay of an
//! earlier migration), which the sweep puts right when a relay takes the
//! partition.

use std::time::Duration;

use outbox::events::{Event, emit, emit_all};
use outbox::relay::{Message, Relay};
use outbox_tests::TestDb;
use outbox_tests::sinks::Capture;
use serde_json::json;
use sqlx::{PgPool, Row};

use crate::events::{RelayWorker, wait_parked};

/// The `n` of each message of aggregate `agg`, in the order they arrived.
fn steps(got: &[Message], agg: &str) -> Vec<i64> {
    got.iter()
        .filter(|m| m.aggregate_id == agg)
        .map(|m| {
            let payload: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
            payload["n"].as_i64().unwrap()
        })
        .collect()
}

/// Held-back events that carry a time: (first of their aggregate, not).
async fn timed(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE first), count(*) FILTER (WHERE NOT first)
         FROM (SELECT retry_at, position = min(position) OVER (PARTITION BY aggregatetype, aggregateid)
                   AS first
               FROM outbox_event_parked) AS p
         WHERE retry_at IS NOT NULL",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// An aggregate held back by a delay, with more events behind it than a
/// look reads (40 emitted with it, 5 more joining while it waits): the
/// first look publishes a batch's worth, and the rest, which carry no
/// time of their own, follow in order.
async fn a_delayed_aggregate_with_more_than_a_batch_behind_it(batch: i64) {
    let db = TestDb::migrated().await;
    let mut events =
        vec![Event::new("order", "long", "step", json!({"n": 0})).delay(Duration::from_secs(2))];
    events.extend((1..41).map(|n| Event::new("order", "long", "step", json!({"n": n}))));
    events.push(Event::new("order", "other", "step", json!({"n": 0})));
    let mut tx = db.pool.begin().await.unwrap();
    emit_all(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    let sink = Capture::default();
    let worker = RelayWorker::start(
        &db.pool,
        vec![Relay::new("capture", sink.clone()).batch(batch)],
    );
    sink.wait_until("the other aggregate", |g| g.len() == 1)
        .await;
    let parked = wait_parked(&db.pool, Some("capture"), "never held back", |p| {
        p.len() == 41
    })
    .await;
    // Only the first has a time; those behind it wait for it.
    assert_eq!(timed(&db.pool).await, (1, 0), "{parked:?}");
    for n in 41..46 {
        emit(
            &mut *db.conn().await,
            Event::new("order", "long", "step", json!({"n": n})),
        )
        .await
        .unwrap();
    }
    let got = sink
        .wait_until("the held-back aggregate, whole", |g| g.len() == 47)
        .await;
    worker.stop().await;
    assert_eq!(steps(&got, "long"), (0..46).collect::<Vec<_>>());
    assert!(
        outbox::relay::parked(&db.pool, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_delayed_aggregate_with_more_than_a_batch_behind_it_goes_out_whole_in_order() {
    a_delayed_aggregate_with_more_than_a_batch_behind_it(10).await;
}

/// A batch of one: each look reads one event, and must still tell that
/// the aggregate holds back more (a first version of the look read one
/// event an aggregate and took it for the aggregate's only one).
#[tokio::test]
async fn a_delayed_aggregate_goes_out_whole_in_order_one_event_a_look() {
    a_delayed_aggregate_with_more_than_a_batch_behind_it(1).await;
}

/// Held-back events written before migration 37 (each with a time) lose
/// the times of those behind a first event on the way up and get them
/// back on the way down. A first event with neither a time nor an error
/// (what a race between a relay's parking and an operator's skip could
/// leave) is published when a relay next takes the partition, with those
/// behind it, in order, and none of them before it.
#[tokio::test]
async fn held_back_events_from_before_migration_37_and_a_first_without_a_time_are_published() {
    let db = TestDb::migrated().await;
    let sink = Capture::default();
    sink.refuse.lock().unwrap().push("bad".to_owned());
    let events = (0..4).map(|n| Event::new("order", "bad", "step", json!({"n": n})));
    let mut tx = db.pool.begin().await.unwrap();
    emit_all(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    let relay = || Relay::new("capture", sink.clone()).give_up_after(1);
    let worker = RelayWorker::start(&db.pool, vec![relay()]);
    wait_parked(&db.pool, Some("capture"), "never parked", |p| {
        p.len() == 4 && p[0].error.is_some()
    })
    .await;
    worker.stop().await;
    // Refused: the first waits for an operator, with no time.
    assert_eq!(timed(&db.pool).await, (0, 0));

    for (sql, after, what) in [
        (
            include_str!("../../migrations/0037_parked_heads.down.sql"),
            (0, 3),
            "down: those behind the first have a time, as before",
        ),
        (
            include_str!("../../migrations/0037_parked_heads.up.sql"),
            (0, 0),
            "up again: those behind the first have none",
        ),
    ] {
        sqlx::raw_sql(sql).execute(&db.pool).await.unwrap();
        assert_eq!(timed(&db.pool).await, after, "{what}");
    }

    // The race's leftover: the first has neither a time nor an error, and
    // one behind it has a time, as an earlier relay wrote them.
    sqlx::raw_sql(
        "UPDATE outbox_event_parked SET error = NULL
         WHERE position = (SELECT min(position) FROM outbox_event_parked);
         UPDATE outbox_event_parked SET retry_at = now()
         WHERE position = (SELECT max(position) FROM outbox_event_parked);",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sink.refuse.lock().unwrap().clear();
    let worker = RelayWorker::start(&db.pool, vec![relay()]);
    let got = sink.wait_until("the aggregate", |g| g.len() == 4).await;
    worker.stop().await;
    assert_eq!(steps(&got, "bad"), [0, 1, 2, 3]);
}

/// An operator's `retry --now` that lands while the relay is publishing
/// the aggregate's look (it read the event before the delay was cut, and
/// puts it back to wait for its time) is not undone: the relay's unpark
/// keeps the earlier time the row has now. The unpark statement itself,
/// run as the relay runs it, since the race's window is one statement.
#[tokio::test]
async fn a_delay_cut_short_while_the_relay_holds_the_event_back_stays_cut() {
    let db = TestDb::migrated().await;
    held_by_w(&db.pool).await;
    sqlx::raw_sql(
        "INSERT INTO outbox_event_parked (subscription, position, id, aggregatetype, aggregateid, type,
                                          payload, aggregate_hash, created_at, retry_at, error,
                                          publish_at)
         VALUES ('s', 7, '0193b9e0-0000-7000-8000-000000000007', 'order', '1', 'order.reminded', '{}',
                 1, now(), now(), NULL, now() + interval '1 hour');",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // The look read it with its hour-long delay; the operator cuts it.
    let read_delay: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT publish_at FROM outbox_event_parked WHERE position = 7")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let cut = outbox::relay::retry_parked_now(
        &db.pool,
        "s",
        "order",
        "1",
        "0193b9e0-0000-7000-8000-000000000007",
    )
    .await
    .unwrap();
    assert!(cut.is_some());
    // The relay, which found it not due yet, holds it back until the time
    // it read.
    unpark_again(&db.pool, &[(7, Some(read_delay), None)], &[]).await;
    let due: bool =
        sqlx::query_scalar("SELECT retry_at <= now() FROM outbox_event_parked WHERE position = 7")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(due, "the relay put the delay the operator cut back");
}

/// "Publish now" names the event the operator saw: while another event
/// is first it does nothing, and repeated after that event went out (a
/// double click, a stale page, shell history) it leaves the next event's
/// delay alone, which may be meant (a reminder a day ahead).
#[tokio::test]
async fn a_stale_or_repeated_publish_now_cuts_no_later_events_delay() {
    let db = TestDb::migrated().await;
    let (first, second) = (
        "0193b9e0-0000-7000-8000-000000000001",
        "0193b9e0-0000-7000-8000-000000000002",
    );
    sqlx::query(
        "INSERT INTO outbox_event_subscriptions (name, stream, partitions) VALUES ('s', 'events', 1)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox_event_parked (subscription, position, id, aggregatetype, aggregateid, type,
                                          payload, aggregate_hash, created_at, retry_at, error,
                                          publish_at)
         SELECT 's', p, i::uuid, 'order', '1', 'order.reminded', '{}', 1, now(),
                CASE WHEN p = 1 THEN now() + interval '1 hour' END, NULL, now() + interval '1 hour'
         FROM unnest(ARRAY[1, 2], ARRAY[$1, $2]) AS e (p, i)",
    )
    .bind(first)
    .bind(second)
    .execute(&db.pool)
    .await
    .unwrap();
    let delayed = |id: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT publish_at > now() + interval '30 minutes' FROM outbox_event_parked WHERE id = $1::uuid",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let now = |id: &'static str| outbox::relay::retry_parked_now(&db.pool, "s", "order", "1", id);
    assert_eq!(now(second).await.unwrap(), None, "the second is not first");
    assert!(delayed(first).await && delayed(second).await);
    assert_eq!(now(first).await.unwrap().as_deref(), Some(first));
    assert!(!delayed(first).await, "the named first event is cut");
    assert!(delayed(second).await);
    // The relay publishes it (its unpark deletes its row); the operator's
    // command comes again.
    sqlx::query("DELETE FROM outbox_event_parked WHERE id = $1::uuid")
        .bind(first)
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(now(first).await.unwrap(), None);
    assert!(delayed(second).await, "the second event's delay was cut");
    assert!(matches!(
        now("not-an-id").await,
        Err(outbox::Error::InvalidOption(_))
    ));
}

/// An operator's retry made while the relay was trying a refused
/// aggregate again (the broker refused that attempt; the operator has just
/// fixed it) is not undone by the relay writing the refusal: the aggregate
/// stays due. That holds for a retry whose transaction began before the
/// relay's look and committed after it, which has the earlier time. Without
/// such a retry, a refused aggregate waits for the operator. The look and
/// unpark statements themselves, as the relay runs them.
#[tokio::test]
async fn a_retry_made_during_a_refused_attempt_is_kept() {
    let db = TestDb::migrated().await;
    held_by_w(&db.pool).await;
    sqlx::raw_sql(
        "INSERT INTO outbox_event_parked (subscription, position, id, aggregatetype, aggregateid, type,
                                          payload, aggregate_hash, created_at, retry_at, error)
         VALUES ('s', 7, gen_random_uuid(), 'order', '1', 'order.placed', '{}', 1, now(),
                 now() - interval '1 second', 'refused'),
                ('s', 8, gen_random_uuid(), 'order', '2', 'order.placed', '{}', 1, now(),
                 now() - interval '1 second', 'refused'),
                ('s', 9, gen_random_uuid(), 'order', '3', 'order.placed', '{}', 1, now(),
                 now() - interval '1 second', 'refused');",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // An operator's retry of order/3 begins (its time is now) and has not
    // committed when the relay's look reads the rows.
    let mut early = db.pool.begin().await.unwrap();
    sqlx::query(include_str!(
        "../../outbox-core/src/db/sql/event_parked_retry.sql"
    ))
    .bind("s")
    .bind("order")
    .bind("3")
    .bind(false)
    .bind(None::<String>)
    .bind(false)
    .fetch_optional(&mut *early)
    .await
    .unwrap()
    .expect("order/3 is retried");
    let seen: Vec<(i64, String)> = sqlx::query(include_str!(
        "../../outbox-core/src/db/sql/event_parked_due.sql"
    ))
    .bind("s")
    .bind(1_i32)
    .bind(0_i32)
    .bind(100_i64)
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .iter()
    .map(|row: &sqlx::postgres::PgRow| (row.get("position"), row.get("seen")))
    .collect();
    assert_eq!(seen.len(), 3, "the look reads all three: {seen:?}");
    early.commit().await.unwrap();
    // Then the operator retries order/1, after the look.
    let retried = outbox::relay::retry_parked(&db.pool, "s", "order", "1")
        .await
        .unwrap();
    assert!(retried.is_some());
    // The relay writes the three refusals: wait for an operator.
    let refused = Some("refused again");
    unpark_again(
        &db.pool,
        &[(7, None, refused), (8, None, refused), (9, None, refused)],
        &seen.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    )
    .await;
    let rows: Vec<(i64, Option<bool>, Option<String>)> = sqlx::query_as(
        "SELECT position, retry_at <= now(), error FROM outbox_event_parked ORDER BY position",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let again = Some("refused again".to_owned());
    assert_eq!(
        rows,
        [
            (7, Some(true), again.clone()),
            (8, None, again.clone()),
            (9, Some(true), again)
        ],
        "order/1 and order/3 stay due, order/2 waits"
    );
}

/// Subscription `s` of one partition, held by relay worker `w` under fence
/// 3, as the unpark statement's tests need it.
async fn held_by_w(pool: &PgPool) {
    sqlx::raw_sql(
        "INSERT INTO outbox_event_subscriptions (name, stream, partitions) VALUES ('s', 'events', 1);
         INSERT INTO outbox_event_cursors (subscription, part, position, holder, lease_until, fence)
         VALUES ('s', 0, 10, 'w', now() + interval '1 minute', 3);",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// A held-back event tried and held back again: its position, when it is
/// tried next, and the broker's refusal.
type HeldAgain<'a> = (i64, Option<chrono::DateTime<chrono::Utc>>, Option<&'a str>);

/// Runs the relay's unpark statement as `w` does for the held-back events
/// it tried and holds back again, whose rows the look read at versions
/// `seen`: nothing published, no aggregate cut.
async fn unpark_again(pool: &PgPool, again: &[HeldAgain<'_>], seen: &[String]) {
    let none: Vec<i64> = Vec::new();
    let no_text: Vec<String> = Vec::new();
    sqlx::query(include_str!(
        "../../outbox-core/src/db/sql/event_unpark.sql"
    ))
    .bind("s")
    .bind(0_i32)
    .bind("w")
    .bind(3_i64)
    .bind(&none)
    .bind(again.iter().map(|a| a.0).collect::<Vec<_>>())
    .bind(again.iter().map(|a| a.1).collect::<Vec<_>>())
    .bind(again.iter().map(|a| a.2).collect::<Vec<_>>())
    .bind(&no_text)
    .bind(&no_text)
    .bind(seen)
    .execute(pool)
    .await
    .unwrap();
}
