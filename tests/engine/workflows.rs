//! Workflows: chains, groups and chords of real tasks run by real workers,
//! what a dead step does to the rest, sagas that compensate, an operator's
//! retry that resumes, and two completions racing for one chord.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::workflow::{WorkflowStatus, workflow_status};
use outbox::{
    HandlerError, HandlerResult, OnParentDead, Outcome, Step, TaskContext, TaskHandler, TaskId,
    Worker, Workflow, WorkflowId, outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// One step's work: returns `value` plus its parents' results (and the
/// result of step `read`, if set); fails if its label is in the failing
/// set. One attempt: a failure is a death.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.wf.work", queue = "wf", retry_delays = ["1h"])]
struct Work {
    label: String,
    value: i64,
    read: Option<String>,
}

fn work(label: &str, value: i64) -> Work {
    Work {
        label: label.to_owned(),
        value,
        read: None,
    }
}

#[derive(Default)]
struct Shared {
    /// "label@step" per attempt, in the order they started.
    log: Mutex<Vec<String>>,
    failing: Mutex<HashSet<String>>,
}

impl Shared {
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn labels(&self) -> Vec<String> {
        self.log()
            .into_iter()
            .map(|l| l.split('@').next().unwrap().to_owned())
            .collect()
    }

    fn fail(&self, label: &str, yes: bool) {
        let mut failing = self.failing.lock().unwrap();
        if yes {
            failing.insert(label.to_owned());
        } else {
            failing.remove(label);
        }
    }
}

#[derive(Clone)]
struct Worker_(Arc<Shared>);

impl TaskHandler<Work> for Worker_ {
    async fn handle(&self, ctx: TaskContext, task: Work) -> HandlerResult {
        let step = ctx.workflow().await?.map(|(_, step)| step);
        self.0.log.lock().unwrap().push(format!(
            "{}@{}",
            task.label,
            step.as_deref().unwrap_or("-")
        ));
        if self.0.failing.lock().unwrap().contains(&task.label) {
            return Err(HandlerError::msg(format!("{} refused", task.label)));
        }
        let parents = ctx.parent_results::<i64>().await?;
        let mut total = task.value + parents.iter().filter_map(|(_, v)| *v).sum::<i64>();
        if let Some(read) = &task.read {
            total += ctx.step_result::<i64>(read).await?.unwrap_or(0);
        }
        Outcome::success_with(&total)
    }
}

fn start(db: &TestDb, shared: &Arc<Shared>) -> RunningWorker {
    RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Work>(Worker_(shared.clone()))
            .build()
            .unwrap(),
    )
}

