//! Periodic tasks declared in code: ticks are enqueued by the maintenance
//! leader, and after downtime only the latest missed tick runs (or none).

use std::time::Duration;

use outbox::periodic::{MissedTicks, PeriodicTask};
use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, Worker, WorkerConfig, outbox_task};
use outbox_tests::process::wait_until;
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.periodic.sweep", queue = "periodic-tests")]
struct Sweep {
    area: String,
}

/// A type with an ordering key that lets it go on when dead, on a queue no
/// test's worker serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.periodic.ledger",
    queue = "periodic-keyed-tests",
    ordering_key = "account",
    on_dead = "skip"
)]
struct Ledger {
    account: String,
}

struct Sweeper;

impl TaskHandler<Sweep> for Sweeper {
    async fn handle(&self, _ctx: TaskContext, _task: Sweep) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

fn config() -> WorkerConfig {
    WorkerConfig {
        maintenance_interval: Duration::from_millis(100),
        ..WorkerConfig::default()
    }
}

/// A leader declaring `periodic` that serves none of their queues, so that
/// the ticks it enqueues stay to be looked at.
fn leader_only(db: &TestDb, periodic: impl IntoIterator<Item = PeriodicTask>) -> RunningWorker {
    let builder = Worker::builder(db.pool.clone())
        .config(config())
        .queue("elsewhere", 1)
        .handler::<Sweep>(Sweeper);
    let builder = periodic.into_iter().fold(builder, |b, p| b.periodic(p));
    RunningWorker::start(builder.build().unwrap())
}

#[tokio::test]
async fn a_periodic_task_is_enqueued_every_tick_with_its_payload() {
    let db = TestDb::migrated().await;
    let every = PeriodicTask::new(
        "sweep",
        "every 1s",
        &Sweep {
            area: "cache".into(),
        },
    )
    .unwrap();
    let worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(config())
            .handler::<Sweep>(Sweeper)
            .periodic(every)
            .build()
            .unwrap(),
    );
    wait_until(
        &db.pool,
        "SELECT count(*) >= 2 FROM outbox_all_tasks WHERE task_type = 'test.periodic.sweep' AND state = 'completed'",
        Duration::from_secs(20),
    )
    .await;
    worker.stop().await;
    let payloads: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT payload->>'area' FROM outbox_all_tasks WHERE task_type = 'test.periodic.sweep'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(payloads, vec!["cache".to_owned()]);
    let listed = outbox::periodic::list(&db.pool).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].schedule, "every 1s");
    assert!(listed[0].next_run > listed[0].last_run);
    // When the leader recorded the declaration, not when it last ticked.
    let first_tick: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "SELECT min(created_at) FROM outbox_all_tasks WHERE task_type = 'test.periodic.sweep'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        listed[0].declared_at <= first_tick,
        "declared at {} after the first tick's enqueue at {first_tick}",
        listed[0].declared_at
    );
}

/// Waits until the database clock is a minute or more from either end of
/// an hour, for the tests of an hourly schedule. In the last minute, the
/// leader enqueues the next hour's tick ahead and it would count. In the
/// first, this hour's tick is not missed but on time (a task that skips
/// missed ticks runs one a round or two late): a wait for "not the last
/// minute" that began in it ended at the top of the hour, and the skipping
/// task ran. A loaded machine can take many seconds over one test, so
/// the margin is a minute, not the round.
async fn away_from_the_hour(db: &TestDb) {
    wait_until(
        &db.pool,
        "SELECT now() - date_trunc('hour', now(), 'UTC') BETWEEN interval '1 minute' AND interval '59 minutes'",
        Duration::from_secs(150),
    )
    .await;
}

