//! A success's outcome takes one of two paths (migration 41): a batch whose
//! tasks all simply leave the table runs a statement with only the delete
//! (and its history insert) and the keys let go of; a batch holding a task
//! an operator asked to cancel, or one whose unique key covers COMPLETED,
//! runs the statement that covers every case. What each path writes and
//! returns is pinned here: plain, special and mixed batches, stale
//! attempts, a key handed on by either path, a run whose queue was paused
//! after its claim, with history kept and with retention zero.

use outbox_tests::TestDb;
use sqlx::{PgConnection, Row};

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

/// Claims every claimable task of `QUEUE`, each key's head with up to
/// `key_run - 1` tasks behind it: id -> claims.
async fn claim(conn: &mut PgConnection, key_run: i32) -> std::collections::HashMap<i64, i32> {
    crate::claim_sql::claim(conn, QUEUE, 100, TOKEN, key_run)
        .await
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
    let behind_mixed = insert(&mut conn, Some("m"), None).await;
    let mixed_cancelled = insert(&mut conn, None, None).await;
    let late_cancelled = insert(&mut conn, None, None).await;
    let claims = claim(&mut conn, 1).await;
    assert_eq!(claims.len(), 7, "every task but the two behind their keys");
    assert!(!claims.contains_key(&behind) && !claims.contains_key(&behind_mixed));
    sqlx::query("UPDATE outbox_tasks SET cancel_requested_at = now() WHERE id = ANY ($1)")
        .bind(vec![cancelled, mixed_cancelled, late_cancelled])
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

    // Mixed: one special task takes the whole batch down the full path;
    // the plain one still leaves, and its key goes on to the task behind.
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
            (Some(behind_mixed), true, Some(true), None),
            (Some(mixed_cancelled), false, None, Some(true)),
        ]
    );
    assert_eq!(whereabouts(&mut conn, mixed_plain).await, (None, true));
    assert_eq!(
        whereabouts(&mut conn, behind_mixed).await,
        (processing_by("handed"), false)
    );

    // A stale claim is not written, on either path: alone (plain), and
    // beside a special task.
    let mut stale = claims.clone();
    stale.insert(behind, 99);
    assert_eq!(complete(&mut conn, COMPLETE, &[behind], &stale).await, []);
    let rows = complete(&mut conn, COMPLETE, &[behind, late_cancelled], &stale).await;
    assert_eq!(rows, vec![(Some(late_cancelled), false, None, Some(true))]);
    assert_eq!(
        whereabouts(&mut conn, behind).await,
        (processing_by("handed"), false)
    );
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
    let claims = claim(&mut conn, 1).await;
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

#[tokio::test]
async fn a_run_in_a_queue_paused_after_its_claim_ends_at_its_tasks_outcome() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    let head = insert(&mut conn, Some("r"), None).await;
    let next = insert(&mut conn, Some("r"), None).await;
    let claims = claim(&mut conn, 8).await;
    assert!(
        claims.contains_key(&head) && claims.contains_key(&next),
        "one run of two"
    );
    sqlx::query(
        "INSERT INTO outbox_queues (name, paused_at) VALUES ($1, now()) \
         ON CONFLICT (name) DO UPDATE SET paused_at = now()",
    )
    .bind(QUEUE)
    .execute(&mut *conn)
    .await
    .unwrap();

    // The head's outcome, its run going on with `next`: a plain batch.
    let rows: Vec<(Option<i64>, bool, Option<bool>)> = sqlx::query(COMPLETE)
        .bind(vec![head])
        .bind(vec![claims[&head]])
        .bind(vec![TOKEN])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(Vec::<String>::new())
        .bind(Vec::<i32>::new())
        .bind(None::<String>)
        .bind(vec![head])
        .bind(vec![None::<chrono::DateTime<chrono::Utc>>])
        .bind(vec![next])
        .fetch_all(&mut *conn)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("id"), r.get("handed"), r.get("run_halted")))
        .collect();
    // The run ends here (the worker gives `next` back), and the key is let
    // go of: nothing is handed on, `next` being its run's and still held.
    assert_eq!(rows, vec![(Some(head), false, Some(true))]);
    assert_eq!(whereabouts(&mut conn, head).await, (None, true));
    assert_eq!(
        whereabouts(&mut conn, next).await,
        (processing_by(TOKEN), false)
    );
}