async fn submit(db: &TestDb, workflow: Workflow) -> WorkflowId {
    let mut tx = db.pool.begin().await.unwrap();
    let id = workflow.submit(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// Waits (60 s at most) until workflow `id` is in `state` with no open
/// step, and returns it.
pub(crate) async fn wait_state(pool: &PgPool, id: WorkflowId, state: &str) -> WorkflowStatus {
    wait_for(pool, id, &format!("state {state}"), |status| {
        status.workflow.state == state && status.workflow.open_steps == 0
    })
    .await
}

/// Waits (60 s at most) until workflow `id` is as `done` says (`what` for
/// the message), and returns it.
async fn wait_for(
    pool: &PgPool,
    id: WorkflowId,
    what: &str,
    done: impl Fn(&WorkflowStatus) -> bool,
) -> WorkflowStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = workflow_status(pool, id).await.unwrap().expect("workflow");
        if done(&status) {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workflow {id} never reached {what}: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn step_states(status: &WorkflowStatus) -> Vec<(String, String)> {
    status
        .step_list
        .iter()
        .map(|s| (s.name.clone(), s.state.clone()))
        .collect()
}

fn result_of(status: &WorkflowStatus, step: &str) -> Option<i64> {
    let s = status.step_list.iter().find(|s| s.name == step).unwrap();
    s.result.as_ref().map(|v| v.as_i64().unwrap())
}

pub(crate) fn task_of(status: &WorkflowStatus, step: &str) -> TaskId {
    status
        .step_list
        .iter()
        .find(|s| s.name == step)
        .and_then(|s| s.task_id)
        .unwrap_or_else(|| panic!("step {step} has no task: {status:#?}"))
}

pub(crate) fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[tokio::test]
async fn a_chain_runs_in_order_and_each_step_reads_results_typed() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    let mut w = Workflow::new("chain");
    // Added out of order on purpose: dependencies may come later.
    w.add_after(
        "c",
        &["b"],
        &Work {
            read: Some("a".to_owned()),
            ..work("c", 100)
        },
    )
    .unwrap()
    .add_after("b", &["a"], &work("b", 10))
    .unwrap()
    .add("a", &work("a", 1))
    .unwrap();
    let id = submit(&db, w).await;
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(tasks, 1, "only the root is a task before anything ran");

    let worker = start(&db, &shared);
    let status = wait_state(&db.pool, id, "completed").await;
    worker.stop().await;
    assert_eq!(shared.log(), ["a@a", "b@b", "c@c"]);
    assert_eq!(result_of(&status, "a"), Some(1));
    assert_eq!(result_of(&status, "b"), Some(11));
    // c: its own 100, its parent b's 11, and step a's 1 read by name.
    assert_eq!(result_of(&status, "c"), Some(112));
    assert_eq!(status.workflow.name, "chain");
    assert!(status.workflow.finished_at.is_some());
    let b = status.step_list.iter().find(|s| s.name == "b").unwrap();
    assert_eq!(b.after, ["a"]);
    // A completed step is not run again by an operator's retry: outside
    // its workflow it would miss its parents' results.
    let c = task_of(&status, "c");
    assert_eq!(
        outbox::admin::retry_tasks(&db.pool, &[c]).await.unwrap(),
        []
    );
    assert_eq!(
        outbox::admin::why_not_retried(&db.pool, &[c])
            .await
            .unwrap(),
        [(
            c,
            "a completed step of a workflow: run outside it, it would miss its parents".to_owned()
        )]
    );
}

#[tokio::test]
async fn a_group_fans_out_to_two_workers_and_its_chord_runs_once_after_all() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    let mut w = Workflow::new("sum");
    let names: Vec<String> = (0..200).map(|i| format!("part-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        w.add(name, &work("part", i as i64)).unwrap();
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    w.add_after("total", &refs, &work("total", 0)).unwrap();
    let id = submit(&db, w).await;

    let one = start(&db, &shared);
    let two = start(&db, &shared);
    let status = wait_state(&db.pool, id, "completed").await;
    one.stop().await;
    two.stop().await;
    assert_eq!(result_of(&status, "total"), Some((0..200).sum::<i64>()));
    let labels = shared.labels();
    assert_eq!(labels.iter().filter(|l| *l == "total").count(), 1);
    assert_eq!(labels.iter().filter(|l| *l == "part").count(), 200);
    assert_eq!(labels.last().map(String::as_str), Some("total"));
}

#[tokio::test]
async fn an_invalid_or_rolled_back_workflow_writes_nothing() {
    let db = TestDb::migrated().await;
    let mut cyclic = Workflow::new("cyclic");
    cyclic
        .add_after("a", &["b"], &work("a", 1))
        .unwrap()
        .add_after("b", &["a"], &work("b", 1))
        .unwrap();
    let err = cyclic.submit(&mut *db.conn().await).await.unwrap_err();
    assert!(
        matches!(&err, outbox::Error::InvalidWorkflow(r) if r.contains("cycle")),
        "{err}"
    );
    let mut unknown = Workflow::new("unknown");
    unknown.add_after("a", &["ghost"], &work("a", 1)).unwrap();
    let err = unknown.submit(&mut *db.conn().await).await.unwrap_err();
    assert!(err.to_string().contains("ghost"), "{err}");

    let mut fine = Workflow::new("rolled back");
    fine.add("a", &work("a", 1)).unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    fine.submit(&mut tx).await.unwrap();
    tx.rollback().await.unwrap();

    let (workflows, steps, tasks): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM outbox_workflows), (SELECT count(*) FROM outbox_workflow_steps), \
         (SELECT count(*) FROM outbox_tasks)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((workflows, steps, tasks), (0, 0, 0));
}

#[tokio::test]
async fn a_dead_step_cancels_skips_or_runs_its_dependents_and_a_retry_resumes() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    shared.fail("a", true);
    let mut w = Workflow::new("policies");
    w.add("a", &work("a", 1))
        .unwrap()
        .add_after("cancelled", &["a"], &work("cancelled", 1))
        .unwrap()
        .add_after(
            "after-cancelled",
            &["cancelled"],
            &work("after-cancelled", 1),
        )
        .unwrap()
        .add_step(
            "skipped",
            &work("skipped", 1),
            Step::new().after(["a"]).on_parent_dead(OnParentDead::Skip),
        )
        .unwrap()
        .add_after("after-skipped", &["skipped"], &work("after-skipped", 5))
        .unwrap()
        .add_step(
            "anyway",
            &work("anyway", 7),
            Step::new().after(["a"]).on_parent_dead(OnParentDead::Run),
        )
        .unwrap();
    let id = submit(&db, w).await;
    let worker = start(&db, &shared);
    let status = wait_state(&db.pool, id, "failed").await;
    assert_eq!(
        step_states(&status),
        pairs(&[
            ("a", "dead"),
            ("cancelled", "cancelled"),
            ("after-cancelled", "cancelled"),
            ("skipped", "skipped"),
            ("after-skipped", "completed"),
            ("anyway", "completed"),
        ])
    );
    // A skipped parent gives no result; a dead one neither.
    assert_eq!(result_of(&status, "after-skipped"), Some(5));
    assert_eq!(result_of(&status, "anyway"), Some(7));
    let a = status.step_list.iter().find(|s| s.name == "a").unwrap();
    assert_eq!(a.last_error.as_deref(), Some("a refused"));
    assert_eq!(a.task_state.as_deref(), Some("dead"), "as tasks show says");

    // A cancel of the workflow that had ended cancels nothing and leaves
    // no mark: the retry below still resumes it.
    let report = outbox::workflow::cancel(&db.pool, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.steps_cancelled, report.tasks_cancelled), (0, 0));
    let after = workflow_status(&db.pool, id).await.unwrap().unwrap();
    assert_eq!(after.workflow.cancelled_at, None);

    // The operator fixes the cause and retries the dead step: what its
    // death cancelled waits again and runs; nothing that ran runs twice.
    shared.fail("a", false);
    let retried = outbox::admin::retry_tasks(&db.pool, &[task_of(&status, "a")])
        .await
        .unwrap();
    assert_eq!(retried.len(), 1);
    let status = wait_state(&db.pool, id, "completed").await;
    worker.stop().await;
    assert_eq!(
        step_states(&status),
        pairs(&[
            ("a", "completed"),
            ("cancelled", "completed"),
            ("after-cancelled", "completed"),
            ("skipped", "skipped"),
            ("after-skipped", "completed"),
            ("anyway", "completed"),
        ])
    );
    assert_eq!(result_of(&status, "after-cancelled"), Some(3));
    let labels = shared.labels();
    for once in ["anyway", "after-skipped", "cancelled", "after-cancelled"] {
        assert_eq!(
            labels.iter().filter(|l| *l == once).count(),
            1,
            "{once}: {labels:?}"
        );
    }
    assert_eq!(labels.iter().filter(|l| *l == "a").count(), 2);
}

/// Waits (60 s at most) until step `step` of workflow `id` is in `state`,
/// and returns the workflow.
async fn wait_step(pool: &PgPool, id: WorkflowId, step: &str, state: &str) -> WorkflowStatus {
    let pair = (step.to_owned(), state.to_owned());
    wait_for(pool, id, &format!("step {step} {state}"), |status| {
        step_states(status).contains(&pair)
    })
    .await
}

fn state_of(status: &WorkflowStatus, step: &str) -> String {
    let s = status.step_list.iter().find(|s| s.name == step).unwrap();
    s.state.clone()
}

/// A step that stays open until the test makes its task due
/// ([`make_due`]).
fn held_open() -> Step {
    Step::new().options(outbox::TaskOptions::new().delay(Duration::from_secs(3600)))
}

