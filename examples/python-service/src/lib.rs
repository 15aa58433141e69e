//! The Rust half of the Python service example: the `email.welcome` task a
//! Python web handler submits with `outbox_submit` (see `service.py`), and
//! its handler.
//!
//! The worker declares the task type in `outbox_task_types` when it starts,
//! so the Python side names only the type and the payload: queue, attempts
//! and the unique key (one welcome per user) come from this declaration.

use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, outbox_task};
use serde::{Deserialize, Serialize};

/// Welcome a new user, once per user.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "email.welcome", queue = "email", unique_by = ["user_id"])]
pub struct WelcomeEmail {
    /// The user, as the Python service inserted it.
    pub user_id: i64,
    /// Where to send it.
    pub email: String,
}

/// "Sends" the welcome: records it in `welcomes`, where the example's test
/// looks.
#[derive(Debug, Clone, Copy)]
pub struct SendWelcome;

impl TaskHandler<WelcomeEmail> for SendWelcome {
    async fn handle(&self, ctx: TaskContext, task: WelcomeEmail) -> HandlerResult {
        sqlx::query(
            "INSERT INTO welcomes (user_id, email, task_id) VALUES ($1, $2, $3) \
             ON CONFLICT (user_id) DO NOTHING",
        )
        .bind(task.user_id)
        .bind(&task.email)
        .bind(ctx.id().0)
        .execute(ctx.pool())
        .await?;
        Ok(Outcome::Success)
    }
}

/// The tables the example's service and worker write.
pub const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS users (id bigserial PRIMARY KEY, email text NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS welcomes (user_id bigint PRIMARY KEY, email text NOT NULL, task_id bigint NOT NULL);";
