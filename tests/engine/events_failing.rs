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
    assert!(failing.failing_s.is_some_and(|s| s >= 0.0), "{failing:?}");
    assert_eq!(failing.published, 0);
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