/// Makes `task` due now.
async fn make_due(pool: &PgPool, task: outbox::TaskId) {
    sqlx::query("UPDATE outbox_tasks SET execute_at = now() WHERE id = $1")
        .bind(task.0)
        .execute(pool)
        .await
        .unwrap();
}

/// A child that runs anyway counts its parent's death once: when an
/// operator's retry of that parent completes, the child must not count it
/// again and run before its other parent.
#[tokio::test]
async fn a_retried_parent_that_completes_is_not_counted_twice_by_a_child_that_runs_anyway() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    shared.fail("a", true);
    let mut w = Workflow::new("counted-once");
    w.add("a", &work("a", 1))
        .unwrap()
        .add_step("hold", &work("hold", 2), held_open())
        .unwrap()
        .add_step(
            "anyway",
            &work("anyway", 4),
            Step::new()
                .after(["a", "hold"])
                .on_parent_dead(OnParentDead::Run),
        )
        .unwrap();
    let id = submit(&db, w).await;
    let worker = start(&db, &shared);
    let status = wait_step(&db.pool, id, "a", "dead").await;
    assert_eq!(state_of(&status, "anyway"), "waiting");

    shared.fail("a", false);
    outbox::admin::retry_tasks(&db.pool, &[task_of(&status, "a")])
        .await
        .unwrap();
    // a's completion and whatever it releases commit together.
    let status = wait_step(&db.pool, id, "a", "completed").await;
    assert_eq!(
        state_of(&status, "anyway"),
        "waiting",
        "a counted twice: {status:#?}"
    );
    // What `workflows show` prints: a completed step's task as completed,
    // a released one due later with when.
    let step = |name: &str| status.step_list.iter().find(|s| s.name == name).unwrap();
    assert_eq!(step("a").task_state.as_deref(), Some("completed"));
    assert!(
        step("hold").due_at.is_some_and(|d| d > chrono::Utc::now()),
        "{status:#?}"
    );

    make_due(&db.pool, task_of(&status, "hold")).await;
    let status = wait_state(&db.pool, id, "completed").await;
    worker.stop().await;
    assert_eq!(result_of(&status, "anyway"), Some(4 + 1 + 2));
    let labels = shared.labels();
    assert_eq!(
        labels.iter().filter(|l| *l == "anyway").count(),
        1,
        "{labels:?}"
    );
}

/// A child cancelled by its parent's death counts its own death into a
/// grandchild that runs anyway; when an operator's retry of the parent
/// revives the child and it completes, the grandchild must not count it a
/// second time: the child's death marked its edge to the grandchild
/// settled, and the revive leaves it so.
#[tokio::test]
async fn a_revived_child_that_completes_is_not_counted_twice_by_a_grandchild_that_runs_anyway() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    shared.fail("root", true);
    let mut w = Workflow::new("revived-child");
    w.add("root", &work("root", 1))
        .unwrap()
        .add_after("child", &["root"], &work("child", 2))
        .unwrap()
        .add_step("hold", &work("hold", 5), held_open())
        .unwrap()
        .add_step(
            "anyway",
            &work("anyway", 7),
            Step::new()
                .after(["child", "hold"])
                .on_parent_dead(OnParentDead::Run),
        )
        .unwrap();
    let id = submit(&db, w).await;
    let worker = start(&db, &shared);
    let status = wait_step(&db.pool, id, "child", "cancelled").await;
    assert_eq!(state_of(&status, "anyway"), "waiting");

    shared.fail("root", false);
    outbox::admin::retry_tasks(&db.pool, &[task_of(&status, "root")])
        .await
        .unwrap();
    let status = wait_step(&db.pool, id, "child", "completed").await;
    assert_eq!(
        state_of(&status, "anyway"),
        "waiting",
        "child counted twice: {status:#?}"
    );

    make_due(&db.pool, task_of(&status, "hold")).await;
    let status = wait_state(&db.pool, id, "completed").await;
    worker.stop().await;
    // root 1; child 2 + 1; hold 5; anyway 7 + 3 + 5.
    assert_eq!(result_of(&status, "anyway"), Some(15));
    let labels = shared.labels();
    assert_eq!(
        labels.iter().filter(|l| *l == "anyway").count(),
        1,
        "{labels:?}"
    );
}

/// Migration 21 moved each step's dependencies onto the step: a workflow
/// submitted before it finishes after it, its join reading both parents.
#[tokio::test]
async fn a_workflow_submitted_before_the_upgrade_to_parent_names_finishes_after_it() {
    let db = TestDb::empty().await;
    outbox::migrate_to(&db.pool, 20).await.unwrap();
    let mut w = Workflow::new("upgrade");
    w.add("root", &work("root", 1))
        .unwrap()
        .add_after("left", &["root"], &work("left", 2))
        .unwrap()
        .add_after("right", &["root"], &work("right", 3))
        .unwrap()
        .add_after("join", &["right", "left"], &work("join", 4))
        .unwrap();
    let id = submit(&db, w).await;
    outbox::migrate(&db.pool).await.unwrap();
    let shared = Arc::new(Shared::default());
    let worker = start(&db, &shared);
    let status = wait_state(&db.pool, id, "completed").await;
    worker.stop().await;
    // root 1; left 2 + 1; right 3 + 1; join 4 + 3 + 4.
    assert_eq!(result_of(&status, "join"), Some(11));
    let join = status.step_list.iter().find(|s| s.name == "join").unwrap();
    assert_eq!(join.after, ["left", "right"]);
}

/// A settle finds a completed step's edges by the primary key (workflow,
/// parent). Another index on the edges that starts with the workflow could
/// be taken for it by a planner whose statistics saw the table nearly
/// empty, and then every edge of a wide fan-in is read for each completion
/// (migration 21 says more): the edges keep their primary key alone.
#[tokio::test]
async fn the_workflow_edges_keep_their_primary_key_alone() {
    let db = TestDb::migrated().await;
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes
         WHERE schemaname = current_schema() AND tablename = 'outbox_workflow_edges'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(indexes, ["outbox_workflow_edges_pkey"]);
}

