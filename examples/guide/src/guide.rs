//! docs/guide.md, sections 2 to 7.

use std::error::Error;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

// Section 2: a task type and its handler.
use outbox::{outbox_task, HandlerResult, Outcome, TaskContext, TaskHandler};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "report.generate", queue = "reports", priority = 3,
              retry_delays = ["30s", "5m", "1h"])]
struct GenerateReport { from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc> }

/// Stands for the application's own storage client.
#[derive(Clone, Default)]
pub struct MyStorageClient;

async fn build_report(
    pool: &PgPool,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT $1::timestamptz < $2::timestamptz")
        .bind(from)
        .bind(to)
        .execute(pool)
        .await?;
    Ok(())
}

struct Reports { pool: sqlx::PgPool, storage: MyStorageClient }

impl TaskHandler<GenerateReport> for Reports {
    async fn handle(&self, ctx: TaskContext, task: GenerateReport) -> HandlerResult {
        // ctx.id(), ctx.attempt(), ctx.max_attempts(), ctx.task_type(),
        // ctx.cancellation() (fires at shutdown, timeout, cancel), ctx.pool()
        let _ = (ctx.id(), &self.storage);
        build_report(&self.pool, task.from, task.to).await?;   // any error: retry
        Ok(Outcome::Success)
    }
}

impl Reports {
    /// The handler, on `pool`.
    pub(crate) fn new(pool: PgPool) -> Self {
        Self { pool, storage: MyStorageClient }
    }
}

/// A report's result.
#[derive(Serialize, Deserialize)]
pub struct ReportReady {
    /// Rows in the report.
    pub rows: u64,
    /// Where it is.
    pub url: String,
}

async fn finish_report(rows: u64, url: String) -> HandlerResult {
    Outcome::success_with(&ReportReady { rows, url })   // an oversized result fails the attempt
}

/// Reading a result back.
pub async fn read_result(pool: PgPool, id: outbox::TaskId) -> Result<(), Box<dyn Error>> {
// Elsewhere, by task id (None until the task completed):
let ready: Option<ReportReady> = outbox::result(&mut *pool.acquire().await?, id).await?;
    let _ = ready;
    Ok(())
}

/// Ship an order (section 2, transactional completion).
#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "order.ship", queue = "orders")]
pub struct ShipOrder {
    /// The order.
    pub order_id: i64,
}

/// The step after shipping.
#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "customer.notify", queue = "orders")]
pub struct NotifyCustomer {
    /// The order.
    pub order_id: i64,
}

struct Shipping;

impl TaskHandler<ShipOrder> for Shipping {
    async fn handle(&self, ctx: TaskContext, task: ShipOrder) -> HandlerResult {
let mut tx = ctx.pool().begin().await?;
sqlx::query("UPDATE orders SET shipped = true WHERE id = $1").bind(task.order_id)
    .execute(&mut *tx).await?;
outbox::submit(&mut tx, NotifyCustomer { order_id: task.order_id }).await?;   // the next step
ctx.complete_in(&mut tx).await?;   // fenced: Error::NotHeld if this attempt lost the task
tx.commit().await?;
Ok(Outcome::Success)
    }
}

// Section 3: submitting.

/// An order, as the application stores it.
pub struct Order {
    /// Who placed it.
    pub email: String,
}

/// The task that follows an order.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[outbox_task(task_type = "order.created", queue = "orders")]
pub struct OrderCreated {
    /// The order.
    pub order_id: i64,
}

/// A task the tests of section 9 expect not to see.
#[derive(Debug, Serialize, Deserialize)]
#[outbox_task(task_type = "refund.issued", queue = "orders")]
pub struct RefundIssued {
    /// The order refunded.
    pub order_id: i64,
}

async fn insert_order(conn: &mut PgConnection, order: &Order) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO orders (email) VALUES ($1) RETURNING id")
        .bind(&order.email)
        .fetch_one(conn)
        .await
}

/// Submit in the order's transaction.
pub async fn submit_with_the_order(pool: PgPool, order: Order) -> Result<(), Box<dyn Error>> {
let mut tx = pool.begin().await?;
let order_id = insert_order(&mut tx, &order).await?;
outbox::submit(&mut tx, OrderCreated { order_id }).await?;
tx.commit().await?;
    Ok(())
}