/// An attempt as the worker sends it: task id, claims, claim token, and
/// when its task started.
type Attempt = (i64, i32, &'static str, chrono::DateTime<chrono::Utc>);

/// One success outcome for `attempts`, each in a run that goes on with
/// `next` where it has one (no place offered): the ids written.
async fn complete_started(
    conn: &mut PgConnection,
    attempts: &[Attempt],
    next: &std::collections::HashMap<i64, i64>,
) -> Vec<i64> {
    let continuing: Vec<i64> = attempts
        .iter()
        .map(|a| a.0)
        .filter(|id| next.contains_key(id))
        .collect();
    let mut written: Vec<i64> = sqlx::query(COMPLETE)
        .bind(attempts.iter().map(|a| a.0).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.1).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.2).collect::<Vec<_>>())
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(Vec::<String>::new())
        .bind(Vec::<i32>::new())
        .bind(None::<String>)
        .bind(continuing.clone())
        .bind(attempts.iter().map(|a| Some(a.3)).collect::<Vec<_>>())
        .bind(continuing.iter().map(|id| next[id]).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await
        .unwrap()
        .iter()
        .filter(|r| !r.get::<bool, _>("handed"))
        .map(|r| r.get::<Option<i64>, _>("id").unwrap())
        .collect();
    written.sort_unstable();
    written
}

#[tokio::test]
async fn each_task_of_a_run_records_the_start_of_its_own_attempt_in_batches_large_and_small() {
    // A usual batch of more than 16 attempts of runs, and any batch with a
    // cancel, join the starts to their rows by attempt; a usual batch of
    // 16 or fewer looks each up (migration 55). Every task records its own
    // attempt's start, once, and the join takes the attempt written over a
    // stale one of the same task ahead of it in the batch: a claim lost in
    // a crash, whose task was claimed again with the same count.
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    let mut heads = Vec::new();
    let mut next = std::collections::HashMap::new();
    for k in 0..40 {
        let key = format!("k{k:02}");
        let head = insert(&mut conn, Some(&key), None).await;
        let behind = insert(&mut conn, Some(&key), None).await;
        heads.push(head);
        next.insert(head, behind);
    }
    let claims = claim(&mut conn, 2).await;
    assert_eq!(claims.len(), 80, "every head with the task behind it");
    let start = |i: usize| {
        chrono::DateTime::<chrono::Utc>::UNIX_EPOCH + chrono::TimeDelta::seconds(i as i64 + 1)
    };
    let attempt = |i: usize, id: i64| (id, claims[&id], TOKEN, start(i));
    // Heads 0-19, a usual batch of 21: the lost claim's attempt of head 0
    // first, then each head's, head 1's twice.
    let mut batch = vec![(
        heads[0],
        claims[&heads[0]],
        "plain-outcomes/lost",
        start(999),
    )];
    batch.extend(
        heads[..20]
            .iter()
            .enumerate()
            .map(|(i, id)| attempt(i, *id)),
    );
    batch.push(attempt(1, heads[1]));
    let mut written = heads[..20].to_vec();
    written.sort_unstable();
    assert_eq!(complete_started(&mut conn, &batch, &next).await, written);
    // Heads 20-39, head 25 with a cancel asked for: the statement for
    // every case, which ends that one dead and archives the rest.
    sqlx::query("UPDATE outbox_tasks SET cancel_requested_at = now() WHERE id = $1")
        .bind(heads[25])
        .execute(&mut *conn)
        .await
        .unwrap();
    let batch: Vec<Attempt> = (20..40).map(|i| attempt(i, heads[i])).collect();
    assert_eq!(complete_started(&mut conn, &batch, &next).await.len(), 20);
    // The tasks behind them, their runs' last: usual batches of 12, 8 and
    // 20.
    let behind: Vec<i64> = heads.iter().map(|h| next[h]).collect();
    for range in [0..12, 12..20, 20..40] {
        let batch: Vec<Attempt> = range.clone().map(|i| attempt(100 + i, behind[i])).collect();
        assert_eq!(
            complete_started(&mut conn, &batch, &Default::default())
                .await
                .len(),
            range.len()
        );
    }
    let recorded: Vec<(i64, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT id, attempted_at FROM outbox_task_history ORDER BY id")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let mut expected: Vec<(i64, chrono::DateTime<chrono::Utc>)> = heads
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 25)
        .map(|(i, id)| (*id, start(i)))
        .chain(
            behind
                .iter()
                .enumerate()
                .map(|(i, id)| (*id, start(100 + i))),
        )
        .collect();
    expected.sort_unstable();
    assert_eq!(recorded, expected, "one row a task, with its own start");
    assert_eq!(
        whereabouts(&mut conn, heads[25]).await,
        (cancelled_dead(), false)
    );
}