/// Index scans of `index` so far in this transaction.
async fn index_scans(tx: &mut sqlx::PgConnection, index: &str) -> i64 {
    sqlx::query_scalar("SELECT pg_stat_get_xact_numscans($1::regclass)")
        .bind(index)
        .fetch_one(&mut *tx)
        .await
        .unwrap()
}

/// The workflow tables analyzed while empty (the retention removed every
/// finished workflow, then autovacuum analyzed them) tell the planner they
/// hold one row. A settle, release or close that joined its list with
/// them then read the table once and the list again for every row:
/// quadratic (a 10,000-part workflow took 45 s to submit, migration 25).
/// Each lookup is now a probe of the primary key per row of the list,
/// whatever the statistics say: counted here as index scans, within one
/// transaction, for the release of 500 parts at submit, the settle of
/// their 500 completions, and the death of a parent of 500.
#[tokio::test]
async fn wide_workflows_are_settled_by_primary_key_under_statistics_of_empty_tables() {
    let db = TestDb::migrated().await;
    let wide = |name: &str, parts: usize| {
        let mut w = Workflow::new(name);
        let names: Vec<String> = (0..parts).map(|i| format!("part-{i}")).collect();
        for name in &names {
            w.add(name, &work("part", 1)).unwrap();
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        w.add_after("total", &refs, &work("total", 0)).unwrap();
        w
    };
    // Tables that held rows, emptied, then analyzed.
    for n in 0..3 {
        submit(&db, wide(&format!("gone-{n}"), 400)).await;
    }
    for statement in [
        // Autovacuum would truncate the emptied tables, and the planner
        // would then estimate their rows from their width.
        "ALTER TABLE outbox_workflow_steps SET (autovacuum_enabled = false)",
        "ALTER TABLE outbox_workflow_edges SET (autovacuum_enabled = false)",
        "ALTER TABLE outbox_workflows SET (autovacuum_enabled = false)",
        "DELETE FROM outbox_tasks",
        "DELETE FROM outbox_workflow_edges",
        "DELETE FROM outbox_workflow_steps",
        "DELETE FROM outbox_workflows",
        "ANALYZE outbox_tasks, outbox_workflow_edges, outbox_workflow_steps, outbox_workflows",
    ] {
        sqlx::query(statement).execute(&db.pool).await.unwrap();
    }
    let (tuples, pages): (f32, i32) = sqlx::query_as(
        "SELECT reltuples, relpages FROM pg_class WHERE oid = 'outbox_workflow_steps'::regclass",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(tuples == 0.0 && pages > 0, "{tuples} rows in {pages} pages");

    let mut tx = db.pool.begin().await.unwrap();
    let steps_before = index_scans(&mut tx, "outbox_workflow_steps_pkey").await;
    let id = wide("wide", 500).submit(&mut tx).await.unwrap();
    let steps_submit = index_scans(&mut tx, "outbox_workflow_steps_pkey").await;
    assert!(
        steps_submit - steps_before >= 500,
        "the release of 500 parts made {} index scans of the steps",
        steps_submit - steps_before
    );
    // The 500 parts complete in one statement, as an outcome batch does:
    // claimed, then moved out of outbox_tasks while running.
    sqlx::query(
        "UPDATE outbox_tasks
         SET state = 'processing', claimed_by = 'test', claims = 1,
             heartbeat_at = now(), attempted_at = now()
         WHERE workflow_id = $1",
    )
    .bind(id.0)
    .execute(&mut *tx)
    .await
    .unwrap();
    let edges_before = index_scans(&mut tx, "outbox_workflow_edges_pkey").await;
    let done = sqlx::query("DELETE FROM outbox_tasks WHERE workflow_id = $1")
        .bind(id.0)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(done.rows_affected(), 500);
    let edges = index_scans(&mut tx, "outbox_workflow_edges_pkey").await - edges_before;
    let steps = index_scans(&mut tx, "outbox_workflow_steps_pkey").await - steps_submit;
    assert!(
        edges >= 500,
        "the settle made {edges} index scans of the edges"
    );
    assert!(
        steps >= 500,
        "the close made {steps} index scans of the steps"
    );
    let total: (String, i64) = sqlx::query_as(
        "SELECT s.state, (SELECT count(*) FROM outbox_tasks AS t WHERE t.id = s.task_id)
         FROM outbox_workflow_steps AS s WHERE s.workflow_id = $1 AND s.name = 'total'",
    )
    .bind(id.0)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(total, ("released".to_owned(), 1));

    // A root with 500 children dies: its children, each looked up by the
    // primary key, are cancelled.
    let mut fan_out = Workflow::new("fan-out");
    fan_out.add("root", &work("root", 1)).unwrap();
    for i in 0..500 {
        fan_out
            .add_after(&format!("child-{i}"), &["root"], &work("child", 1))
            .unwrap();
    }
    let fan_out = fan_out.submit(&mut tx).await.unwrap();
    let before = index_scans(&mut tx, "outbox_workflow_steps_pkey").await;
    sqlx::query(
        "UPDATE outbox_tasks SET state = 'failed', dead_at = now(), last_error = 'refused'
         WHERE workflow_id = $1",
    )
    .bind(fan_out.0)
    .execute(&mut *tx)
    .await
    .unwrap();
    let steps = index_scans(&mut tx, "outbox_workflow_steps_pkey").await - before;
    assert!(
        steps >= 500,
        "the death's settle made {steps} index scans of the steps"
    );
    let cancelled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_workflow_steps
         WHERE workflow_id = $1 AND state = 'cancelled'",
    )
    .bind(fan_out.0)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(cancelled, 500);
    tx.rollback().await.unwrap();
}

/// A step's and a workflow's rows are rewritten by every settle that
/// touches them; those writes change no indexed column, and the tables'
/// pages keep room for the new versions (migration 24), so each is a HOT
/// update that writes no index entry. Counted within one transaction
/// (`pg_stat_xact_user_tables`), over enough workflows to fill many pages:
/// with pages filled to the brim most of these writes needed a new index
/// entry, and an index on a column the settle writes would need one for
/// every write.
#[tokio::test]
async fn settles_rewrite_workflow_rows_without_index_writes() {
    let db = TestDb::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..300 {
        let mut w = Workflow::new(format!("wide-{n}"));
        w.add("root", &work("root", 1)).unwrap();
        for i in 0..9 {
            w.add_after(&format!("part-{i}"), &["root"], &work("part", i))
                .unwrap();
        }
        ids.push(w.submit(&mut tx).await.unwrap().0);
    }
    let counts = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
                  WHERE relid = $1::regclass";
    let before_steps: (i64, i64) = sqlx::query_as(counts)
        .bind("outbox_workflow_steps")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let before_workflows: (i64, i64) = sqlx::query_as(counts)
        .bind("outbox_workflows")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    // The settle's writes: the parts counted down and released (their
    // first write since the submit), each workflow's open steps counted
    // down three times.
    sqlx::query(
        "UPDATE outbox_workflow_steps
         SET waiting_on = 0, state = 'released', task_id = -1
         WHERE workflow_id = ANY ($1) AND name <> 'root'",
    )
    .bind(&ids)
    .execute(&mut *tx)
    .await
    .unwrap();
    for _ in 0..3 {
        sqlx::query(
            "UPDATE outbox_workflows SET open_steps = open_steps - 1, updated_at = now()
             WHERE id = ANY ($1)",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    let steps: (i64, i64) = sqlx::query_as(counts)
        .bind("outbox_workflow_steps")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let workflows: (i64, i64) = sqlx::query_as(counts)
        .bind("outbox_workflows")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let (step_writes, step_hot) = (steps.0 - before_steps.0, steps.1 - before_steps.1);
    let (wf_writes, wf_hot) = (
        workflows.0 - before_workflows.0,
        workflows.1 - before_workflows.1,
    );
    assert_eq!((step_writes, wf_writes), (300 * 9, 300 * 3));
    // Within one transaction nothing is pruned: the room kept free is all
    // there is. Half a page holds a second version of most steps (a
    // released step is a few bytes longer); a fifth-full page, four
    // versions of each workflow.
    assert!(
        step_hot * 10 >= step_writes * 9,
        "{step_hot} of {step_writes} step writes were HOT"
    );
    assert_eq!(wf_hot, wf_writes, "workflow writes that were not HOT");
}

/// charge -> reserve -> ship, where charge and reserve declare
/// compensations.
fn checkout() -> Workflow {
    let mut w = Workflow::new("checkout");
    w.add("charge", &work("charge", 1))
        .unwrap()
        .compensate(
            "charge",
            &Work {
                read: Some("charge".to_owned()),
                ..work("refund", 0)
            },
        )
        .unwrap()
        .add_after("reserve", &["charge"], &work("reserve", 1))
        .unwrap()
        .compensate("reserve", &work("release", 0))
        .unwrap()
        .add_after("ship", &["reserve"], &work("ship", 1))
        .unwrap();
    w
}

#[tokio::test]
async fn a_saga_compensates_completed_steps_in_reverse_order_for_a_failure_at_every_step() {
    let db = TestDb::migrated().await;
    let cases: [(&str, &str, &[&str]); 3] = [
        ("charge", "failed", &["charge"]),
        ("reserve", "compensated", &["charge", "reserve", "refund"]),
        (
            "ship",
            "compensated",
            &["charge", "reserve", "ship", "release", "refund"],
        ),
    ];
    for (failing, end, ran) in cases {
        let shared = Arc::new(Shared::default());
        shared.fail(failing, true);
        let id = submit(&db, checkout()).await;
        let worker = start(&db, &shared);
        let status = wait_state(&db.pool, id, end).await;
        worker.stop().await;
        assert_eq!(shared.labels(), ran, "failing at {failing}");
        for step in &status.step_list {
            if let Some(undone) = &step.compensates {
                assert_eq!(step.state, "completed", "{failing}: {status:#?}");
                let original = status.step_list.iter().find(|s| &s.name == undone).unwrap();
                assert_eq!(original.state, "completed");
            }
        }
        if failing == "ship" {
            // The refund read the charge's result by name.
            assert_eq!(result_of(&status, "undo:charge"), Some(1));
            assert_eq!(
                status
                    .step_list
                    .iter()
                    .find(|s| s.name == "undo:charge")
                    .unwrap()
                    .after,
                ["undo:reserve"]
            );
        }
    }
}

/// A saga that compensated undid the steps before its dead one: retrying
/// that dead step would do its work again after the undo (charge after
/// the refund), so it is refused; its compensations stay retryable (the
/// next test).
#[tokio::test]
async fn a_dead_forward_step_of_a_compensated_saga_is_not_retried() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    shared.fail("reserve", true);
    let id = submit(&db, checkout()).await;
    let worker = start(&db, &shared);
    let status = wait_state(&db.pool, id, "compensated").await;
    worker.stop().await;
    shared.fail("reserve", false);
    let reserve = task_of(&status, "reserve");
    assert_eq!(
        outbox::admin::retry_tasks(&db.pool, &[reserve])
            .await
            .unwrap(),
        []
    );
    assert_eq!(outbox::admin::retry_dead(&db.pool, None).await.unwrap(), []);
    let row = outbox::admin::get_task(&db.pool, reserve)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, "dead", "{row:?}");
    let after = workflow_status(&db.pool, id).await.unwrap().unwrap();
    assert_eq!(after.workflow.state, "compensated");
    assert_eq!(step_states(&after), step_states(&status));
    assert_eq!(shared.labels(), ["charge", "reserve", "refund"]);
}

#[tokio::test]
async fn a_dead_compensation_fails_the_saga_until_an_operator_retries_it() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    shared.fail("ship", true);
    shared.fail("release", true);
    let id = submit(&db, checkout()).await;
    let worker = start(&db, &shared);
    let status = wait_state(&db.pool, id, "compensation_failed").await;
    assert_eq!(
        step_states(&status),
        pairs(&[
            ("charge", "completed"),
            ("reserve", "completed"),
            ("ship", "dead"),
            ("undo:reserve", "dead"),
            ("undo:charge", "cancelled"),
        ])
    );
    shared.fail("release", false);
    // The dead forward step is not retried while the saga compensates.
    assert_eq!(
        outbox::admin::retry_tasks(&db.pool, &[task_of(&status, "ship")])
            .await
            .unwrap(),
        []
    );
    let undo = task_of(&status, "undo:reserve");
    assert_eq!(
        outbox::admin::retry_tasks(&db.pool, &[undo]).await.unwrap(),
        [undo]
    );
    let status = wait_state(&db.pool, id, "compensated").await;
    worker.stop().await;
    assert_eq!(
        shared.labels(),
        ["charge", "reserve", "ship", "release", "release", "refund"]
    );
    assert_eq!(
        step_states(&status)[4],
        ("undo:charge".to_owned(), "completed".to_owned())
    );
}

