//! Workflows through faults: a worker killed -9 with a group's steps in
//! flight, PostgreSQL restarted and stopped while a chord fans in, and a
//! saga's worker killed -9 in the middle of a compensation.
//! A step's release commits with its parent's completion, so neither can
//! leave a step released twice or never.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskHandler, Worker, Workflow, WorkflowId, outbox_task,
};
use outbox_tests::process::{WorkerProcess, wait_until};
use outbox_tests::tasks::{Record, create_executions_table};
use outbox_tests::{RunningWorker, TestDb};
use outbox_worker::local_postgres::LocalPostgres;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::WORKER;
use crate::kill::FAST_RECOVERY;
use crate::restart::{down_for, on, outage_config, private_cluster};

/// A group of `parts` steps, a chord over them, and a last step after it.
fn fan_in(parts: usize, part: &Record, callback: &Record) -> Workflow {
    let mut w = Workflow::new("fault");
    let names: Vec<String> = (0..parts).map(|i| format!("part-{i}")).collect();
    for name in &names {
        w.add(name, part).unwrap();
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    w.add_after("callback", &refs, callback)
        .unwrap()
        .add_after("last", &["callback"], &Record { ms: 1 })
        .unwrap();
    w
}

async fn workflow_state(pool: &PgPool, id: WorkflowId) -> (String, i32) {
    sqlx::query_as("SELECT state, open_steps FROM outbox_workflows WHERE id = $1")
        .bind(id.0)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_worker_killed_mid_group_leaves_the_workflow_to_finish_with_its_chord_run_once() {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    let id = fan_in(40, &Record { ms: 300 }, &Record { ms: 1 })
        .submit(&mut *db.conn().await)
        .await
        .unwrap();

    let mut first = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    let in_flight = first.kill_mid_flight(&db.pool, 8, 4).await;
    assert!(in_flight >= 1, "the kill caught steps in flight");
    let (state, open) = workflow_state(&db.pool, id).await;
    assert_eq!(state, "running");

    let mut second = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    wait_until(
        &db.pool,
        &format!("SELECT state = 'completed' FROM outbox_workflows WHERE id = {id}"),
        Duration::from_secs(90),
    )
    .await;
    assert!(second.is_running(), "{}", second.log());

    // Every step ran; the callback and the last step once each (they were
    // released after the kill); a part ran twice at most (cut short).
    let runs: Vec<(String, i64)> = sqlx::query_as(
        "SELECT s.name, count(e.task_id) FROM outbox_workflow_steps s \
         LEFT JOIN executions e ON e.task_id = s.task_id WHERE s.workflow_id = $1 \
         GROUP BY s.name",
    )
    .bind(id.0)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let repeated = runs.iter().filter(|(_, n)| *n > 1).count();
    eprintln!(
        "workflow kill -9: {open} steps open at the kill with {in_flight} in flight; \
         afterwards 42 of 42 steps completed, {repeated} parts ran twice"
    );
    assert_eq!(runs.len(), 42);
    for (name, n) in &runs {
        assert!(*n >= 1, "step {name} never ran");
        if name == "callback" || name == "last" {
            assert_eq!(*n, 1, "step {name}");
        }
    }
    assert!(repeated as i64 <= in_flight, "{runs:?}");
    let states: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM outbox_workflow_steps WHERE workflow_id = $1 GROUP BY 1",
    )
    .bind(id.0)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(states, vec![("completed".to_owned(), 42)]);
}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.workflow.fault.count", queue = "wf-restart")]
struct Part {
    callback: bool,
}

#[derive(Clone, Default)]
struct Counter {
    parts: Arc<AtomicUsize>,
    callbacks: Arc<AtomicUsize>,
}

impl TaskHandler<Part> for Counter {
    async fn handle(&self, ctx: TaskContext, task: Part) -> HandlerResult {
        if task.callback {
            let parents = ctx.parent_results::<u64>().await?;
            self.callbacks.fetch_add(1, Ordering::Relaxed);
            let total: u64 = parents.iter().filter_map(|(_, v)| *v).sum();
            return Outcome::success_with(&total);
        }
        self.parts.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(2)).await;
        Outcome::success_with(&1u64)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_and_an_outage_mid_fan_in_release_the_chord_once() {
    const PARTS: usize = 3000;
    let (cluster, url) = private_cluster().await;
    let pool = TestDb::pool_on(&url, 10).await;
    outbox::migrate(&pool).await.unwrap();
    let mut w = Workflow::new("restart");
    let names: Vec<String> = (0..PARTS).map(|i| format!("part-{i}")).collect();
    for name in &names {
        w.add(name, &Part { callback: false }).unwrap();
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    w.add_after("callback", &refs, &Part { callback: true })
        .unwrap();
    let id = w.submit(&mut pool.acquire().await.unwrap()).await.unwrap();

    let counter = Counter::default();
    let config = outage_config();
    let worker = RunningWorker::start(
        Worker::builder(pool.clone())
            .config(config)
            .handler::<Part>(counter.clone())
            .queue("wf-restart", 16)
            .build()
            .unwrap(),
    );
    let settled = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM outbox_workflow_steps WHERE workflow_id = $1 AND state = 'completed'",
        )
        .bind(id.0)
        .fetch_one(&pool)
        .await
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let (mut restarted, mut was_down) = (false, false);
    loop {
        let done = settled().await.unwrap_or(0);
        if done == PARTS as i64 + 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out with {done} of {} steps completed",
            PARTS + 1
        );
        if !restarted && done >= 600 {
            restarted = true;
            on(&cluster, LocalPostgres::restart).await;
            eprintln!("workflow restart: PostgreSQL restarted after {done} steps");
        } else if restarted && !was_down && done >= 1500 {
            was_down = true;
            down_for(&cluster, Duration::from_secs(3)).await;
            eprintln!("workflow restart: PostgreSQL down for 3 s after {done} steps");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await;
    let (state, open) = workflow_state(&pool, id).await;
    let total: i64 = sqlx::query_scalar(
        "SELECT h.result::text::bigint FROM outbox_workflow_steps s \
         JOIN outbox_task_history h ON h.id = s.task_id WHERE s.workflow_id = $1 AND s.name = 'callback'",
    )
    .bind(id.0)
    .fetch_one(&pool)
    .await
    .unwrap();
    let parts = counter.parts.load(Ordering::Relaxed);
    eprintln!(
        "workflow restart: {PARTS} parts and the chord completed through a restart and an outage; \
         {parts} part executions, {} callback executions, chord total {total}",
        counter.callbacks.load(Ordering::Relaxed)
    );
    assert_eq!((state.as_str(), open), ("completed", 0));
    assert_eq!(counter.callbacks.load(Ordering::Relaxed), 1);
    assert_eq!(total, PARTS as i64, "the chord saw every part's result");
    assert!(parts >= PARTS);
}

/// Runs of the steps of workflow `id` that compensate `step`.
async fn compensation_runs(pool: &PgPool, id: WorkflowId, step: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(e.task_id) FROM outbox_workflow_steps s \
         JOIN executions e ON e.task_id = s.task_id \
         WHERE s.workflow_id = $1 AND s.compensates = $2",
    )
    .bind(id.0)
    .bind(step)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_compensation_cut_short_by_a_kill_runs_again_and_none_runs_for_a_step_that_did_not_complete()
 {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    // a, then b, then c, which dies (four quick attempts), then d. Each
    // has a compensation; b's takes four seconds, long enough to be killed
    // in.
    let on_record = |after: &[&str]| {
        outbox::Step::new()
            .after(after)
            .options(outbox::TaskOptions::new().queue(outbox_tests::tasks::RECORD_QUEUE))
    };
    let mut w = Workflow::new("saga-fault");
    w.add_step("a", &Record { ms: 1 }, on_record(&[]))
        .unwrap()
        .compensate("a", &Record { ms: 10 })
        .unwrap()
        .add_step("b", &Record { ms: 1 }, on_record(&["a"]))
        .unwrap()
        .compensate("b", &Record { ms: 4000 })
        .unwrap()
        .add_step(
            "c",
            &outbox_worker::builtin::Fail {
                times: 100,
                message: "out of stock".to_owned(),
            },
            on_record(&["b"]),
        )
        .unwrap()
        .compensate("c", &Record { ms: 1 })
        .unwrap()
        .add_step("d", &Record { ms: 1 }, on_record(&["c"]))
        .unwrap()
        .compensate("d", &Record { ms: 1 })
        .unwrap();
    let id = w.submit(&mut *db.conn().await).await.unwrap();

    // Killed while b's compensation runs.
    let mut first = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    wait_until(
        &db.pool,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM outbox_workflow_steps s JOIN executions e \
             ON e.task_id = s.task_id WHERE s.workflow_id = {id} AND s.compensates = 'b')"
        ),
        Duration::from_secs(90),
    )
    .await;
    first.signal("KILL");
    first.wait(Duration::from_secs(30)).await;
    let cut_short: bool = sqlx::query_scalar(
        "SELECT t.state = 'processing' FROM outbox_workflow_steps s \
         JOIN outbox_tasks t ON t.id = s.task_id WHERE s.workflow_id = $1 AND s.compensates = 'b'",
    )
    .bind(id.0)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(cut_short, "the kill came while b's compensation ran");
    let undone_a_before = compensation_runs(&db.pool, id, "a").await;

    let mut second = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    wait_until(
        &db.pool,
        &format!("SELECT state = 'compensated' FROM outbox_workflows WHERE id = {id}"),
        Duration::from_secs(90),
    )
    .await;
    assert!(second.is_running(), "{}", second.log());
    let runs = [
        compensation_runs(&db.pool, id, "a").await,
        compensation_runs(&db.pool, id, "b").await,
        compensation_runs(&db.pool, id, "c").await,
        compensation_runs(&db.pool, id, "d").await,
    ];
    eprintln!(
        "saga kill -9: compensations run a {}, b {}, c {}, d {} (a {} before the kill)",
        runs[0], runs[1], runs[2], runs[3], undone_a_before
    );
    // b's compensation ran again after the kill, then a's (in reverse
    // order: none of a's started before b's ended); c died and d never
    // ran, so neither is compensated.
    assert_eq!(undone_a_before, 0, "a's compensation waited for b's");
    assert!(
        runs[1] >= 2,
        "b's compensation, cut short, ran again: {runs:?}"
    );
    assert!(runs[0] >= 1, "a's compensation ran: {runs:?}");
    assert_eq!((runs[2], runs[3]), (0, 0), "{runs:?}");
    let states: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, state FROM outbox_workflow_steps WHERE workflow_id = $1 \
         AND compensates IS NULL ORDER BY name",
    )
    .bind(id.0)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        [
            ("a", "completed"),
            ("b", "completed"),
            ("c", "dead"),
            ("d", "cancelled")
        ]
        .map(|(n, s)| (n.to_owned(), s.to_owned()))
    );
}
