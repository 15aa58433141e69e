//! A key that may run several tasks at once (a queue's per-key concurrency
//! above 1) hands out its places in key order: no task of a key is claimed
//! before an earlier one, whether the earlier one waits for a claim (given
//! back at shutdown, or submitted a moment before) or would wait in a
//! worker's buffer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskHandler, Worker, WorkerConfig, admin, outbox_task,
};
use outbox_tests::process::{wait_for_condition, wait_until};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

const QUEUE: &str = "key-places";

/// A keyed step; `hold` keeps its handler running until the test opens the
/// gate.
#[derive(Debug, Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.key_places.step",
    queue = "key-places",
    ordering_key = "key"
)]
struct Placed {
    key: String,
    n: i64,
    hold: bool,
}

fn placed(key: &str, n: i64) -> Placed {
    Placed {
        key: key.to_owned(),
        n,
        hold: false,
    }
}

/// Records the order steps start in, and holds the steps that ask to be.
#[derive(Clone)]
struct Recorder {
    gate: Arc<Semaphore>,
    started: Arc<Mutex<Vec<(String, i64)>>>,
}

impl TaskHandler<Placed> for Recorder {
    async fn handle(&self, _ctx: TaskContext, task: Placed) -> HandlerResult {
        self.started
            .lock()
            .unwrap()
            .push((task.key.clone(), task.n));
        if task.hold {
            self.gate.acquire().await.expect("gate open").forget();
        }
        Ok(Outcome::Success)
    }
}

async fn two_places_per_key(pool: &sqlx::PgPool) {
    admin::set_queue(
        pool,
        QUEUE,
        &admin::QueueChange::new().per_key_concurrency(2),
    )
    .await
    .unwrap();
}

/// A task's id by its key and step.
async fn id_of(pool: &sqlx::PgPool, key: &str, n: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT id FROM outbox_tasks WHERE payload->>'key' = $1 AND (payload->>'n')::bigint = $2",
    )
    .bind(key)
    .bind(n)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// (state, blocked, claimed_by) of a task.
async fn place_of(pool: &sqlx::PgPool, id: i64) -> (String, bool, Option<String>) {
    sqlx::query_as("SELECT state::text, blocked, claimed_by FROM outbox_tasks WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Step 1 of a key completes through the outcome statement, with a free
/// place for the hand-on under token `hand`; returns the ids of steps 1-3.
async fn complete_first_with_a_hand_on(db: &TestDb, key: &str) -> [i64; 3] {
    let ids = [
        id_of(&db.pool, key, 1).await,
        id_of(&db.pool, key, 2).await,
        id_of(&db.pool, key, 3).await,
    ];
    sqlx::query(
        "UPDATE outbox_tasks SET state = 'processing', claimed_by = 'first', claims = 1, \
         attempted_at = now(), heartbeat_at = now() WHERE id = $1",
    )
    .bind(ids[0])
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "SELECT * FROM outbox_complete_tasks(ARRAY[$1]::bigint[], ARRAY[1], ARRAY['first'], \
         NULL, ARRAY[$2], ARRAY[4], 'hand', false, NULL, NULL, NULL)",
    )
    .bind(ids[0])
    .bind(QUEUE)
    .execute(&db.pool)
    .await
    .unwrap();
    ids
}

#[tokio::test]
async fn a_hand_over_leaves_a_later_task_to_the_claims_while_an_earlier_one_waits_for_one() {
    let db = TestDb::migrated().await;
    two_places_per_key(&db.pool).await;
    let mut conn = db.conn().await;
    for key in ["waiting", "claimed"] {
        for n in 1..=3 {
            outbox::submit(&mut conn, placed(key, n)).await.unwrap();
        }
    }
    drop(conn);
    // Steps 1 and 2 have the key's two places; step 3 waits for one.
    let [_, second, third] = complete_first_with_a_hand_on(&db, "waiting").await;
    assert_eq!(
        place_of(&db.pool, second).await,
        ("pending".to_owned(), false, None)
    );
    assert_eq!(
        place_of(&db.pool, third).await,
        ("pending".to_owned(), false, None),
        "step 3 has step 1's place, and is left to the claims behind step 2"
    );
    // With step 2 claimed, the hand-over takes step 3 for its worker, as
    // before: what the test above would see without the change.
    let second = id_of(&db.pool, "claimed", 2).await;
    sqlx::query("UPDATE outbox_tasks SET state = 'processing', claimed_by = 'other', claims = 1 WHERE id = $1")
        .bind(second)
        .execute(&db.pool)
        .await
        .unwrap();
    let [_, _, third] = complete_first_with_a_hand_on(&db, "claimed").await;
    assert_eq!(
        place_of(&db.pool, third).await,
        ("processing".to_owned(), false, Some("hand".to_owned()))
    );
}

#[tokio::test]
async fn a_queue_whose_keys_run_several_at_once_claims_no_task_ahead_of_its_slots() {
    let db = TestDb::migrated().await;
    two_places_per_key(&db.pool).await;
    let recorder = Recorder {
        gate: Arc::new(Semaphore::new(0)),
        started: Arc::default(),
    };
    let worker = |concurrency: usize, window: Duration| {
        RunningWorker::start(
            Worker::builder(db.pool.clone())
                .config(WorkerConfig {
                    claim_ahead_window: window,
                    ..WorkerConfig::default()
                })
                .handler::<Placed>(recorder.clone())
                .queue(QUEUE, concurrency)
                .build()
                .unwrap(),
        )
    };
    // Steps enough for worker A to measure its start rate (its buffer
    // follows it, here up to 5 s of starts), then a step its one slot
    // holds.
    let mut batch = outbox::Batch::new();
    for n in 1..=400 {
        batch.push(&placed(&format!("warm-{n}"), 1)).unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let mut long = placed("long", 1);
    long.hold = true;
    outbox::submit(&mut *db.conn().await, long).await.unwrap();
    let a = worker(1, Duration::from_secs(5));
    wait_for_condition("the held step to start", Duration::from_secs(60), || {
        recorder
            .started
            .lock()
            .unwrap()
            .iter()
            .any(|(k, _)| k == "long")
    })
    .await;
    // Worker A wakes for the key's steps with its slot taken.
    let mut conn = db.conn().await;
    for n in 1..=3 {
        outbox::submit(&mut conn, placed("k", n)).await.unwrap();
    }
    drop(conn);
    // Had A claimed steps 1 and 2 ahead, they would hold both places in its
    // buffer behind the held step, and B could run none of the key.
    let b = worker(2, Duration::from_millis(50));
    wait_until(
        &db.pool,
        "SELECT count(*) = 3 FROM outbox_all_tasks \
         WHERE payload->>'key' = 'k' AND state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    let order: Vec<i64> = recorder
        .started
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| k == "k")
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(order, [1, 2, 3]);
    recorder.gate.add_permits(1);
    a.stop().await;
    b.stop().await;
}
