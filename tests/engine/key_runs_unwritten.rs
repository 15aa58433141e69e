//! A run's middle tasks held without a write (migration 56), where they
//! meet other transactions: an operator's cancel, a retry back ahead of a
//! run's head, a place handed out beside a run, recovery while an outcome
//! is in flight. Each case is staged step by step with real sessions and
//! row locks, so nothing depends on timing.

use std::time::Duration;

use outbox::TaskId;
use outbox::admin;
use outbox_tests::TestDb;
use outbox_tests::process::wait_until;

use crate::key_runs::{
    HEARTBEAT, RECOVER, RELEASE_RUN, claim_run, complete_continuing, line, recover, submit_run_of,
};

fn running(token: &str) -> (String, bool, Option<String>) {
    ("processing".to_owned(), true, Some(token.to_owned()))
}

/// A task an operator retried back into its key's line ahead of the
/// line's next task is taken by that task's run (the line is every task
/// waiting for the key): the run starts at it, so it is held with the
/// rest, confirmed by the heartbeat and its outcome written.
#[tokio::test]
async fn a_task_retried_back_ahead_of_a_runs_head_is_held_with_its_run() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 4).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_tasks ORDER BY key_seq")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    // The first cancelled (its key goes on to the second), then retried:
    // back in the line, ahead of the task that now has the key.
    admin::cancel_tasks(&db.pool, &[TaskId(ids[0])])
        .await
        .unwrap();
    admin::retry_tasks(&db.pool, &[TaskId(ids[0])])
        .await
        .unwrap();
    let blocked: Vec<bool> =
        sqlx::query_scalar("SELECT blocked FROM outbox_tasks ORDER BY key_seq")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(blocked, vec![true, false, true, true]);

    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    assert_eq!(
        run.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        ids,
        "the head (the second) with the three waiting in its line"
    );
    assert_eq!(line(&db.pool, &ids[..1]).await, vec![running("w/1")]);
    let confirmed: Vec<i64> = sqlx::query_scalar(HEARTBEAT)
        .bind(vec![ids[0]])
        .bind(vec!["w/1"])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .fetch_all(&mut *worker)
        .await
        .unwrap();
    assert_eq!(confirmed, vec![ids[0]]);
    // Its run: the head first, then the retried task, then the rest.
    assert!(!complete_continuing(&mut worker, run[1], "w/1", ids[0]).await);
    assert!(
        !complete_continuing(&mut worker, run[0], "w/1", ids[2]).await,
        "the retried task's outcome written, the run going on"
    );
}

/// A place handed out while an operator raised a key's concurrency, and
/// claimed after it was lowered again before the places were taken back:
/// the claim takes that task alone, not the tasks the key's run holds in
/// place without a write, which wait in the same line.
#[tokio::test]
async fn a_claim_takes_no_run_beside_another_run_of_its_key() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 10).await;
    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    assert_eq!(run.len(), 8);
    admin::set_queue(
        &db.pool,
        "ordered",
        &admin::QueueChange::new().per_key_concurrency(3),
    )
    .await
    .unwrap();
    // Lowered again behind the places' back (`queues set` takes them back
    // in a statement of its own).
    sqlx::query("UPDATE outbox_queues SET per_key_concurrency = 1 WHERE name = 'ordered'")
        .execute(&db.pool)
        .await
        .unwrap();
    let ninth: i64 =
        sqlx::query_scalar("SELECT id FROM outbox_tasks WHERE NOT blocked AND state = 'pending'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let other = claim_run(&mut worker, "w/2").await;
    assert_eq!(other, vec![(ninth, 1)], "the ninth alone");
    let ids: Vec<i64> = run.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        line(&db.pool, &ids[1..7]).await,
        vec![running("w/1"); 6],
        "still the first run's"
    );
}

