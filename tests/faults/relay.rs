//! A relay through its database's faults: PostgreSQL restarted, then down
//! for three seconds, and the relay's sessions terminated again and again,
//! while emitters write (a tenth of them rolling back, a seventh delayed,
//! which holds their aggregates back until they are due). Every event whose
//! commit was acknowledged is published, each aggregate in order; none
//! rolled back is.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::Worker;
use outbox::events::{Event, emit};
use outbox::relay::Relay;
use outbox_tests::sinks::Capture;
use outbox_worker::local_postgres::LocalPostgres;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::restart::{on, private_cluster};

const EVENTS: usize = 3000;
const AGGREGATES: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_through_a_restart_an_outage_and_terminated_sessions_loses_nothing() {
    let (cluster, url) = private_cluster().await;
    let pool = outbox_tests::TestDb::pool_on(&url, 10).await;
    outbox::migrate(&pool).await.unwrap();
    let sink = Capture::default();
    let worker = Worker::builder(pool.clone())
        .relay(
            Relay::new("faults", sink.clone())
                .partitions(2)
                // Small batches: in the backlogs the faults leave they are
                // full, and each is published while the next is read, so
                // reads ahead meet the restart and the terminations too.
                .batch(50)
                .poll_interval(Duration::from_millis(5))
                .lease(Duration::from_secs(2)),
        )
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    // Emitters: commits acknowledged, rollbacks, and the uncertain (a
    // commit whose answer was lost), kept apart.
    let committed = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let rolled_back = Arc::new(Mutex::new(HashSet::<String>::new()));
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let pool = pool.clone();
        let (committed, rolled_back) = (Arc::clone(&committed), Arc::clone(&rolled_back));
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut done = 0;
            while done < EVENTS / 4 {
                n += 1;
                let agg = ((n * 7 + w * 13) % AGGREGATES).to_string();
                let attempt = async {
                    let mut tx = pool.begin().await?;
                    let event =
                        Event::new("account", agg.clone(), "moved", json!({"w": w, "n": n}));
                    // Held back with the events behind it until due: the
                    // parked list is written and tried again through the
                    // faults too.
                    let event = if n % 7 == 3 {
                        event.delay(Duration::from_millis(300))
                    } else {
                        event
                    };
                    let e = emit(&mut tx, event).await.map_err(|e| match e {
                        outbox::Error::Database(e) => e,
                        other => panic!("{other}"),
                    })?;
                    Ok::<_, sqlx::Error>((tx, e.id))
                }
                .await;
                let Ok((tx, id)) = attempt else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                if n.is_multiple_of(10) {
                    if tx.rollback().await.is_ok() {
                        rolled_back.lock().unwrap().insert(id);
                    }
                    continue;
                }
                if tx.commit().await.is_ok() {
                    committed.lock().unwrap().push((id, agg));
                    done += 1;
                }
            }
        }));
    }

    let published = |sink: &Capture| sink.got.lock().unwrap().len();
    let wait_for = |at: usize| {
        let sink = sink.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            while published(&sink) < at {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never {at} published"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for(500).await;
    on(&cluster, LocalPostgres::restart).await;
    eprintln!(
        "relay faults: PostgreSQL restarted at {} published",
        published(&sink)
    );
    wait_for(1200).await;
    on(&cluster, LocalPostgres::stop_server).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    on(&cluster, LocalPostgres::start_again).await;
    eprintln!(
        "relay faults: PostgreSQL down 3 s at {} published",
        published(&sink)
    );
    let admin = outbox_tests::TestDb::pool_on(&url, 2).await;
    for round in 0..5 {
        wait_for(1500 + round * 250).await;
        let terminated: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name LIKE $1 AND pid <> pg_backend_pid()) t",
        )
        .bind(format!("{} %", outbox::ENGINE_APPLICATION_NAME))
        .fetch_one(&admin)
        .await
        .expect("terminate the relay's sessions");
        eprintln!("relay faults: {terminated} engine sessions terminated (round {round})");
    }
    for w in writers {
        w.await.unwrap();
    }
    let committed = committed.lock().unwrap().clone();
    let rolled_back = rolled_back.lock().unwrap().clone();
    let want: HashSet<&str> = committed.iter().map(|(id, _)| id.as_str()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let seen: HashSet<String> = sink.messages().iter().map(|m| m.event_id.clone()).collect();
        if want.iter().all(|id| seen.contains(*id)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} committed events published",
            want.iter().filter(|id| seen.contains(**id)).count(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.unwrap().unwrap();
    let got = sink.messages();
    let mut firsts: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut seen = HashSet::new();
    for m in &got {
        assert!(
            !rolled_back.contains(&m.event_id),
            "rolled-back {} published",
            m.event_id
        );
        if seen.insert(m.event_id.as_str()) {
            firsts
                .entry(m.aggregate_id.as_str())
                .or_default()
                .push(m.sequence);
        }
    }
    for (agg, seqs) in &firsts {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "aggregate {agg} out of order: {seqs:?}"
        );
    }
    eprintln!(
        "relay faults: {} committed, {} rolled back, {} messages, {} duplicates",
        committed.len(),
        rolled_back.len(),
        got.len(),
        got.len() - seen.len()
    );
}

/// An emitter whose database connection is black-holed while it holds its
/// aggregate's lock (a fault proxy forwards nothing, sockets open): the
/// aggregate's next emitter waits, then goes on once the server ends the
/// silent session (here its idle-in-transaction timeout, 5 s), and the
/// silent transaction's event, never committed, is never published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emitter_black_holed_holding_its_aggregates_lock_delays_it_and_publishes_nothing() {
    let db = outbox_tests::TestDb::migrated().await;
    let (proxy, proxied) = outbox_tests::proxy::FaultProxy::start(&db.url).await;
    let sink = Capture::default();
    let worker = Worker::builder(db.pool.clone())
        .relay(Relay::new("faults", sink.clone()).poll_interval(Duration::from_millis(5)))
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    let mut silent = <sqlx::PgConnection as sqlx::Connection>::connect(&proxied)
        .await
        .unwrap();
    sqlx::raw_sql("SET idle_in_transaction_session_timeout = '5s'; BEGIN")
        .execute(&mut silent)
        .await
        .unwrap();
    let lost = emit(
        &mut silent,
        Event::new("account", "a", "moved", json!({"from": "silent"})),
    )
    .await
    .unwrap();
    proxy.blackhole();

    // The next emitter of the aggregate waits for the silent one's lock.
    let started = std::time::Instant::now();
    let mut tx = db.pool.begin().await.unwrap();
    let kept = emit(
        &mut tx,
        Event::new("account", "a", "moved", json!({"from": "second"})),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "the second emitter did not wait for the silent one's lock ({waited:?})"
    );
    // Emitted after the silent transaction ended: a read that finds it
    // has settled the silent event's position too.
    let after = emit(
        &mut *db.conn().await,
        Event::new("account", "b", "moved", json!({})),
    )
    .await
    .unwrap();
    let got = sink
        .wait_until("the committed events", |g| {
            [&kept.id, &after.id]
                .iter()
                .all(|id| g.iter().any(|m| &&m.event_id == id))
        })
        .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    eprintln!(
        "emitter black-holed: the aggregate's next emitter waited {waited:?}; {} published",
        got.len()
    );
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(|m| m.event_id != lost.id));
    drop(silent);
}