/// A charge (refunded as its compensation), then a reservation on a queue
/// no worker serves, so that it stays released (pending) while the charge
/// completes.
fn held_checkout() -> Workflow {
    let mut w = Workflow::new("checkout");
    w.add("charge", &work("charge", 1))
        .unwrap()
        .compensate("charge", &work("refund", 0))
        .unwrap()
        .add_step(
            "reserve",
            &work("reserve", 1),
            Step::new()
                .after(["charge"])
                .options(outbox::TaskOptions::new().queue("wf-held")),
        )
        .unwrap();
    w
}

#[tokio::test]
async fn cancelling_a_saga_stops_what_waits_and_undoes_what_completed() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    let mut w = held_checkout();
    w.add_after("ship", &["reserve"], &work("ship", 1)).unwrap();
    let id = submit(&db, w).await;
    let mut worker = start(&db, &shared);
    worker
        .wait_for(outbox::TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;
    worker.stop().await;
    let status = workflow_status(&db.pool, id).await.unwrap().unwrap();
    assert_eq!(status.step_list[0].state, "completed");
    assert_eq!(status.step_list[1].state, "released");

    let report = outbox::workflow::cancel(&db.pool, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.steps_cancelled, report.tasks_cancelled), (1, 1));
    assert!(
        outbox::workflow::cancel(&db.pool, WorkflowId(id.0 + 1000))
            .await
            .unwrap()
            .is_none()
    );
    let worker = start(&db, &shared);
    let status = wait_state(&db.pool, id, "compensated").await;
    worker.stop().await;
    assert_eq!(
        step_states(&status),
        pairs(&[
            ("charge", "completed"),
            ("reserve", "dead"),
            ("ship", "cancelled"),
            ("undo:charge", "completed"),
        ])
    );
    assert_eq!(shared.labels(), ["charge", "refund"]);
}

