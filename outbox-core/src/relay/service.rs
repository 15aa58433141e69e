//! A relay worker's share of one subscription: it says it is alive, takes
//! free partitions up to its fair share (the partitions over the live
//! members, rounded up), gives back what is over it, and runs each
//! partition it holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Relay;
use super::circuit::Circuit;
use super::metrics::Instruments;
use super::partition::{self, End, Env};
use super::publish::Running;
use crate::db::event_log;
use crate::db::session::{EnginePool, SessionLimits, call};
use crate::worker::outage::Outage;

/// A partition being run.
struct Held {
    task: JoinHandle<End>,
    /// Asks it to finish its batch and hand the lease back.
    give_back: CancellationToken,
}

/// Runs `relay` until `stop` (no new batch) and `abandon` (stop
/// publishing now; fires when the worker's shutdown grace is over).
pub(crate) async fn run(
    relay: Relay,
    pool: sqlx::PgPool,
    holder: String,
    limits: SessionLimits,
    stop: CancellationToken,
    abandon: CancellationToken,
) {
    let Ok(route) = relay.route.clone() else {
        return; // refused by the builder
    };
    // Two sessions per partition at work (a batch's read ahead beside its
    // lease renewal and cursor write) and one for membership, up to a
    // point: partitions beyond it wait for a session between statements.
    let sessions = (relay.partitions as usize).min(16) * 2 + 1;
    // The relay's statements are all index lookups and short range scans;
    // its batch read looks up a range of positions and its gaps by the
    // log's position index, which statistics gathered while the log was
    // empty or just filled could turn into a scan of the whole log. Its
    // sessions run nothing else. (No JIT: the cost that keeps scans off
    // would otherwise make every statement compile itself for a tenth of a
    // second.)
    let engine = EnginePool::new(&pool, &holder, limits, sessions).with_settings(&[
        ("enable_seqscan", "off"),
        ("max_parallel_workers_per_gather", "0"),
        ("jit", "off"),
    ]);
    let deadline = limits.deadline();
    let mut outage = Outage::new("relay");
    let (stream, partitions, created_at, sink) = loop {
        let subscribed = call(&engine, deadline, "relay subscribe", async |conn| {
            event_log::subscribe(
                conn,
                &relay.name,
                &relay.queue,
                relay.partitions,
                relay.start,
                relay.sink.kind(),
            )
            .await
        })
        .await;
        match subscribed {
            Ok(Some(recorded)) => break recorded,
            Ok(None) => continue,
            Err(error) => {
                let wait = outage.failed(&error);
                tokio::select! {
                    () = tokio::time::sleep(wait) => continue,
                    () = stop.cancelled() => return,
                }
            }
        }
    };
    outage.ok();
    if let Some(at) = created_at {
        tracing::info!(relay = %relay.name, start = ?relay.start, position = at,
            "subscription created: it publishes the events after this position");
        if let super::Start::Position(p) = relay.start
            && p - 1 > at
        {
            tracing::warn!(relay = %relay.name, asked = p, head = at,
                "the start position is past the log's head: the subscription starts at the head");
        }
    }
    if stream != relay.queue {
        // Publishing the recorded stream would send this sink events it was
        // not configured for; the CLI refuses at start (exit 2) instead.
        tracing::error!(relay = %relay.name, subscribed = %stream, configured = %relay.queue,
            "the subscription reads another stream than this relay names: the relay does not \
             run (give it the subscription's stream, or delete the subscription, losing its \
             place, with `outbox-worker events delete-subscription`)");
        return;
    }
    if let Some(sink) = sink.filter(|s| s != relay.sink.kind()) {
        // Its events would go to another broker than the one the
        // subscription's consumers read; the CLI refuses at start too.
        tracing::error!(relay = %relay.name, subscribed = %sink, configured = relay.sink.kind(),
            "the subscription publishes to another kind of sink than this relay: the relay does \
             not run (name this relay otherwise, or delete the subscription with `outbox-worker \
             events delete-subscription` and start the new one where the old one was)");
        return;
    }
    if partitions != relay.partitions {
        tracing::warn!(relay = %relay.name, partitions,
            "the subscription exists with this partition count, which it keeps \
             (a subscription's is set when it is created)");
    }
    if !relay.preflighted {
        tokio::select! {
            () = look_before_start(&relay, &route) => {}
            () = stop.cancelled() => return,
        }
    }
    let name: Arc<str> = Arc::from(relay.name.as_str());
    let env = Arc::new(Env {
        relay: Running {
            instruments: Instruments::new(&name),
            name,
            sink: relay.sink,
            route,
            give_up_after: relay.give_up_after.unwrap_or(1).max(1),
            publish_timeout: relay.publish_timeout,
            concurrency: relay.concurrency,
            circuit: Circuit::new(Arc::from(relay.name.as_str()), relay.publish_timeout * 2),
        },
        engine,
        deadline,
        subscription: relay.name.clone(),
        stream,
        partitions,
        holder: holder.clone(),
        batch: relay.batch,
        poll: relay.poll,
        lease_ttl: relay.lease,
    });
    tracing::info!(relay = %relay.name, partitions, "relay starting");
    let mut held: BTreeMap<i32, Held> = BTreeMap::new();
    let round = relay.lease / 4;
    loop {
        held.retain(|_, h| !h.task.is_finished());
        // A member says it is alive for one lease, four times a lease: a
        // dead one stops counting as its partitions' leases run out, so the
        // others' shares grow just as those partitions come free.
        let failing = env.relay.circuit.failing();
        let members = call(&env.engine, deadline, "relay member", async |conn| {
            event_log::member(
                conn,
                &env.subscription,
                &holder,
                env.ttl_us(),
                failing.clone(),
            )
            .await
        })
        .await;
        let wait = match members {
            Ok(members) => {
                outage.ok();
                let members = members.max(1);
                let share = (i64::from(partitions) + members - 1) / members;
                rebalance(&env, &mut held, share, &stop, &abandon, &mut outage).await
            }
            Err(error) => outage.failed(&error).min(round),
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => break,
        }
    }
    // Stop: every partition finishes its batch (or is abandoned when the
    // grace is over) and hands its lease back.
    for (_, h) in held {
        let _ = h.task.await;
    }
    // Gone now rather than when its word runs out: the others take its
    // share at once, and an operator may delete the subscription.
    let left = call(&env.engine, deadline, "relay leave", async |conn| {
        event_log::leave(conn, &env.subscription, &holder).await
    })
    .await;
    if let Err(error) = left {
        tracing::info!(relay = %env.relay.name, %error, "could not say the relay stopped; its word runs out by itself");
    }
    env.engine.close(Duration::from_millis(200)).await;
    tracing::info!(relay = %env.relay.name, "relay stopped");
}