/// Options.
pub async fn submit_with_options(pool: PgPool, task: OrderCreated) -> Result<(), Box<dyn Error>> {
    let mut tx = pool.begin().await?;
use outbox::TaskOptions;
use std::time::Duration;

outbox::submit_with(&mut tx, task, TaskOptions::new()
    .delay(Duration::from_secs(300))      // or .run_at(chrono::Utc::now() + ...)
    .priority(1)                          // 0 first .. 9 last
    .queue("reports-bulk")).await?;       // instead of the type's queue
    tx.commit().await?;
    Ok(())
}

/// An invoice to send.
#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "invoice.send", queue = "billing")]
pub struct SendInvoice {
    /// The invoice.
    pub id: i64,
}

/// An invoice, as the application stores it.
pub struct Invoice {
    /// Its id.
    pub id: i64,
}

/// Batches.
pub async fn submit_batches(
    pool: PgPool,
    invoices: Vec<Invoice>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<(), Box<dyn Error>> {
    use outbox::TaskOptions;
    let mut tx = pool.begin().await?;
outbox::submit_batch(&mut tx, invoices.iter().map(|i| SendInvoice { id: i.id })).await?;

let mut batch = outbox::Batch::new();         // mixed types and options
batch.push(&SendInvoice { id: 1 })?;
batch.push_with(&GenerateReport { from, to }, TaskOptions::new().priority(5))?;
let ids = batch.submit(&mut tx).await?;       // ids in push order
    assert_eq!(ids.len(), 2);
    tx.commit().await?;
    Ok(())
}

// Section 3: unique tasks.
#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "invoice.remind", unique_by = ["invoice_id"], unique_period = "1d")]
struct RemindInvoice { invoice_id: i64, attempt_note: String }

/// A task unique per user and hour.
#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "user.sync", queue = "sync")]
pub struct SyncUser {
    /// The user.
    pub user_id: i64,
}

/// Unique submits.
pub async fn submit_unique(pool: PgPool, user_id: i64) -> Result<(), Box<dyn Error>> {
    use outbox::{TaskOptions, Unique};
    use std::time::Duration;
    let mut tx = pool.begin().await?;
    let reminder = RemindInvoice { invoice_id: 7, attempt_note: String::new() };
    let sync = SyncUser { user_id };
let done = outbox::submit_detailed(&mut tx, reminder, TaskOptions::new()).await?;
if done.duplicate { /* a reminder for this invoice is already queued today */ }

// Or per submit, whatever the type declares:
let options = TaskOptions::new().unique(Unique::key(format!("user-{user_id}"))
    .per(Duration::from_secs(3600))   // at most one per hour
    .including_completed());          // also while a completed one is kept
outbox::submit_with(&mut tx, sync, options).await?;   // the existing id if a duplicate
    tx.commit().await?;
    Ok(())
}

// Section 4: a retry table of its own.
#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "webhook.deliver", retry_delays = ["10s", "1m", "10m", "1h", "6h"])]
struct DeliverWebhook { url: String, body: String }

/// Section 6: periodic tasks.
pub fn periodic_tasks(
    pool: PgPool,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<outbox::WorkerBuilder, Box<dyn Error>> {
use outbox::periodic::{MissedTicks, PeriodicTask};

let nightly = PeriodicTask::new("nightly-report", "CRON_TZ=Europe/Paris 0 3 * * *",
                                &GenerateReport { from, to })?;
let sweep = PeriodicTask::new("sweep", "every 30s", &SendInvoice { id: 0 })?
    .missed_ticks(MissedTicks::Skip);       // after downtime, wait for the next tick
let builder = outbox::Worker::builder(pool).periodic(nightly).periodic(sweep);
    Ok(builder)
}

/// Section 5: cancel, inspect and retry from code.
pub async fn cancel_from_code(pool: PgPool, id: outbox::TaskId) -> Result<(), Box<dyn Error>> {
    use outbox::TaskId;
use outbox::admin;

let cancelled: Vec<TaskId> = admin::cancel_tasks(&pool, &[id]).await?;   // those cancelled or told to stop
let task = admin::get_task(&pool, id).await?;                             // Option<TaskRecord>: .state, .retry_count, .last_error
let retried: Vec<TaskId> = admin::retry_tasks(&pool, &[id]).await?;       // due now, fresh attempt budget
    let _ = (cancelled, task, retried);
    Ok(())
}

/// Section 6: a worker embedded in a service.
pub async fn embedded_worker(pool: PgPool) -> Result<(), Box<dyn Error>> {
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;
use outbox::{Worker, WorkerConfig};

let token = CancellationToken::new();
tokio::spawn(outbox_worker::stop_on_signal(token.clone()));   // SIGTERM/SIGINT: graceful; a second one exits
let worker = Worker::builder(pool.clone())
    .config(WorkerConfig { maintenance_interval: Duration::from_secs(1), ..WorkerConfig::default() })
    .queue("orders", 16)                                       // at most 16 orders tasks at once
    .queue("reports", 2)
    .handler::<OrderCreated>(DeliverOrderCreated::new(webhook_url()))
    .handler::<GenerateReport>(Reports::new(pool))
    .build()?;
worker.run(token).await?;
    Ok(())
}

// Section 6's handlers.

/// Delivers `order.created` to a webhook.
pub struct DeliverOrderCreated {
    url: String,
}

impl DeliverOrderCreated {
    /// A deliverer posting to `url`.
    pub fn new(url: String) -> Self {
        Self { url }
    }
}

impl TaskHandler<OrderCreated> for DeliverOrderCreated {
    async fn handle(&self, ctx: TaskContext, task: OrderCreated) -> HandlerResult {
        tracing_free_log(&self.url, ctx.id().0, task.order_id);
        Ok(Outcome::Success)
    }
}

fn tracing_free_log(url: &str, id: i64, order_id: i64) {
    let _ = (url, id, order_id);
}

/// Where webhooks go, from the application's settings.
pub fn webhook_url() -> String {
    "https://hooks.example.com/orders".to_owned()
}

/// Section 6: a worker binary's whole `main` (here in a module, so that it
/// sees this module's private task types).
mod worker_binary {
    use super::{DeliverOrderCreated, GenerateReport, OrderCreated, Reports, webhook_url};

fn main() -> std::process::ExitCode {
    let webhook = webhook_url();                  // your own settings, read once
    outbox_worker::main_with(move |w: outbox::WorkerBuilder| {
        let pool = w.pool().clone();              // the pool --database-url opened
        w.handler::<OrderCreated>(DeliverOrderCreated::new(webhook.clone()))
         .handler::<GenerateReport>(Reports::new(pool))
    })
}
}

// Section 7: ordering keys.
#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "ledger.apply", ordering_key = "account_id")]
struct ApplyEntry { account_id: i64, amount_cents: i64 }

/// Ordered submits.
pub async fn submit_ordered(pool: PgPool, account_id: i64) -> Result<(), Box<dyn Error>> {
    use outbox::TaskOptions;
    let mut tx = pool.begin().await?;
    let entry = ApplyEntry { account_id, amount_cents: 100 };
// Or per submit, whatever the type declares:
let options = TaskOptions::new().ordering_key(format!("account-{account_id}"));
outbox::submit_with(&mut tx, entry, options).await?;
    tx.commit().await?;
    Ok(())
}

/// Section 7: queue settings from code.
pub async fn queue_settings(pool: PgPool) -> Result<(), Box<dyn Error>> {
use outbox::admin::{self, QueueChange};

admin::set_queue(&pool, "mail", &QueueChange::new().global_concurrency(5).rate_per_second(50.0)).await?;
admin::set_queue(&pool, "ledger", &QueueChange::new().per_key_concurrency(2)).await?;
admin::set_queue(&pool, "mail", &QueueChange::new().no_global_concurrency().no_rate_limit()).await?;
admin::pause_queue(&pool, "mail").await?;
admin::resume_queue(&pool, "mail").await?;
let queues: Vec<admin::QueueSettings> = admin::list_queues(&pool).await?;
    let _ = queues;
    Ok(())
}