/// An operator cancelled the workflow; a retry of one of its dead steps'
/// tasks is refused: run on its own, the step's effect would come back
/// outside the workflow (its record still saying dead), and a retry must
/// not undo an operator's cancel.
#[tokio::test]
async fn retrying_a_step_of_a_cancelled_workflow_is_refused() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    let mut w = Workflow::new("cancelled");
    w.add("a", &work("a", 1))
        .unwrap()
        .add_after("b", &["a"], &work("b", 1))
        .unwrap();
    let id = submit(&db, w).await;
    // No worker yet: a's task is pending, so the cancel kills it at once.
    let report = outbox::workflow::cancel(&db.pool, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.steps_cancelled, report.tasks_cancelled), (1, 1));
    let status = wait_state(&db.pool, id, "failed").await;
    let cancelled_at = status.workflow.cancelled_at;
    assert!(cancelled_at.is_some(), "{status:#?}");
    assert_eq!(
        step_states(&status),
        pairs(&[("a", "dead"), ("b", "cancelled")])
    );
    // Cancelled again, it keeps the moment of the first cancel.
    outbox::workflow::cancel(&db.pool, id)
        .await
        .unwrap()
        .unwrap();
    let again = workflow_status(&db.pool, id).await.unwrap().unwrap();
    assert_eq!(again.workflow.cancelled_at, cancelled_at);

    let a = task_of(&status, "a");
    assert_eq!(
        outbox::admin::retry_tasks(&db.pool, &[a]).await.unwrap(),
        []
    );
    assert_eq!(
        outbox::admin::why_not_retried(&db.pool, &[a])
            .await
            .unwrap(),
        [(
            a,
            format!("a forward step of workflow {id}, which is cancelled")
        )]
    );
    assert_eq!(
        outbox::admin::retry_dead(&db.pool, None).await.unwrap(),
        [],
        "nor is it retried with every dead task"
    );
    let row = outbox::admin::get_task(&db.pool, a).await.unwrap().unwrap();
    assert_eq!(row.state, "dead", "{row:?}");
    // Explained, the task names its workflow and step.
    let explained = outbox::admin::explain_task(&db.pool, a)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(explained.workflow, Some((id.0, "a".to_owned())));
    let status = workflow_status(&db.pool, id).await.unwrap().unwrap();
    assert_eq!(
        (status.workflow.state.as_str(), status.workflow.open_steps),
        ("failed", 0)
    );
    assert_eq!(
        step_states(&status),
        pairs(&[("a", "dead"), ("b", "cancelled")])
    );
    assert!(shared.log().is_empty());
}

/// A cancelled saga whose compensation died resumes its compensation when
/// an operator retries it: the cancel asked for the undo.
#[tokio::test]
async fn a_cancelled_sagas_dead_compensation_resumes_when_retried() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    shared.fail("refund", true);
    let id = submit(&db, held_checkout()).await;
    let mut worker = start(&db, &shared);
    worker
        .wait_for(outbox::TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;
    outbox::workflow::cancel(&db.pool, id)
        .await
        .unwrap()
        .unwrap();
    let status = wait_state(&db.pool, id, "compensation_failed").await;
    assert!(status.workflow.cancelled_at.is_some(), "{status:#?}");
    shared.fail("refund", false);
    outbox::admin::retry_tasks(&db.pool, &[task_of(&status, "undo:charge")])
        .await
        .unwrap();
    let status = wait_state(&db.pool, id, "compensated").await;
    worker.stop().await;
    assert_eq!(
        step_states(&status),
        pairs(&[
            ("charge", "completed"),
            ("reserve", "dead"),
            ("undo:charge", "completed"),
        ])
    );
    assert_eq!(shared.labels(), ["charge", "refund", "refund"]);
}

