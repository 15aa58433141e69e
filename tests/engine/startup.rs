//! A worker refuses to start, listing every problem.

use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, Worker, outbox_task};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.startup.handled", queue = "startup-tests")]
struct Handled {}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.startup.forgotten", queue = "startup-tests")]
struct Forgotten {}

/// On the `default` queue, as a type that names no queue is.
#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.startup.on_default")]
struct OnDefault {}

struct H;

impl TaskHandler<Handled> for H {
    async fn handle(&self, _ctx: TaskContext, _task: Handled) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

impl TaskHandler<OnDefault> for H {
    async fn handle(&self, _ctx: TaskContext, _task: OnDefault) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

/// A pool that never connects: validation needs no database.
fn lazy_pool() -> sqlx::PgPool {
    PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap()
}

fn problems(builder: outbox::WorkerBuilder) -> Vec<String> {
    match builder.build() {
        Ok(_) => panic!("the worker started despite its problems"),
        Err(outbox::Error::Startup(p)) => p.0,
        Err(other) => panic!("expected a start-up error, got {other:?}"),
    }
}

#[tokio::test]
async fn every_problem_is_listed_at_once() {
    let builder = Worker::builder(lazy_pool())
        .handler::<Handled>(H)
        .handler::<Handled>(H)
        .queue("startup-tests", 4)
        .queue("other", 0);
    let problems = problems(builder);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems
            .iter()
            .any(|p| p.contains("queue \"other\" has concurrency 0")),
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("\"test.startup.handled\" has two handlers")),
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("\"test.startup.forgotten\"")
                && p.contains("has no handler")
                && p.contains(".handler::<Forgotten>")),
        "{problems:#?}"
    );
    let shown = outbox::Error::Startup(outbox::StartupProblems(problems)).to_string();
    assert!(
        shown.starts_with("the worker cannot start:\n  - "),
        "{shown}"
    );
}

#[tokio::test]
async fn a_worker_with_nothing_to_do_refuses_to_start() {
    let problems = problems(Worker::builder(lazy_pool()));
    assert_eq!(problems.len(), 1);
    assert!(problems[0].contains("no queue to serve"), "{problems:?}");
}

#[tokio::test]
async fn types_on_queues_the_worker_does_not_serve_are_not_its_business() {
    // Forgotten is on startup-tests; a worker for another queue starts.
    let worker = Worker::builder(lazy_pool())
        .queue("somewhere-else", 2)
        .build()
        .unwrap();
    assert_eq!(worker.queues(), [("somewhere-else".to_owned(), 2)]);
}

/// A program that uses `outbox-worker` (its `stop_on_signal`, as the guide
/// shows) links the stock binary's diagnostic types, which run on
/// `default`: a worker of its own on `default` starts without their
/// handlers, where it was refused for each of them.
#[tokio::test]
async fn the_stock_binarys_diagnostic_types_need_no_handler_on_default() {
    let _linked = outbox_worker::stop_on_signal;
    let diagnostic: Vec<&str> = outbox::registered_tasks()
        .into_iter()
        .filter(|r| r.diagnostic)
        .map(|r| r.task_type)
        .collect();
    assert_eq!(
        diagnostic,
        ["outbox.fail", "outbox.noop", "outbox.sleep"],
        "linked here"
    );
    let worker = Worker::builder(lazy_pool())
        .handler::<OnDefault>(H)
        .build()
        .expect("no handler is asked for the diagnostic types");
    assert_eq!(worker.queues(), [("default".to_owned(), 10)]);
    // A type of the application's on a served queue still needs one.
    let problems = problems(Worker::builder(lazy_pool()).queue("startup-tests", 1));
    assert!(
        problems
            .iter()
            .any(|p| p.contains("test.startup.handled") && p.contains("has no handler")),
        "{problems:?}"
    );
}

#[tokio::test]
async fn settings_that_would_break_the_worker_are_listed_not_panicked_on() {
    let config = outbox::WorkerConfig {
        heartbeat_interval: std::time::Duration::ZERO,
        statement_timeout: std::time::Duration::ZERO,
        retention: std::time::Duration::MAX,
        dead_retention: Some(std::time::Duration::MAX),
        retry_jitter_percent: 101,
        ..outbox::WorkerConfig::default()
    };
    let problems = problems(
        Worker::builder(lazy_pool())
            .config(config)
            .queue("huge", outbox::MAX_CONCURRENCY + 1),
    );
    let expected = [
        "queue \"huge\" has concurrency 100001: use 1 to 100000",
        "heartbeat_interval must be longer than zero",
        "statement_timeout must be longer than zero",
        "retention:",
        "dead_retention:",
        "retry_jitter_percent is 101: use 0 to 100",
    ];
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    for needle in expected {
        assert!(
            problems.iter().any(|p| p.contains(needle)),
            "{needle}: {problems:#?}"
        );
    }
}
