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

/// The first statement of an operator's cancel of `id` (admin::cancel_tasks
/// runs both in one transaction): the ids it judged waiting.
async fn cancel_lock(tx: &mut sqlx::PgConnection, id: i64) -> Vec<i64> {
    let locked: Vec<(i64, bool)> =
        sqlx::query_as(include_str!("../../outbox-core/src/db/sql/cancel_lock.sql"))
            .bind(vec![id])
            .fetch_all(tx)
            .await
            .unwrap();
    assert_eq!(locked.len(), 1);
    locked.into_iter().filter(|l| l.1).map(|l| l.0).collect()
}

/// The second statement of that cancel.
async fn cancel_tasks(tx: &mut sqlx::PgConnection, id: i64, waiting: &[i64]) {
    sqlx::query(include_str!(
        "../../outbox-core/src/db/sql/cancel_tasks.sql"
    ))
    .bind(vec![id])
    .bind(waiting)
    .fetch_all(tx)
    .await
    .unwrap();
}

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
    let waiting = cancel_lock(&mut cancel, ids[2]).await;
    assert_eq!(waiting, vec![ids[2]], "judged waiting, its key locked");
    let mut worker = db.conn().await;
    assert_eq!(
        claim_run(&mut worker, "w/1").await,
        vec![(ids[0], 1)],
        "the head alone"
    );
    cancel_tasks(&mut cancel, ids[2], &waiting).await;
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
    let waiting = cancel_lock(&mut cancel, ids[2]).await;
    assert_eq!(
        waiting,
        Vec::<i64>::new(),
        "judged running: held by the run"
    );
    cancel_tasks(&mut cancel, ids[2], &waiting).await;
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

/// Two claims of one key (two places handed out while an operator raised
/// its concurrency, then lowered again behind them) never both take a run
/// of its line: the first holds the key's row until it commits, and the
/// second takes its head alone.
#[tokio::test]
async fn two_claims_of_one_key_never_take_the_same_run() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 6).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_tasks ORDER BY key_seq")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    admin::set_queue(
        &db.pool,
        "ordered",
        &admin::QueueChange::new().per_key_concurrency(2),
    )
    .await
    .unwrap();
    sqlx::query("UPDATE outbox_queues SET per_key_concurrency = 1 WHERE name = 'ordered'")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut first = db.pool.begin().await.unwrap();
    let run = claim_run(&mut first, "w/1").await;
    assert_eq!(
        run.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [&ids[..1], &ids[2..]].concat(),
        "the first head with the four waiting"
    );
    let mut second = db.conn().await;
    // A claim that would wait for the first (a run over the same tasks)
    // fails instead of hanging the test; one that passes never waits.
    sqlx::query("SET lock_timeout = '10s'")
        .execute(&mut *second)
        .await
        .unwrap();
    assert_eq!(
        claim_run(&mut second, "w/2").await,
        vec![(ids[1], 1)],
        "the second head alone, while the first claim is open"
    );
    first.commit().await.unwrap();
}

/// An operator's cancel that judged a task running (held by a run) asks
/// it to cancel even if, by its second statement, the run has ended and
/// the task waits in its line: a claim may be taking it into a new run
/// that the cancel cannot see yet. The claim's worker is told, and the
/// task ends dead at its turn or when its run is given back, never run.
#[tokio::test]
async fn a_cancel_that_judged_a_task_running_asks_it_to_cancel_even_if_its_run_ended_meanwhile() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 5).await;
    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    let ids: Vec<i64> = run.iter().map(|(id, _)| *id).collect();
    assert!(!complete_continuing(&mut worker, run[0], "w/1", ids[1]).await);
    let mut cancel = db.pool.begin().await.unwrap();
    // A cancel that would wait for the open claim (making the task dead
    // hands its key on) fails instead of hanging the test; one that asks
    // the task to cancel never waits.
    sqlx::query("SET LOCAL lock_timeout = '10s'")
        .execute(&mut *cancel)
        .await
        .unwrap();
    // Its verdict from a snapshot taken before recovery committed: staged
    // by letting go of its row lock (a savepoint undone), so that recovery
    // can take the run back between the cancel's two statements.
    sqlx::query("SAVEPOINT verdict")
        .execute(&mut *cancel)
        .await
        .unwrap();
    let waiting = cancel_lock(&mut cancel, ids[2]).await;
    assert_eq!(
        waiting,
        Vec::<i64>::new(),
        "judged running: held by the run"
    );
    sqlx::query("ROLLBACK TO SAVEPOINT verdict")
        .execute(&mut *cancel)
        .await
        .unwrap();
    // The run taken back, and a claim taking the rest into a new run, not
    // committed yet when the cancel writes.
    recover(&mut worker, 100).await;
    let mut claim = db.pool.begin().await.unwrap();
    let again = claim_run(&mut claim, "w/2").await;
    // Up to the run's last, which recovery's clock (an hour ahead) made due
    // later: the task the cancel asks for is held between.
    assert_eq!(
        again.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        ids[1..4]
    );
    cancel_tasks(&mut cancel, ids[2], &waiting).await;
    cancel.commit().await.unwrap();
    claim.commit().await.unwrap();
    let (state, dead, asked): (String, bool, bool) = sqlx::query_as(
        "SELECT state::text, dead_at IS NOT NULL, cancel_requested_at IS NOT NULL \
         FROM outbox_tasks WHERE id = $1",
    )
    .bind(ids[2])
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (state.as_str(), dead, asked),
        ("pending", false, true),
        "asked to cancel, not made dead under the new run"
    );
}