#[tokio::test]
async fn after_downtime_the_latest_missed_tick_runs_once_or_not_at_all() {
    let db = TestDb::migrated().await;
    let hourly = |name: &str, missed| {
        PeriodicTask::new(name, "every 1h", &Sweep { area: name.into() })
            .unwrap()
            .missed_ticks(missed)
    };
    away_from_the_hour(&db).await;
    // The cluster was down for three hours: both last ran then.
    for name in ["latest", "skip"] {
        sqlx::query(
            "INSERT INTO outbox_periodic (name, schedule, task_type, queue, payload, last_tick) \
             VALUES ($1, 'every 1h', 'test.periodic.sweep', 'periodic-tests', '{}', \
                     date_trunc('hour', now(), 'UTC') - interval '3 hours')",
        )
        .bind(name)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(config())
            .handler::<Sweep>(Sweeper)
            .periodic(hourly("latest", MissedTicks::RunLatest))
            .periodic(hourly("skip", MissedTicks::Skip))
            .build()
            .unwrap(),
    );
    wait_until(
        &db.pool,
        "SELECT bool_and(last_tick >= date_trunc('hour', now(), 'UTC')) FROM outbox_periodic",
        Duration::from_secs(20),
    )
    .await;
    worker.stop().await;
    let by_area: Vec<(String, i64)> = sqlx::query_as(
        "SELECT payload->>'area', count(*) FROM outbox_all_tasks GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        by_area,
        vec![("latest".to_owned(), 1)],
        "three missed ticks: one run, or none"
    );
    let latest: bool = sqlx::query_scalar(
        "SELECT bool_and(execute_at = date_trunc('hour', now(), 'UTC')) FROM outbox_all_tasks",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(latest, "the one that runs is the latest tick");
}

#[test]
fn bad_declarations_are_refused_with_the_reason() {
    let e = PeriodicTask::new(
        "x",
        "every",
        &Sweep {
            area: String::new(),
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("cron expression"), "{e}");
    let e = PeriodicTask::new(
        "has space",
        "every 1m",
        &Sweep {
            area: String::new(),
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("name"), "{e}");
}

/// A tick is the task a submit of its type would be: it carries the
/// type's ordering key (and `on_dead`), so it waits its turn behind the
/// key's other tasks like any other.
#[tokio::test]
async fn a_tick_of_a_keyed_type_carries_its_ordering_key() {
    let db = TestDb::migrated().await;
    let ledger = PeriodicTask::new(
        "close-books",
        "every 1s",
        &Ledger {
            account: "acct-9".into(),
        },
    )
    .unwrap();
    let worker = leader_only(&db, [ledger]);
    wait_until(
        &db.pool,
        "SELECT count(*) > 0 FROM outbox_tasks WHERE task_type = 'test.periodic.ledger'",
        Duration::from_secs(20),
    )
    .await;
    worker.stop().await;
    let ticks: Vec<(Option<String>, bool)> = sqlx::query_as(
        "SELECT ordering_key, skip_dead FROM outbox_tasks WHERE task_type = 'test.periodic.ledger'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(!ticks.is_empty());
    for tick in ticks {
        assert_eq!(tick, (Some("acct-9".to_owned()), true));
    }
}

/// A changed declaration whose old one missed nothing starts from now, as
/// a new one does: the new schedule's latest tick, already past, is not
/// taken for a missed one (it ran at once on the change).
#[tokio::test]
async fn a_changed_declaration_does_not_run_its_latest_past_tick() {
    let db = TestDb::migrated().await;
    away_from_the_hour(&db).await;
    // Hourly, its tick of this hour run and the next to come; now every
    // minute, whose latest tick (this minute's) is after that run.
    sqlx::query(
        "INSERT INTO outbox_periodic (name, schedule, task_type, queue, payload, last_tick, next_tick) \
         VALUES ('hourly', 'every 1h', 'test.periodic.sweep', 'periodic-tests', '{\"area\": \"old\"}', \
                 date_trunc('hour', now(), 'UTC'), date_trunc('hour', now(), 'UTC') + interval '1 hour')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let worker = leader_only(
        &db,
        [PeriodicTask::new("hourly", "every 1m", &Sweep { area: "new".into() }).unwrap()],
    );
    wait_until(
        &db.pool,
        "SELECT payload->>'area' = 'new' FROM outbox_periodic WHERE name = 'hourly'",
        Duration::from_secs(20),
    )
    .await;
    // The round that recorded the declaration enqueues what it would
    // before the next round renews the lease: wait for that renewal.
    let renewed: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT expires_at FROM outbox_leases WHERE name = 'maintenance'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now: chrono::DateTime<chrono::Utc> =
            sqlx::query_scalar("SELECT expires_at FROM outbox_leases WHERE name = 'maintenance'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        if now > renewed {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease was never renewed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await;
    // Ticks to come may be enqueued ahead; none before the change.
    let past: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks WHERE execute_at <= now() - interval '1 second'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(past, 0, "a tick from before the change was run");
}

/// What a leader enqueued ahead is taken back when it no longer applies:
/// ticks that came due while no leader ran (downtime), and future ticks of
/// a declaration that changed since. (No worker serves the queue here, so
/// nothing claims them first.)
#[tokio::test]
async fn ticks_enqueued_ahead_are_dropped_after_downtime_and_when_the_declaration_changes() {
    let db = TestDb::migrated().await;
    away_from_the_hour(&db).await;
    // "missed": ahead to two hours ago, then three hours of downtime.
    // "changed": a tick enqueued ahead for tomorrow under another payload.
    for (name, last_tick, payload) in [
        (
            "missed",
            "date_trunc('hour', now(), 'UTC') - interval '2 hours'",
            "{\"area\": \"missed\"}",
        ),
        (
            "changed",
            "date_trunc('hour', now(), 'UTC') + interval '1 day'",
            "{\"area\": \"old\"}",
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH p AS (INSERT INTO outbox_periodic (name, schedule, task_type, queue, payload, last_tick) \
                        VALUES ('{name}', 'every 1h', 'test.periodic.sweep', 'periodic-tests', \
                                '{payload}', {last_tick}) RETURNING last_tick) \
             INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, execute_at, \
                                       unique_key, unique_states) \
             SELECT 'test.periodic.sweep', 'periodic-tests', '{payload}', 10, last_tick, \
                    'periodic:{name}:' || extract(epoch FROM last_tick)::bigint, 31 FROM p"
        )))
        .execute(&db.pool)
        .await
        .unwrap();
    }
    // And a tick of "missed" enqueued when it came due, an hour before the
    // last one, still waiting in the queue's backlog: not a missed tick.
    sqlx::query(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, execute_at, \
                                   unique_key, unique_states) \
         SELECT 'test.periodic.sweep', 'periodic-tests', '{\"area\": \"backlog\"}', 10, \
                last_tick - interval '1 hour', \
                'periodic:missed:' || extract(epoch FROM last_tick - interval '1 hour')::bigint, 31 \
         FROM outbox_periodic WHERE name = 'missed'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let declare = |name: &str, area: &str| {
        PeriodicTask::new(name, "every 1h", &Sweep { area: area.into() }).unwrap()
    };
    let worker = leader_only(
        &db,
        [declare("missed", "missed"), declare("changed", "new")],
    );
    wait_until(
        &db.pool,
        "SELECT bool_and(last_tick = date_trunc('hour', now(), 'UTC')) FROM outbox_periodic",
        Duration::from_secs(20),
    )
    .await;
    worker.stop().await;
    let left: Vec<(String, bool)> = sqlx::query_as(
        "SELECT payload->>'area', execute_at = date_trunc('hour', now(), 'UTC') \
         FROM outbox_tasks ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        left,
        vec![("backlog".to_owned(), false), ("missed".to_owned(), true)],
        "the missed tick two hours ago and the old declaration's tick tomorrow are gone; \
         the latest missed tick is enqueued; the backlog's tick stays"
    );
}

/// A leader whose lease ran out and that took it back begins a leadership
/// again and declares its periodic tasks again: a declaration an operator
/// deleted meanwhile (`periodic delete`, which found no live leader) comes
/// back, and its ticks go on.
#[tokio::test]
async fn a_leader_that_takes_its_lease_back_declares_again() {
    let db = TestDb::migrated().await;
    let hourly = PeriodicTask::new("hourly", "every 1h", &Sweep { area: "all".into() }).unwrap();
    let worker = leader_only(&db, [hourly]);
    let recorded = "SELECT EXISTS (SELECT 1 FROM outbox_periodic WHERE name = 'hourly')";
    wait_until(&db.pool, recorded, Duration::from_secs(20)).await;
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("UPDATE outbox_leases SET expires_at = now() - interval '1 second'")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("DELETE FROM outbox_periodic WHERE name = 'hourly'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    wait_until(&db.pool, recorded, Duration::from_secs(20)).await;
    worker.stop().await;
}

/// `periodic delete` takes back the ticks a leader enqueued while the
/// delete waited for the record (the leader holds it as it enqueues), and
/// refuses nothing when no leader declares the task.
#[tokio::test]
async fn a_delete_takes_back_the_ticks_enqueued_while_it_waited() {
    let db = TestDb::migrated().await;
    sqlx::query(
        "INSERT INTO outbox_periodic (name, schedule, task_type, queue, payload) \
         VALUES ('gone', 'every 1s', 'test.periodic.sweep', 'periodic-tests', '{}')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // A leader enqueueing a tick ahead, as enqueue_periodic_ahead.sql does.
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox_periodic WHERE name = 'gone' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, execute_at, \
                                   unique_key, unique_states) \
         VALUES ('test.periodic.sweep', 'periodic-tests', '{}', 3, now() + interval '1 hour', \
                 'periodic:gone:' || extract(epoch FROM now() + interval '1 hour')::bigint, 31)",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let delete = tokio::spawn({
        let pool = db.pool.clone();
        async move { outbox::periodic::delete(&pool, "gone", false).await }
    });
    wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                        AND wait_event_type = 'Lock' \
                        AND query LIKE '%first statement of `periodic delete`%')",
        Duration::from_secs(30),
    )
    .await;
    tx.commit().await.unwrap();
    assert_eq!(
        delete.await.unwrap().unwrap(),
        outbox::periodic::PeriodicDeletion::Deleted { ticks: 1 }
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

/// What a worker that does not lead reads to tell whether the leader
/// declares its periodic tasks as it does (the statement itself, with
/// records as leaders leave them): only a record of the same declaration
/// made during the current leadership counts; a new leadership is not
/// judged yet, and without a leader there is nothing to judge.
#[tokio::test]
async fn a_follower_finds_the_periodic_tasks_the_leader_does_not_declare() {
    let db = TestDb::migrated().await;
    sqlx::raw_sql(
        "INSERT INTO outbox_periodic (name, schedule, task_type, queue, payload, updated_at) VALUES
             ('same', 'every 1s', 't', 'q', '{\"a\": 1}', now()),
             ('payload', 'every 1s', 't', 'q', '{\"a\": 2}', now()),
             ('stale', 'every 1s', 't', 'q', '{}', now() - interval '1 hour');",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let read = async |pool: &sqlx::PgPool| -> Option<(bool, Vec<String>)> {
        let names = ["same", "payload", "stale", "missing"];
        sqlx::query_as(include_str!(
            "../../outbox-core/src/db/sql/periodic_undeclared.sql"
        ))
        .bind(names)
        .bind(["every 1s"; 4])
        .bind(["t"; 4])
        .bind(["q"; 4])
        .bind([r#"{"a":1}"#, r#"{"a":1}"#, "{}", "{}"])
        .bind(10_000_000_i64)
        .fetch_optional(pool)
        .await
        .unwrap()
    };
    assert_eq!(read(&db.pool).await, None, "no leader");
    sqlx::query(
        "INSERT INTO outbox_leases (name, holder, acquired_at, expires_at)
         VALUES ('maintenance', 'leader', now() - interval '1 minute', now() + interval '1 minute')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let (settled, names) = read(&db.pool).await.expect("a leader");
    assert!(settled);
    assert_eq!(names, ["missing", "payload", "stale"]);
    sqlx::query("UPDATE outbox_leases SET acquired_at = now()")
        .execute(&db.pool)
        .await
        .unwrap();
    assert!(!read(&db.pool).await.expect("a leader").0, "not judged yet");
}
