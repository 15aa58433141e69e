//! docs/guide.md, section 13: workflows and sagas.

use std::error::Error;

use outbox::{outbox_task, HandlerResult, Outcome, TaskContext, TaskHandler};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "export.extract")]
struct Extract { table: String }

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "export.load")]
struct Load { table: String }

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "export.announce")]
struct Announce {}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "shop.charge")]
struct Charge { order_id: i64, cents: i64 }

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "shop.refund")]
struct Refund { order_id: i64 }

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "shop.reserve")]
struct Reserve { order_id: i64, sku: String, quantity: i64 }

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "shop.release")]
struct Release { order_id: i64 }

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "shop.ship")]
struct Ship { order_id: i64 }

async fn submit_a_workflow(pool: &PgPool) -> Result<(), Box<dyn Error + Send + Sync>> {
use outbox::Workflow;

let mut export = Workflow::new("nightly-export");
// A group: two steps that depend on nothing run in parallel.
export.add("orders", &Extract { table: "orders".into() })?
      .add("customers", &Extract { table: "customers".into() })?
      // A chord: runs once both completed.
      .add_after("load", &["orders", "customers"], &Load { table: "warehouse".into() })?
      // A chain: one after the other.
      .add_after("announce", &["load"], &Announce {})?;
let mut tx = pool.begin().await?;
let id = export.submit(&mut tx).await?;
tx.commit().await?;
println!("workflow {id} submitted");
Ok(())
}

struct Loader;

impl TaskHandler<Load> for Loader {
    async fn handle(&self, ctx: TaskContext, task: Load) -> HandlerResult {
        // What each dependency returned with Outcome::success_with, by name.
        let extracted: Vec<(String, Option<u64>)> = ctx.parent_results().await?;
        let rows: u64 = extracted.iter().filter_map(|(_, rows)| *rows).sum();
        println!("loading {rows} rows into {}", task.table);
        Outcome::success_with(&rows)
    }
}

fn a_saga(order_id: i64) -> Result<outbox::Workflow, outbox::Error> {
use outbox::Workflow;

let mut saga = Workflow::new("checkout");
saga.add("charge", &Charge { order_id, cents: 1999 })?
    .compensate("charge", &Refund { order_id })?
    .add_after("reserve", &["charge"], &Reserve { order_id, sku: "lamp".into(), quantity: 2 })?
    .compensate("reserve", &Release { order_id })?
    .add_after("ship", &["reserve"], &Ship { order_id })?;
Ok(saga)
}

fn policies() -> Result<outbox::Workflow, outbox::Error> {
use outbox::{OnParentDead, Step, TaskOptions, Workflow};
use std::time::Duration;

let mut w = Workflow::new("report");
w.add("extract", &Extract { table: "orders".into() })?
 .add_step("announce", &Announce {}, Step::new()
     .after(["extract"])
     .on_parent_dead(OnParentDead::Run)
     .options(TaskOptions::new().queue("mail").delay(Duration::from_secs(60))))?;
Ok(w)
}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "user.onboard")]
struct Onboard { user_id: i64 }

async fn create_account(user_id: i64) -> Result<i64, std::io::Error> { Ok(user_id) }
async fn send_tips(account: i64) -> Result<(), std::io::Error> { let _ = account; Ok(()) }

struct Onboarding;

impl TaskHandler<Onboard> for Onboarding {
    async fn handle(&self, ctx: TaskContext, task: Onboard) -> HandlerResult {
        // Runs once: a later attempt gets the recorded account id back.
        let account: i64 = ctx.step("create-account", || create_account(task.user_id)).await?;
        // Frees the worker's slot; the task runs again in a day.
        ctx.sleep("wait-a-day", std::time::Duration::from_secs(24 * 3600)).await?;
        ctx.step("send-tips", || send_tips(account)).await?;
        Ok(Outcome::Success)
    }
}
