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
}

#[tokio::test]
async fn after_downtime_the_latest_missed_tick_runs_once_or_not_at_all() {
    let db = TestDb::migrated().await;
    let hourly = |name: &str, missed| {
        PeriodicTask::new(name, "every 1h", &Sweep { area: name.into() })
            .unwrap()
            .missed_ticks(missed)
    };
    // The cluster was down for three hours: both last ran then.
    for name in ["latest", "skip"] {
        sqlx::query(
            "INSERT INTO outbox_periodic (name, schedule, task_type, queue, payload, last_tick) \
             VALUES ($1, 'every 1h', 'test.periodic.sweep', 'periodic-tests', '{}', \
                     date_trunc('hour', now()) - interval '3 hours')",
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
        "SELECT bool_and(last_tick = date_trunc('hour', now())) FROM outbox_periodic",
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
