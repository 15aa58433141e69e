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
    let Some(mut redis) = Redis::start().await else {
        return;
    };
    scenario::run("redis", &mut redis).await;
}