/// Two transactions complete a chord's last two children at the same
/// instant: the second waits for the first's lock on the workflow, sees
/// its completion, and only one of them releases the callback.
#[tokio::test]
async fn two_completions_of_a_chords_last_children_release_the_callback_once() {
    let db = TestDb::migrated().await;
    for round in 0..5 {
        let mut w = Workflow::new("race");
        w.add("left", &work("left", 1))
            .unwrap()
            .add("right", &work("right", 2))
            .unwrap()
            .add_after("callback", &["left", "right"], &work("callback", 0))
            .unwrap();
        let id = submit(&db, w).await;
        let status = workflow_status(&db.pool, id).await.unwrap().unwrap();
        let (left, right) = (task_of(&status, "left"), task_of(&status, "right"));
        // Claimed, as a worker would have them.
        sqlx::query(
            "UPDATE outbox_tasks SET state = 'processing', claims = 1, claimed_by = 'race', \
             heartbeat_at = now() WHERE id = ANY($1)",
        )
        .bind(vec![left.0, right.0])
        .execute(&db.pool)
        .await
        .unwrap();

        let complete = "DELETE FROM outbox_tasks WHERE id = $1";
        let mut first = db.pool.begin().await.unwrap();
        sqlx::query(complete)
            .bind(left.0)
            .execute(&mut *first)
            .await
            .unwrap();
        let pool = db.pool.clone();
        let second = tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(complete)
                .bind(right.0)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        });
        // The second completion is blocked on the workflow's row.
        outbox_tests::process::wait_until(
            &db.pool,
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND locktype = 'transactionid')",
            Duration::from_secs(30),
        )
        .await;
        first.commit().await.unwrap();
        second.await.unwrap();

        let callbacks: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_tasks WHERE workflow_id = $1 AND workflow_step = 'callback'",
        )
        .bind(id.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(callbacks, 1, "round {round}");
        let status = workflow_status(&db.pool, id).await.unwrap().unwrap();
        assert_eq!(status.workflow.open_steps, 1, "round {round}: {status:#?}");
    }
}

#[tokio::test]
async fn finished_workflows_leave_after_the_retention_and_running_ones_stay() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    let mut done = Workflow::new("done");
    done.add("a", &work("a", 1)).unwrap();
    let done = submit(&db, done).await;
    // A workflow whose root waits on a queue nobody serves stays running.
    let mut open = Workflow::new("open");
    open.add_step(
        "held",
        &work("held", 1),
        Step::new().options(outbox::TaskOptions::new().queue("wf-held")),
    )
    .unwrap();
    let open = submit(&db, open).await;
    let config = outbox::WorkerConfig {
        retention: Duration::ZERO,
        maintenance_interval: Duration::from_millis(100),
        cleanup_interval: Duration::from_millis(100),
        ..outbox::WorkerConfig::default()
    };
    let worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(config)
            .handler::<Work>(Worker_(shared.clone()))
            .build()
            .unwrap(),
    );
    outbox_tests::process::wait_until(
        &db.pool,
        &format!("SELECT NOT EXISTS (SELECT 1 FROM outbox_workflows WHERE id = {done})"),
        Duration::from_secs(60),
    )
    .await;
    worker.stop().await;
    let steps: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_workflow_steps WHERE workflow_id = $1")
            .bind(done.0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(steps, 0, "its steps went with it");
    let status = workflow_status(&db.pool, open).await.unwrap().unwrap();
    assert_eq!(status.workflow.state, "running");
}

/// Steps that share an ordering key and are released together run as one
/// key run, whose middle tasks are held in place without a write
/// (migration 56); each one's completion still counts for its workflow,
/// which completes (it would wait forever for a step deleted while
/// PENDING).
#[tokio::test]
async fn steps_of_one_key_completed_in_a_run_complete_their_workflow() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    let mut w = Workflow::new("keyed-run");
    for n in 1..=5 {
        w.add_step(
            &format!("s{n}"),
            &work(&format!("s{n}"), n),
            Step::new().options(outbox::TaskOptions::new().ordering_key("acct-9")),
        )
        .unwrap();
    }
    let id = submit(&db, w).await;
    let worker = Worker::builder(db.pool.clone())
        .handler::<Work>(Worker_(shared.clone()))
        .build()
        .unwrap();
    let counters = worker.counters();
    let running = RunningWorker::start(worker);
    let status = wait_state(&db.pool, id, "completed").await;
    running.stop().await;
    assert_eq!(status.workflow.open_steps, 0);
    assert!(
        counters.snapshot().tasks_run_on >= 3,
        "the steps ran as a run: {:?}",
        counters.snapshot()
    );
    assert_eq!(
        shared.labels(),
        vec!["s1", "s2", "s3", "s4", "s5"],
        "in key order"
    );
}

/// A step's task options apply from its release: a delay counts from then,
/// and an ordering key queues the step behind the key's other tasks.
#[tokio::test]
async fn a_steps_delay_counts_from_its_release_and_its_ordering_key_holds() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    // A task of key "acct-1" outside the workflow, submitted first: it
    // holds the key until it completes.
    outbox::submit_with(
        &mut *db.conn().await,
        work("holder", 1),
        outbox::TaskOptions::new().ordering_key("acct-1"),
    )
    .await
    .unwrap();
    let mut w = Workflow::new("options");
    w.add("first", &work("first", 1))
        .unwrap()
        .add_step(
            "later",
            &work("later", 2),
            Step::new()
                .after(["first"])
                .options(outbox::TaskOptions::new().delay(Duration::from_secs(1))),
        )
        .unwrap()
        .add_step(
            "keyed",
            &work("keyed", 3),
            Step::new()
                .after(["first"])
                .options(outbox::TaskOptions::new().ordering_key("acct-1")),
        )
        .unwrap();
    let id = submit(&db, w).await;
    let worker = start(&db, &shared);
    let status = wait_state(&db.pool, id, "completed").await;
    worker.stop().await;
    let labels = shared.labels();
    // The holder went first on its key (it was there before the step).
    let at = |l: &str| labels.iter().position(|x| x == l).unwrap();
    assert!(at("holder") < at("keyed"), "{labels:?}");
    // The step's task was created at its release; it became due a second
    // later and was not started before.
    let (released, started): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as(
            "SELECT h.created_at, h.attempted_at FROM outbox_workflow_steps l \
             JOIN outbox_task_history h ON h.id = l.task_id \
             WHERE l.workflow_id = $1 AND l.name = 'later'",
        )
        .bind(id.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let first_done: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "SELECT finished_at FROM outbox_workflow_steps WHERE workflow_id = $1 AND name = 'first'",
    )
    .bind(id.0)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        released <= first_done,
        "released by the first step's completion"
    );
    assert!(
        started - released >= chrono::Duration::milliseconds(1000),
        "the delayed step started {} ms after its release",
        (started - released).num_milliseconds()
    );
    assert_eq!(result_of(&status, "keyed"), Some(4));
}

