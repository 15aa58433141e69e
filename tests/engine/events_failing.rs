//! A broker that fails for now shows where the lag is: `events
//! subscriptions` (and the dashboard, which reads the same) say since when
//! the relay's publishes have failed and why, until one succeeds.

use std::time::{Duration, Instant};

use outbox::events::{Event, emit};
use outbox::relay::{Relay, Subscription};
use outbox_tests::TestDb;
use outbox_tests::sinks::Capture;
use serde_json::json;

use crate::events::RelayWorker;

/// Waits (at most a minute) until the subscription satisfies `done`.
async fn wait_subscription(
    pool: &sqlx::PgPool,
    what: &str,
    done: impl Fn(&Subscription) -> bool,
) -> Subscription {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sub = outbox::relay::subscriptions(pool)
            .await
            .expect("subscriptions")
            .into_iter()
            .next();
        if let Some(sub) = sub.filter(|s| done(s)) {
            return sub;
        }
        assert!(Instant::now() < deadline, "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_failing_broker_is_listed_with_its_reason_until_a_publish_succeeds() {
    let db = TestDb::migrated().await;
    emit(
        &mut *db.conn().await,
        Event::new("order", "1", "order.placed", json!({})),
    )
    .await
    .unwrap();
    let sink = Capture::default();
    *sink.transient.lock().unwrap() = u32::MAX;
    // A short lease: the relay's word of being alive, which carries what
    // it says of its broker, comes every quarter of it.
    let relay = Relay::new("capture", sink.clone()).lease(Duration::from_secs(2));
    let worker = RelayWorker::start(&db.pool, vec![relay]);
    let failing = wait_subscription(&db.pool, "listed as failing", |s| s.failing.is_some()).await;
    assert_eq!(failing.failing.as_deref(), Some("down: broker down"));
    assert_eq!(failing.published, 0);
    // Since the first failure: it grows over the relay's reports (a
    // report restarting the count at each failure would stay near 0).
    wait_subscription(&db.pool, "failing for 3 s", |s| {
        s.failing_s.is_some_and(|f| f >= 3.0)
    })
    .await;
    // The broker is back: published, and no longer listed as failing.
    *sink.transient.lock().unwrap() = 0;
    let back = wait_subscription(&db.pool, "published and not failing", |s| {
        s.published == 1 && s.failing.is_none()
    })
    .await;
    assert_eq!(back.failing_s, None);
    worker.stop().await;
    assert_eq!(sink.messages().len(), 1);
}

/// A sink that refuses aggregate `bad` before sending (as NATS refuses a
/// JetStream control header, Redis a header named payload).
struct Checking(Capture);

impl outbox::relay::Sink for Checking {
    fn kind(&self) -> &'static str {
        "checking"
    }

    fn check(&self, message: &outbox::relay::Message) -> Result<(), outbox::relay::PublishError> {
        match message.aggregate_id.as_str() {
            "bad" => Err(outbox::relay::PublishError::permanent(
                "checked",
                "the broker would misread it",
            )),
            _ => Ok(()),
        }
    }

    fn publish<'a>(
        &'a self,
        message: &'a outbox::relay::Message,
    ) -> outbox::relay::PublishFuture<'a> {
        self.0.publish(message)
    }
}

/// A refusal before sending parks the aggregate at once and never reaches
/// the broker, so it says nothing of the broker's health: with the broker
/// down, it is neither tried nor taken for an answer.
#[tokio::test]
async fn an_event_the_sink_refuses_before_sending_parks_without_a_publish() {
    let db = TestDb::migrated().await;
    emit(
        &mut *db.conn().await,
        Event::new("order", "bad", "order.placed", json!({})),
    )
    .await
    .unwrap();
    let sink = Capture::default();
    *sink.transient.lock().unwrap() = u32::MAX;
    let relay = Relay::new("checking", Checking(sink.clone())).lease(Duration::from_secs(2));
    let worker = RelayWorker::start(&db.pool, vec![relay]);
    let parked =
        crate::events::wait_parked(&db.pool, Some("checking"), "parked", |p| !p.is_empty()).await;
    let error = parked[0].error.clone().unwrap_or_default();
    assert!(
        error.starts_with("checking refused the event before sending it (checked)"),
        "{error}"
    );
    worker.stop().await;
    assert_eq!(*sink.transient.lock().unwrap(), u32::MAX, "never published");
    let sub = outbox::relay::subscriptions(&db.pool).await.unwrap()[0].clone();
    assert_eq!(
        (sub.refused_aggregates, sub.failing.as_deref()),
        (1, None),
        "{sub:?}"
    );
}
