//! The maintenance leader vacuums the task table when dead row versions pile
//! up (each claim leaves one in the claim index's path), instead of waiting
//! for autovacuum's once-a-minute visit.

use std::time::Duration;

use outbox::{Worker, WorkerConfig};
use outbox_tests::process::wait_until;
use outbox_tests::{RunningWorker, TestDb};

/// Leaves `n` dead row versions in outbox_tasks, with autovacuum off the
/// table: with a hundred test databases in one cluster, the launcher
/// visits a new one every half second or so, and an autovacuum that got
/// there before the leader saw the dead rows left none for it (CI once
/// timed out waiting for `last_vacuum`, which only a manual VACUUM sets).
async fn churn(db: &TestDb, n: i64) {
    sqlx::query("ALTER TABLE outbox_tasks SET (autovacuum_enabled = false)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         SELECT 'x', 'vacuum', '{}', 1 FROM generate_series(1, $1)",
    )
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("DELETE FROM outbox_tasks WHERE queue = 'vacuum'")
        .execute(&db.pool)
        .await
        .unwrap();
}

fn leader(db: &TestDb, vacuum_threshold: u64) -> Worker {
    Worker::builder(db.pool.clone())
        .config(WorkerConfig {
            maintenance_interval: Duration::from_millis(50),
            vacuum_threshold,
            ..WorkerConfig::default()
        })
        .queue("vacuum-idle", 1)
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_leader_vacuums_the_task_table_once_dead_rows_pass_the_threshold() {
    let db = TestDb::migrated().await;
    churn(&db, 5_000).await;
    let worker = RunningWorker::start(leader(&db, 2_000));
    // A manual VACUUM sets last_vacuum; autovacuum sets last_autovacuum.
    wait_until(
        &db.pool,
        "SELECT last_vacuum IS NOT NULL AND n_dead_tup = 0 FROM pg_stat_user_tables \
         WHERE relname = 'outbox_tasks'",
        Duration::from_secs(30),
    )
    .await;
    worker.stop().await;
}

#[tokio::test]
async fn below_the_threshold_or_with_it_off_the_table_is_left_to_autovacuum() {
    for threshold in [1_000, 0] {
        let db = TestDb::migrated().await;
        churn(&db, 500).await;
        let worker = RunningWorker::start(leader(&db, threshold));
        wait_until(
            &db.pool,
            "SELECT n_dead_tup >= 500 FROM pg_stat_user_tables WHERE relname = 'outbox_tasks'",
            Duration::from_secs(30),
        )
        .await;
        // With the statistics in, let the leader look many times: its lease
        // moves on at every round (50 ms apart), so 500 ms of it is ten.
        let first: chrono::DateTime<chrono::Utc> =
            sqlx::query_scalar("SELECT expires_at FROM outbox_leases WHERE name = 'maintenance'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        wait_until(
            &db.pool,
            &format!(
                "SELECT expires_at > '{}'::timestamptz + interval '500 ms' FROM outbox_leases \
                 WHERE name = 'maintenance'",
                first.to_rfc3339()
            ),
            Duration::from_secs(30),
        )
        .await;
        let vacuumed: bool = sqlx::query_scalar(
            "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'outbox_tasks'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert!(!vacuumed, "threshold {threshold}: vacuumed anyway");
        worker.stop().await;
    }
}
