//! Two payload types registered under one task type stop every worker in
//! the binary from starting. (A test binary of its own, since the duplicate
//! is visible to every worker built in the same binary.)

use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, Worker, outbox_task};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

mod billing {
    use super::*;

    #[derive(Serialize, Deserialize)]
    #[outbox_task(task_type = "invoice.send", queue = "dup")]
    pub(crate) struct SendInvoice {}
}

mod mailing {
    use super::*;

    #[derive(Serialize, Deserialize)]
    #[outbox_task(task_type = "invoice.send", queue = "dup")]
    pub(crate) struct SendInvoice {}
}

struct H;

impl TaskHandler<billing::SendInvoice> for H {
    async fn handle(&self, _ctx: TaskContext, _task: billing::SendInvoice) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

#[tokio::test]
async fn a_task_type_registered_twice_is_refused_naming_both_types() {
    let pool = PgPoolOptions::new()
        .connect_lazy("postgres://nobody@127.0.0.1:1/none")
        .unwrap();
    let err = Worker::builder(pool)
        .handler::<billing::SendInvoice>(H)
        .build()
        .err()
        .expect("refused");
    let outbox::Error::Startup(problems) = err else {
        panic!("{err:?}")
    };
    assert_eq!(problems.0.len(), 1, "{problems:?}");
    let p = &problems.0[0];
    assert!(
        p.contains("task type \"invoice.send\" is registered 2 times"),
        "{p}"
    );
    assert!(
        p.contains("billing::SendInvoice") && p.contains("mailing::SendInvoice"),
        "{p}"
    );
}
