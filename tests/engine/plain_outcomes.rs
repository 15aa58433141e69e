//! A success's outcome takes one of two paths (migration 41): a batch whose
//! tasks all simply leave the table runs a delete (with its history
//! insert) and lets go of keys on its own; a batch holding a task an
//! operator asked to cancel, or one whose unique key covers COMPLETED, runs
//! the statement that covers every case. Each path, and a batch mixing
//! plain and special tasks, with history kept and with retention zero,
//! must leave the same rows behind.

use outbox_tests::TestDb;
use sqlx::{PgConnection, Row};

const CLAIM: &str = include_str!("../../outbox-core/src/db/sql/claim_tasks.sql");
const COMPLETE: &str = include_str!("../../outbox-core/src/db/sql/complete_tasks.sql");
const DELETE: &str = include_str!("../../outbox-core/src/db/sql/delete_completed_tasks.sql");

const QUEUE: &str = "plain-outcomes";
const TOKEN: &str = "plain-outcomes/1";

/// Inserts a task of `QUEUE`: (ordering key, unique key with the states it
/// covers). Returns its id.
async fn insert(conn: &mut PgConnection, key: Option<&str>, unique: Option<(&str, i16)>) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, ordering_key, \
                                   unique_key, unique_states) \
         VALUES ('plain.outcome', $1, '{}', 3, $2, $3, $4) RETURNING id",
    )
    .bind(QUEUE)
    .bind(key)
    .bind(unique.map(|(k, _)| k))
    .bind(unique.map(|(_, s)| s))
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Claims every claimable task of `QUEUE` (each key's head alone): id ->
/// claims.
async fn claim(conn: &mut PgConnection) -> std::collections::HashMap<i64, i32> {
    sqlx::query(CLAIM)
        .bind(QUEUE)
        .bind(100_i64)
        .bind(TOKEN)
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(-1_i16)
        .bind(chrono::DateTime::UNIX_EPOCH)
        .bind(0_i64)
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(None::<i64>)
        .bind(1_i32)
        .bind(0_i64)
        .fetch_all(conn)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("id"), r.get("claims")))
        .collect()
}

/// One success outcome for `ids` (offering one place of `QUEUE` to a key
/// let go of, under the claim token "handed"): the rows the statement
/// returned as (id, handed, claimed, cancelled).
async fn complete(
    conn: &mut PgConnection,
    sql: &'static str,
    ids: &[i64],
    claims: &std::collections::HashMap<i64, i32>,
) -> Vec<(Option<i64>, bool, Option<bool>, Option<bool>)> {
    let mut rows: Vec<_> = sqlx::query(sql)
        .bind(ids.to_vec())
        .bind(ids.iter().map(|id| claims[id]).collect::<Vec<i32>>())
        .bind(vec![TOKEN; ids.len()])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(vec![QUEUE])
        .bind(vec![1_i32])
        .bind(Some("handed"))
        .bind(Vec::<i64>::new())
        .bind(None::<Vec<Option<chrono::DateTime<chrono::Utc>>>>)
        .bind(Vec::<i64>::new())
        .fetch_all(conn)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get("id"),
                r.get("handed"),
                r.get("claimed"),
                r.get("cancelled"),
            )
        })
        .collect();
    rows.sort_unstable();
    rows
}

/// Where task `id` is: (in the task table as (state, claimed_by, last
/// error), in the history).
async fn whereabouts(
    conn: &mut PgConnection,
    id: i64,
) -> (Option<(String, Option<String>, Option<String>)>, bool) {
    let live = sqlx::query_as(
        "SELECT state::text, claimed_by, last_error FROM outbox_tasks WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await
    .unwrap();
    let archived: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox_task_history WHERE id = $1)")
            .bind(id)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    (live, archived)
}

fn processing_by(token: &str) -> Option<(String, Option<String>, Option<String>)> {
    Some(("processing".to_owned(), Some(token.to_owned()), None))
}

/// Dead, as an operator's cancel leaves a task that was running.
fn cancelled_dead() -> Option<(String, Option<String>, Option<String>)> {
    Some((
        "failed".to_owned(),
        None,
        Some("cancelled by an operator".to_owned()),
    ))
}

