//! The handler of `outbox.event` tasks: one per worker, holding the relay
//! of each queue it serves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;

use super::circuit::{Admit, Circuit};
use super::metrics as m;
use super::{Message, PublishError, Relay, Route, Sink};
use crate::events::{EventTask, derived_event_id, instance_id};
use crate::handler::{HandlerError, HandlerResult, Outcome, TaskContext, TaskHandler};

/// The longest a handler waits at an open circuit before it puts its event
/// back: short, so a worker asked to stop is not held by a broker outage.
const GATE_WAIT: Duration = Duration::from_secs(5);

/// One relay, running.
struct Running {
    name: Arc<str>,
    sink: Arc<dyn Sink>,
    route: Route,
    give_up_after: Option<i32>,
    publish_timeout: Duration,
    circuit: Circuit,
}

/// The relays of one worker, by queue.
pub(crate) struct RelayHandler {
    by_queue: BTreeMap<String, Running>,
    instance: OnceCell<[u8; 16]>,
}

impl RelayHandler {
    /// Runs `relays` (checked by the builder: valid, one per queue).
    pub(crate) fn new(relays: Vec<Relay>) -> Self {
        let by_queue = relays
            .into_iter()
            .filter_map(|r| {
                let route = r.route.ok()?;
                Some((
                    r.queue,
                    Running {
                        name: Arc::from(r.name),
                        sink: r.sink,
                        route,
                        give_up_after: r.give_up_after,
                        publish_timeout: r.publish_timeout,
                        circuit: Circuit::new(r.publish_timeout * 2),
                    },
                ))
            })
            .collect();
        Self {
            by_queue,
            instance: OnceCell::new(),
        }
    }

    async fn event_id(&self, ctx: &TaskContext, task: &EventTask) -> Result<String, HandlerError> {
        if let Some(id) = &task.id {
            // Checked and normalised at emit.
            return Ok(id.clone());
        }
        let instance = self
            .instance
            .get_or_try_init(|| async {
                let mut conn = ctx.pool().acquire().await?;
                instance_id(&mut conn).await
            })
            .await
            .map_err(|e| HandlerError::msg(format!("cannot read the instance id: {e}")))?;
        Ok(derived_event_id(instance, ctx.id().0))
    }
}

impl TaskHandler<EventTask> for RelayHandler {
    async fn handle(&self, ctx: TaskContext, task: EventTask) -> HandlerResult {
        let Some(relay) = self.by_queue.get(ctx.queue()) else {
            // Served queues are the relays' queues; this is an operator
            // moving an event by hand. Not this relay's to publish.
            return Ok(Outcome::RetryAfter(Duration::from_secs(60)));
        };
        if let Admit::Later(wait) = relay.circuit.admit(GATE_WAIT).await {
            return Ok(Outcome::RetryAfter(jittered(
                wait.max(Duration::from_millis(100)),
            )));
        }
        let event_id = match self.event_id(&ctx, &task).await {
            Ok(id) => id,
            // The instance id could not be read (the database is away for
            // a moment): transient, like a broker outage.
            Err(e) => {
                tracing::warn!(relay = %relay.name, task_id = %ctx.id(), error = %e, "no event id yet");
                return Ok(Outcome::RetryAfter(backoff(1)));
            }
        };
        let message = message(&relay.route, event_id, &ctx, task);
        let started = std::time::Instant::now();
        let result =
            match tokio::time::timeout(relay.publish_timeout, relay.sink.publish(&message)).await {
                Ok(result) => result,
                Err(_) => Err(PublishError::transient(
                    "timeout",
                    format!("no acknowledgement within {:?}", relay.publish_timeout),
                )),
            };
        let took = started.elapsed();
        match result {
            Ok(()) => {
                relay.circuit.success();
                m::circuit(&relay.name, false);
                m::published(&relay.name, took, message.created_at);
                Ok(Outcome::Success)
            }
            Err(PublishError::Transient {
                kind,
                reason,
                retry_after,
            }) => {
                let streak = relay.circuit.failure();
                m::circuit(&relay.name, relay.circuit.is_open());
                m::failed(&relay.name, "transient", kind);
                tracing::debug!(relay = %relay.name, task_id = %ctx.id(), kind, %reason, "publish failed for now");
                let backoff = backoff(streak).max(retry_after.unwrap_or_default());
                Ok(Outcome::RetryAfter(backoff))
            }
            Err(PublishError::Permanent { kind, reason }) => {
                // The broker answered: it is up.
                relay.circuit.success();
                m::failed(&relay.name, "permanent", kind);
                tracing::warn!(relay = %relay.name, task_id = %ctx.id(), kind, %reason, "the broker refused the event");
                let reason = format!("{} refused the event ({kind}): {reason}", relay.sink.kind());
                if relay.give_up_after.is_some_and(|n| ctx.attempt() >= n) {
                    Ok(Outcome::GiveUp(reason))
                } else {
                    Err(HandlerError::msg(reason))
                }
            }
        }
    }
}

/// The message of an event.
fn message(route: &Route, event_id: String, ctx: &TaskContext, task: EventTask) -> Message {
    let sequence = ctx.key_seq().unwrap_or(0);
    let created_at = ctx.created_at();
    let mut headers = vec![
        ("event-id".to_owned(), event_id.clone()),
        ("aggregate-type".to_owned(), task.aggregate_type.clone()),
        ("aggregate-id".to_owned(), task.aggregate_id.clone()),
        ("event-type".to_owned(), task.event_type.clone()),
        ("sequence".to_owned(), sequence.to_string()),
        (
            "created-at".to_owned(),
            created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        ),
    ];
    headers.extend(task.headers);
    Message {
        destination: route.destination(&task.aggregate_type, &task.event_type),
        event_id,
        aggregate_type: task.aggregate_type,
        aggregate_id: task.aggregate_id,
        event_type: task.event_type,
        payload: serde_json::to_vec(&task.payload).unwrap_or_default(),
        headers,
        sequence,
        created_at,
    }
}

/// The wait after the `streak`-th transient failure in a row: 100 ms
/// doubling to 30 s, with jitter so a fleet does not retry in step.
fn backoff(streak: u32) -> Duration {
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
}