/// Asks the sink whether what the relay publishes to exists
/// ([`super::Sink::preflight`]) and logs what it found. The relay runs
/// either way: a stream or exchange made later is used once it exists,
/// and an unreachable broker is an outage like any other.
async fn look_before_start(relay: &Relay, route: &super::Route) {
    match relay.sink.preflight(route).await {
        Ok(()) => {}
        Err(super::Preflight::Missing(why)) => tracing::error!(relay = %relay.name,
            "{why}; the relay runs, retrying each publish as for an outage, until it exists"),
        Err(super::Preflight::Unreachable(why)) => tracing::warn!(relay = %relay.name,
            "{why}; the relay starts, and retries as for any outage"),
    }
}

/// Takes partitions up to `share`, or gives back what is over it; returns
/// how long until the next round.
async fn rebalance(
    env: &Arc<Env>,
    held: &mut BTreeMap<i32, Held>,
    share: i64,
    stop: &CancellationToken,
    abandon: &CancellationToken,
    outage: &mut Outage,
) -> Duration {
    let round = env.lease_ttl / 4;
    let have = held.len() as i64;
    if have > share {
        // The highest partitions go: another worker arrived.
        for (_, h) in held.iter().rev().take((have - share) as usize) {
            h.give_back.cancel();
        }
        return round;
    }
    if have == share {
        return round;
    }
    // The new leases' clocks count from before the request: the database's
    // lease runs from its own now(), which is no earlier (lease_clock.rs).
    let sent = tokio::time::Instant::now();
    let acquired = call(&env.engine, env.deadline, "relay lease", async |conn| {
        event_log::acquire(
            conn,
            &env.subscription,
            &env.holder,
            env.ttl_us(),
            share - have,
        )
        .await
    })
    .await;
    match acquired {
        Ok(leases) => {
            for lease in leases {
                let give_back = stop.child_token();
                let task = tokio::spawn(partition::run(
                    Arc::clone(env),
                    lease.clone(),
                    sent,
                    give_back.clone(),
                    abandon.clone(),
                ));
                held.insert(lease.part, Held { task, give_back });
            }
            round
        }
        Err(error) => outage.failed(&error).min(round),
    }
}