#[tokio::test]
async fn plain_special_and_mixed_batches_of_successes_leave_the_same_rows_behind() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    let plain = insert(&mut conn, None, None).await;
    let keyed = insert(&mut conn, Some("k"), None).await;
    let behind = insert(&mut conn, Some("k"), None).await;
    let cancelled = insert(&mut conn, None, None).await;
    let covered = insert(&mut conn, None, Some(("plain-outcomes-u", 1 | 2 | 4 | 8))).await;
    let mixed_plain = insert(&mut conn, Some("m"), None).await;
    let mixed_cancelled = insert(&mut conn, None, None).await;
    let claims = claim(&mut conn).await;
    assert_eq!(claims.len(), 6, "every task but the one behind its key");
    assert!(!claims.contains_key(&behind));
    sqlx::query("UPDATE outbox_tasks SET cancel_requested_at = now() WHERE id = ANY ($1)")
        .bind(vec![cancelled, mixed_cancelled])
        .execute(&mut *conn)
        .await
        .unwrap();

    // Plain: both leave for the history; the key goes on to the task
    // behind it, claimed for the place offered.
    let rows = complete(&mut conn, COMPLETE, &[plain, keyed], &claims).await;
    assert_eq!(
        rows,
        vec![
            (Some(plain), false, None, Some(false)),
            (Some(keyed), false, None, Some(false)),
            (Some(behind), true, Some(true), None),
        ]
    );
    for id in [plain, keyed] {
        assert_eq!(whereabouts(&mut conn, id).await, (None, true), "task {id}");
    }
    assert_eq!(
        whereabouts(&mut conn, behind).await,
        (processing_by("handed"), false)
    );

    // Special: the cancelled task ends dead, the covered one stays,
    // completed, holding its unique key.
    let rows = complete(&mut conn, COMPLETE, &[cancelled, covered], &claims).await;
    assert_eq!(
        rows,
        vec![
            (Some(cancelled), false, None, Some(true)),
            (Some(covered), false, None, Some(false)),
        ]
    );
    assert_eq!(
        whereabouts(&mut conn, cancelled).await,
        (cancelled_dead(), false)
    );
    assert_eq!(
        whereabouts(&mut conn, covered).await,
        (Some(("completed".to_owned(), None, None)), false)
    );

    // Mixed: one special task takes the whole batch down the full path,
    // and the plain one still leaves with its key let go of.
    let rows = complete(
        &mut conn,
        COMPLETE,
        &[mixed_plain, mixed_cancelled],
        &claims,
    )
    .await;
    assert_eq!(
        rows,
        vec![
            (Some(mixed_plain), false, None, Some(false)),
            (Some(mixed_cancelled), false, None, Some(true)),
        ]
    );
    assert_eq!(whereabouts(&mut conn, mixed_plain).await, (None, true));
    let key_held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_tasks WHERE queue = $1 AND ordering_key = 'm'",
    )
    .bind(QUEUE)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(key_held, 0);

    // A stale claim is not written, on either path.
    let stale: std::collections::HashMap<i64, i32> = [(behind, 99)].into();
    assert_eq!(complete(&mut conn, COMPLETE, &[behind], &stale).await, []);
}

#[tokio::test]
async fn with_retention_zero_plain_successes_are_deleted_and_a_cancelled_one_ends_dead() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    let plain = insert(&mut conn, Some("k"), None).await;
    let behind = insert(&mut conn, Some("k"), None).await;
    let covered = insert(&mut conn, None, Some(("plain-outcomes-z", 1 | 2 | 4 | 8))).await;
    let cancelled = insert(&mut conn, None, None).await;
    let alone = insert(&mut conn, None, None).await;
    let claims = claim(&mut conn).await;
    sqlx::query("UPDATE outbox_tasks SET cancel_requested_at = now() WHERE id = $1")
        .bind(cancelled)
        .execute(&mut *conn)
        .await
        .unwrap();

    // Plain (a unique key covering COMPLETED is no exception here: nothing
    // completed is kept).
    let rows = complete(&mut conn, DELETE, &[plain, covered], &claims).await;
    assert_eq!(
        rows,
        vec![
            (Some(plain), false, None, Some(false)),
            (Some(behind), true, Some(true), None),
            (Some(covered), false, None, Some(false)),
        ]
    );
    for id in [plain, covered] {
        assert_eq!(whereabouts(&mut conn, id).await, (None, false), "task {id}");
    }
    assert_eq!(
        whereabouts(&mut conn, behind).await,
        (processing_by("handed"), false)
    );

    // Mixed with a cancelled task.
    let rows = complete(&mut conn, DELETE, &[cancelled, alone], &claims).await;
    assert_eq!(
        rows,
        vec![
            (Some(cancelled), false, None, Some(true)),
            (Some(alone), false, None, Some(false)),
        ]
    );
    assert_eq!(whereabouts(&mut conn, alone).await, (None, false));
    assert_eq!(
        whereabouts(&mut conn, cancelled).await,
        (cancelled_dead(), false)
    );
}
