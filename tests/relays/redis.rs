//! The relay against a real redis-server (Streams).

use std::time::Duration;

use outbox_tests::brokers::{self, BrokerProcess, Kind};

use crate::scenario::{self, Broker, CONCURRENCY, POISON_TYPE, Published};

struct Redis {
    server: BrokerProcess,
}

impl Redis {
    async fn start() -> Option<Self> {
        let server = brokers::start(Kind::Redis).await?;
        Some(Self { server })
    }

    fn url(&self) -> String {
        Kind::Redis.url(&self.server)
    }

    /// The test's own connection. redis-rs gives up on a reply after
    /// 500 ms and on a connection after 1 s by default: on a loaded CI
    /// machine, a page of 1,000 entries right after the broker's restart
    /// took longer (`XRANGE: timed out`). A test waits generously instead.
    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        let patient = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(60)))
            .set_response_timeout(Some(Duration::from_secs(60)));
        redis::Client::open(self.url())
            .expect("Redis URL")
            .get_multiplexed_async_connection_with_config(&patient)
            .await
            .expect("connect to Redis")
    }
}

impl Broker for Redis {
    fn relay_url(&self) -> String {
        format!("{}?concurrency={CONCURRENCY}&give_up_after=1", self.url())
    }

    async fn prepare_poison(&mut self) -> serde_json::Value {
        // The poison aggregate's stream key holds a string: XADD answers
        // WRONGTYPE, for good.
        let mut conn = self.conn().await;
        let _: () = redis::cmd("SET")
            .arg(format!("outbox.event.{POISON_TYPE}"))
            .arg("not a stream")
            .query_async(&mut conn)
            .await
            .expect("SET");
        serde_json::json!({ "poison": true })
    }

    async fn kill_and_restart(&mut self) {
        self.server.restart().await;
    }

    fn duplicates_bound(&self, _unacknowledged: usize) -> usize {
        // The script's dedup key: one copy, whatever was republished.
        0
    }

    async fn read_all(&mut self) -> Vec<Published> {
        let mut conn = self.conn().await;
        let mut out = Vec::new();
        // Pages of 1,000 after the last id read ("(" = exclusive).
        let mut from = "-".to_owned();
        loop {
            let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg("outbox.event.order")
                .arg(&from)
                .arg("+")
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .expect("XRANGE");
            let Some(last) = reply.ids.last() else { break };
            from = format!("({}", last.id);
            for entry in &reply.ids {
                let get = |name: &str| entry.get::<String>(name).unwrap_or_default();
                assert!(!get("payload").is_empty(), "the payload travels");
                assert!(!get("traceparent").is_empty(), "the traceparent travels");
                out.push(Published::from_headers(get));
            }
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_relay_survives_kills_restarts_and_poison() {
    let _turn = crate::heavy_turn().await;
    let Some(mut redis) = Redis::start().await else {
        return;
    };
    scenario::run("redis", &mut redis).await;
}

/// The count of `code` errors Redis has answered (`INFO errorstats`).
async fn errors_answered(conn: &mut redis::aio::MultiplexedConnection, code: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query_async(conn)
        .await
        .expect("INFO errorstats");
    let prefix = format!("errorstat_{code}:count=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().expect("an error count"))
}

/// A Redis out of memory refuses every add for a while: that is the
/// moment, not the event. The relay holds the events back and parks none
/// (with `give_up_after=1` one permanent refusal would park its
/// aggregate), and publishes them all, in order, once memory is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_parks_nothing_and_gets_every_event_later() {
    const EVENTS: usize = 20;
    let Some(redis) = Redis::start().await else {
        return;
    };
    let mut conn = redis.conn().await;
    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut conn)
            .await
            .expect("CONFIG SET");
    }
    let db = outbox_tests::TestDb::migrated().await;
    let mut emitter = db.conn().await;
    for i in 0..EVENTS {
        let event = outbox::Event::new("order", format!("o-{}", i % 2), "order.placed", i);
        outbox::emit(&mut emitter, event).await.expect("emit");
    }
    drop(emitter);
    let relay =
        outbox::relay::Relay::from_url("redis", &format!("{}?give_up_after=1", redis.url()))
            .await
            .expect("a relay from the URL")
            .poll_interval(Duration::from_millis(10));
    let worker = outbox::Worker::builder(db.pool.clone())
        .relay(relay)
        .build()
        .expect("a relay worker");
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    // Refused more than once: every try so far was the moment's, so
    // nothing is parked (a refusal for good parks at once).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        // Redis 7 counts the script's refusals as OOM; Redis 6, which
        // wraps them, as ERR (nothing else errs here).
        let tries =
            errors_answered(&mut conn, "OOM").await + errors_answered(&mut conn, "ERR").await;
        let sub = outbox::relay::subscriptions(&db.pool)
            .await
            .expect("subscriptions")
            .first()
            .cloned();
        if let Some(sub) = sub {
            assert_eq!((sub.published, sub.parked), (0, 0), "{sub:?}");
            if tries >= 4 {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the relay tried the full Redis {tries} times in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET maxmemory 0");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let sub = outbox::relay::subscriptions(&db.pool)
            .await
            .expect("subscriptions")[0]
            .clone();
        assert_eq!(sub.parked, 0, "{sub:?}");
        if sub.published >= EVENTS as i64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all published within 120 s of memory coming back: {sub:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.expect("worker task").expect("worker run");

    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("outbox.event.order")
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .expect("XRANGE");
    let mut seen: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    for entry in &reply.ids {
        let payload: String = entry.get("payload").expect("a payload");
        let i: usize = payload.parse().expect("the event's number");
        seen[i % 2].push(i);
    }
    for (aggregate, got) in seen.iter().enumerate() {
        let want: Vec<usize> = (aggregate..EVENTS).step_by(2).collect();
        assert_eq!(got, &want, "o-{aggregate}: each event once, in order");
    }
}
