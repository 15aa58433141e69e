//! docs/guide.md, section 14: behind a connection pooler.

use outbox::outbox_task;
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "user.send_welcome")]
struct SendWelcome { user_id: i64 }

async fn pooled_pool(url: &str) -> Result<PgPool, sqlx::Error> {
    let options: PgConnectOptions = url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .connect_with(outbox::pooler::session_options(options))
        .await?;
    outbox::pooler::mark(&pool);   // outbox's functions that take it follow suit
    Ok(pool)
}

async fn place_order(pool: &PgPool, user_id: i64) -> outbox::Result<()> {
    let mut tx = outbox::pooler::begin(pool).await?;
    sqlx::query("INSERT INTO orders (user_id) VALUES ($1)").bind(user_id).execute(&mut *tx).await?;
    outbox::submit(&mut tx, SendWelcome { user_id }).await?;
    tx.commit().await?;
    Ok(())
}
