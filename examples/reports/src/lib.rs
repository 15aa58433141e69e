//! The report service: the API that accepts report requests and shows
//! their status, and the slow task that builds them.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use outbox::{
    HandlerError, HandlerResult, Outcome, TaskContext, TaskHandler, TaskId, Worker, outbox_task,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// Build the report for a period.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "report.generate", queue = "reports", retry_delays = ["10s", "1m", "10m"])]
pub struct GenerateReport {
    /// Start of the period.
    pub from: DateTime<Utc>,
    /// End of the period.
    pub to: DateTime<Utc>,
}

/// Builds reports, one day of data at a time.
///
/// A long handler needs no heartbeat code of its own: the worker writes a
/// heartbeat for all of its running tasks in one statement every interval,
/// so a report that takes an hour is never mistaken for a lost one. It
/// should watch the cancellation token, so a shutdown can stop it cleanly.
#[derive(Debug, Clone, Copy)]
pub struct ReportBuilder {
    /// Simulated work per day of data.
    pub per_day: Duration,
}

impl TaskHandler<GenerateReport> for ReportBuilder {
    async fn handle(&self, ctx: TaskContext, task: GenerateReport) -> HandlerResult {
        let days = (task.to - task.from).num_days();
        if days <= 0 || days > 366 {
            return Ok(Outcome::GiveUp(format!(
                "a report covers 1 to 366 days, not {days}"
            )));
        }
        let mut total: i64 = 0;
        for day in 0..days {
            tokio::select! {
                () = tokio::time::sleep(self.per_day) => {}
                () = ctx.cancellation().cancelled() => return Err(HandlerError::msg("stopped by shutdown")),
            }
            total += 100 + day;
        }
        // Keyed by the task id: a duplicate execution overwrites, never adds.
        sqlx::query(
            "INSERT INTO reports (task_id, period_from, period_to, days, total) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (task_id) DO UPDATE SET days = EXCLUDED.days, total = EXCLUDED.total",
        )
        .bind(ctx.id().0)
        .bind(task.from)
        .bind(task.to)
        .bind(days)
        .bind(total)
        .execute(ctx.pool())
        .await?;
        Ok(Outcome::Success)
    }
}

/// Creates the reports table and outbox's schema.
pub async fn setup(pool: &PgPool) -> Result<(), outbox::Error> {
    outbox::migrate(pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS reports (
             task_id bigint PRIMARY KEY,
             period_from timestamptz NOT NULL,
             period_to timestamptz NOT NULL,
             days bigint NOT NULL,
             total bigint NOT NULL
         )",
    )
    .execute(pool)
    .await?;
    Ok(())
}

#[derive(Debug, Deserialize)]
struct ReportRequest {
    from: DateTime<Utc>,
    to: DateTime<Utc>,
}

async fn request_report(
    State(pool): State<PgPool>,
    Json(request): Json<ReportRequest>,
) -> Result<(StatusCode, Json<serde_json::Value>), (StatusCode, String)> {
    let task = GenerateReport {
        from: request.from,
        to: request.to,
    };
    let mut conn = pool.acquire().await.map_err(internal)?;
    let id = outbox::submit(&mut conn, task).await.map_err(internal)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "id": id, "status": "pending" })),
    ))
}

async fn report_status(
    State(pool): State<PgPool>,
    Path(id): Path<i64>,
) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
    let Some(task) = outbox::admin::get_task(&pool, TaskId(id))
        .await
        .map_err(internal)?
    else {
        return Err((StatusCode::NOT_FOUND, format!("no report {id}")));
    };
    let status = match task.state.as_str() {
        "pending" | "failed" => "pending", // failed with attempts left: it will run again
        "processing" => "running",
        "completed" => "done",
        _ => "failed", // dead: no attempts left, or given up
    };
    let mut body = serde_json::json!({ "id": id, "status": status, "attempts": task.retry_count });
    if status == "done" {
        let (days, total): (i64, i64) =
            sqlx::query_as("SELECT days, total FROM reports WHERE task_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .map_err(internal)?;
        body["report"] = serde_json::json!({ "days": days, "total": total });
    }
    if status != "done" {
        body["last_error"] = serde_json::json!(task.last_error);
    }
    Ok(Json(body))
}

fn internal(e: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// The HTTP API: `POST /reports {from, to}` and `GET /reports/{id}`.
pub fn router(pool: PgPool) -> Router {
    Router::new()
        .route("/reports", post(request_report))
        .route("/reports/{id}", get(report_status))
        .with_state(pool)
}

/// The worker that builds reports.
pub fn worker(pool: PgPool, per_day: Duration) -> Result<Worker, outbox::Error> {
    Worker::builder(pool)
        .handler::<GenerateReport>(ReportBuilder { per_day })
        .build()
}
