//! A sink for relay tests without a broker: it records what the relay
//! gave it, and fails as a test tells it to.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::relay::{Message, PublishError, PublishFuture, Sink};

/// A sink that records what it was given and fails as told.
#[derive(Clone, Default)]
pub struct Capture {
    /// What arrived, with when.
    pub got: Arc<Mutex<Vec<(Message, Instant)>>>,
    /// Transient failures still to give.
    pub transient: Arc<Mutex<u32>>,
    /// Aggregate ids refused for good.
    pub refuse: Arc<Mutex<Vec<String>>>,
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
            self.got
                .lock()
                .unwrap()
                .push((message.clone(), Instant::now()));
            Ok(())
        })
    }
}

impl Capture {
    /// What arrived, in order.
    pub fn messages(&self) -> Vec<Message> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Waits (at most a minute) until `done` holds of what arrived.
    pub async fn wait_until(&self, what: &str, done: impl Fn(&[Message]) -> bool) -> Vec<Message> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.messages();
            if done(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "never {what}: {} messages arrived",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