/// A task that finished behind the triggers' back (here, statements run
/// with session_replication_role = replica, which skips triggers) leaves
/// its step released; maintenance's safety net settles it once the
/// workflow has been quiet, and the workflow goes on.
#[tokio::test]
async fn maintenance_settles_a_step_whose_task_finished_behind_the_triggers() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    let chain = |name: &str| {
        let mut w = Workflow::new(name);
        w.add("a", &work("a", 1))
            .unwrap()
            .add_after("b", &["a"], &work("b", 2))
            .unwrap();
        w
    };
    let completed = submit(&db, chain("completed behind")).await;
    let died = submit(&db, chain("died behind")).await;
    let task = |id: WorkflowId| {
        let pool = db.pool.clone();
        async move { task_of(&workflow_status(&pool, id).await.unwrap().unwrap(), "a") }
    };
    let (done_task, dead_task) = (task(completed).await, task(died).await);
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    // One completes (moved to the history), one dies, neither telling its
    // workflow; both workflows look quiet for an hour.
    sqlx::query(
        "WITH gone AS (DELETE FROM outbox_tasks WHERE id = $1 RETURNING *) \
         INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count, \
             max_attempts, claims, execute_at, created_at, finished_at, result) \
         SELECT id, task_type, queue, payload, priority, retry_count, max_attempts, 1, execute_at, \
             created_at, now(), '1'::jsonb FROM gone",
    )
    .bind(done_task.0)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox_tasks SET state = 'failed', dead_at = now(), last_error = 'lost' WHERE id = $1",
    )
    .bind(dead_task.0)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query("UPDATE outbox_workflows SET updated_at = now() - interval '1 hour'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let before = workflow_status(&db.pool, completed).await.unwrap().unwrap();
    assert_eq!(
        before.step_list[0].state, "released",
        "the triggers were bypassed"
    );

    let worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(outbox::WorkerConfig {
                maintenance_interval: Duration::from_millis(100),
                cleanup_interval: Duration::from_millis(100),
                ..outbox::WorkerConfig::default()
            })
            .handler::<Work>(Worker_(shared.clone()))
            .build()
            .unwrap(),
    );
    let status = wait_state(&db.pool, completed, "completed").await;
    assert_eq!(
        result_of(&status, "b"),
        Some(3),
        "b read a's result from the history"
    );
    let status = wait_state(&db.pool, died, "failed").await;
    worker.stop().await;
    assert_eq!(
        step_states(&status),
        pairs(&[("a", "dead"), ("b", "cancelled")])
    );
    assert_eq!(shared.labels(), ["b"], "only b ran, once");
}

/// Dead-task retention keeps a workflow's dead step while its workflow is
/// kept (the workflow reads a step whose row is gone as completed), and
/// deletes it like any dead task once the workflows' own retention has
/// deleted the workflow.
#[tokio::test]
async fn a_dead_step_outlives_dead_task_retention_while_its_workflow_is_kept() {
    let db = TestDb::migrated().await;
    let shared = Arc::new(Shared::default());
    shared.fail("a", true);
    shared.fail("plain", true);
    let mut w = Workflow::new("retained");
    w.add("a", &work("a", 1)).unwrap();
    let id = submit(&db, w).await;
    let plain = outbox::submit(&mut *db.conn().await, work("plain", 1))
        .await
        .unwrap();
    let worker = start(&db, &shared);
    let status = wait_state(&db.pool, id, "failed").await;
    let step = task_of(&status, "a");
    outbox_tests::process::wait_until(
        &db.pool,
        &format!(
            "SELECT dead_at IS NOT NULL FROM outbox_tasks WHERE id = {}",
            plain.0
        ),
        Duration::from_secs(60),
    )
    .await;
    worker.stop().await;
    sqlx::query(
        "UPDATE outbox_tasks SET dead_at = dead_at - interval '40 days' WHERE id = ANY($1)",
    )
    .bind(vec![step.0, plain.0])
    .execute(&db.pool)
    .await
    .unwrap();
    let retaining = |retention: Duration| {
        RunningWorker::start(
            Worker::builder(db.pool.clone())
                .config(outbox::WorkerConfig {
                    retention,
                    dead_retention: Some(Duration::from_secs(30 * 86_400)),
                    maintenance_interval: Duration::from_millis(100),
                    cleanup_interval: Duration::from_millis(100),
                    ..outbox::WorkerConfig::default()
                })
                .handler::<Work>(Worker_(shared.clone()))
                .build()
                .unwrap(),
        )
    };
    let gone = |id: outbox::TaskId| {
        format!(
            "SELECT NOT EXISTS (SELECT 1 FROM outbox_tasks WHERE id = {})",
            id.0
        )
    };
    // The plain dead task goes; the step, in the same statement's reach,
    // stays with its workflow.
    let worker = retaining(Duration::from_secs(7 * 86_400));
    outbox_tests::process::wait_until(&db.pool, &gone(plain), Duration::from_secs(60)).await;
    worker.stop().await;
    let kept: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox_tasks WHERE id = $1)")
        .bind(step.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        kept,
        "the dead step's task stays while its workflow is kept"
    );
    // The workflow deleted (a retention of zero), its dead step goes too.
    let worker = retaining(Duration::ZERO);
    outbox_tests::process::wait_until(
        &db.pool,
        &format!(
            "{} AND NOT EXISTS (SELECT 1 FROM outbox_workflows WHERE id = {})",
            gone(step),
            id.0
        ),
        Duration::from_secs(60),
    )
    .await;
    worker.stop().await;
}