/// An operator's cancel locks the key of a task waiting in its line before
/// the task (cancel_lock.sql). A claim meanwhile takes that key's head
/// alone: its run would hold a task the cancel is making dead. Once the
/// cancel has committed, the dead task has left the line, and the next
/// claim's run steps over it.
#[tokio::test]
async fn a_claim_takes_no_run_for_a_key_a_cancel_holds_and_stops_at_the_task_it_cancelled() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 4).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_tasks ORDER BY key_seq")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let mut cancel = db.pool.begin().await.unwrap();
    let locked: Vec<i64> =
        sqlx::query_scalar(include_str!("../../outbox-core/src/db/sql/cancel_lock.sql"))
            .bind(vec![ids[2]])
            .fetch_all(&mut *cancel)
            .await
            .unwrap();
    assert_eq!(locked, vec![ids[2]]);
    let mut worker = db.conn().await;
    assert_eq!(
        claim_run(&mut worker, "w/1").await,
        vec![(ids[0], 1)],
        "the head alone"
    );
    sqlx::query(include_str!(
        "../../outbox-core/src/db/sql/cancel_tasks.sql"
    ))
    .bind(vec![ids[2]])
    .fetch_all(&mut *cancel)
    .await
    .unwrap();
    cancel.commit().await.unwrap();
    // The head done, its key handed to the second task: claimed with a run
    // without the dead third.
    sqlx::query(crate::key_runs::COMPLETE)
        .bind(vec![ids[0]])
        .bind(vec![1_i32])
        .bind(vec!["w/1"])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(Vec::<String>::new())
        .bind(Vec::<i32>::new())
        .bind(None::<String>)
        .bind(Vec::<i64>::new())
        .bind(None::<Vec<Option<chrono::DateTime<chrono::Utc>>>>)
        .bind(Vec::<i64>::new())
        .fetch_all(&mut *worker)
        .await
        .unwrap();
    let run = claim_run(&mut worker, "w/2").await;
    assert_eq!(
        run,
        vec![(ids[1], 1), (ids[3], 1)],
        "the second and the fourth"
    );
}

/// Recovery passes over a run while the outcome of a task it holds without
/// a write is in flight (that task's row locked): the outcome may go on
/// with the run. And a run given back waits for an operator's cancel of
/// one of its held tasks, then makes that task dead.
#[tokio::test]
async fn recovery_waits_for_an_outcome_in_flight_and_a_release_for_a_cancel() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 5).await;
    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    let ids: Vec<i64> = run.iter().map(|(id, _)| *id).collect();
    assert!(!complete_continuing(&mut worker, run[0], "w/1", ids[1]).await);

    let mut outcome = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox_tasks WHERE id = $1 FOR UPDATE")
        .bind(ids[1])
        .execute(&mut *outcome)
        .await
        .unwrap();
    recover(&mut worker, 100).await;
    assert_eq!(
        line(&db.pool, &ids[1..]).await,
        vec![running("w/1"); 4],
        "nothing of the run taken back"
    );
    outcome.rollback().await.unwrap();
    recover(&mut worker, 100).await;
    assert_eq!(
        line(&db.pool, &ids[1..]).await,
        vec![
            ("pending".to_owned(), false, None),
            ("pending".to_owned(), true, None),
            ("pending".to_owned(), true, None),
            ("pending".to_owned(), true, None),
        ],
        "taken back once nothing of it is locked, the key to the first"
    );

    // Claimed again (up to the last, which recovery's clock, an hour ahead,
    // made due later); an operator's cancel of its held task, not committed
    // yet, when the worker gives the run back.
    let again = claim_run(&mut worker, "w/2").await;
    assert_eq!(again.len(), 3);
    let mut cancel = db.pool.begin().await.unwrap();
    sqlx::query(include_str!("../../outbox-core/src/db/sql/cancel_lock.sql"))
        .bind(vec![ids[2]])
        .fetch_all(&mut *cancel)
        .await
        .unwrap();
    sqlx::query(include_str!(
        "../../outbox-core/src/db/sql/cancel_tasks.sql"
    ))
    .bind(vec![ids[2]])
    .fetch_all(&mut *cancel)
    .await
    .unwrap();
    let pool = db.pool.clone();
    let rest = vec![ids[2], ids[3]];
    let release = tokio::spawn(async move {
        sqlx::query(RELEASE_RUN)
            .bind(rest)
            .bind(vec!["w/2"; 2])
            .fetch_all(&pool)
            .await
            .unwrap();
    });
    wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM pg_stat_activity \
         WHERE wait_event_type = 'Lock' AND query LIKE '-- Gives back the rest of a run%'",
        Duration::from_secs(60),
    )
    .await;
    cancel.commit().await.unwrap();
    release.await.unwrap();
    let back: Vec<(String, bool, bool)> = sqlx::query_as(
        "SELECT state::text, blocked, dead_at IS NOT NULL FROM outbox_tasks \
         WHERE id = ANY($1) ORDER BY key_seq",
    )
    .bind(&ids[2..4])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        back,
        vec![
            ("failed".to_owned(), false, true),
            ("pending".to_owned(), true, false)
        ],
        "the cancel seen: dead; the last back in line"
    );
    let _ = RECOVER;
}
