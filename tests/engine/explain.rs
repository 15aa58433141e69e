//! `admin::explain_task` gives each reason a task waits for, and says so
//! when nothing holds it back.

use std::time::Duration;

use outbox::admin::{self, QueueChange, Reason};
use outbox::{TaskId, TaskOptions};
use outbox_tests::TestDb;
use outbox_tests::tasks::{Slot, Step};

async fn reasons(db: &TestDb, id: TaskId) -> Vec<Reason> {
    admin::explain_task(&db.pool, id)
        .await
        .unwrap()
        .expect("the task exists")
        .reasons
}

async fn sql(db: &TestDb, statement: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
        .execute(&db.pool)
        .await
        .unwrap();
}

fn step(key: &str, n: i64) -> Step {
    Step::new(key, n, 1)
}

#[tokio::test]
async fn explain_gives_each_reason() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    let due = outbox::submit(&mut conn, Slot { ms: 1 }).await.unwrap();
    assert_eq!(
        reasons(&db, due).await,
        vec![Reason::NoLiveWorker {
            queue: "limited".to_owned()
        }]
    );
    // A live worker serving the queue (as a worker reports itself).
    sql(
        &db,
        "INSERT INTO outbox_workers (id, host, pid, queues, expires_at) VALUES \
         ('w1', 'h', 1, '[{\"queue\": \"limited\", \"concurrency\": 4}, \
                          {\"queue\": \"ordered\", \"concurrency\": 4}]', now() + interval '1 hour')",
    )
    .await;
    assert_eq!(reasons(&db, due).await, vec![Reason::Due { ahead: 0 }]);
    let second = outbox::submit(&mut conn, Slot { ms: 1 }).await.unwrap();
    assert_eq!(reasons(&db, second).await, vec![Reason::Due { ahead: 1 }]);

    let later = outbox::submit_with(
        &mut conn,
        Slot { ms: 1 },
        TaskOptions::new().delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    assert!(matches!(
        reasons(&db, later).await[..],
        [Reason::Scheduled { .. }]
    ));

    let retrying = outbox::submit(&mut conn, Slot { ms: 1 }).await.unwrap();
    db.take_intake().await;
    sql(
        &db,
        &format!(
            "UPDATE outbox_tasks SET state = 'failed', retry_count = 1, claims = 1, \
             last_error = 'boom', execute_at = now() + interval '1 hour' WHERE id = {retrying}"
        ),
    )
    .await;
    assert!(matches!(
        &reasons(&db, retrying).await[..],
        [Reason::WaitingForRetry { failed_attempts: 1, error: Some(e), .. }] if e == "boom"
    ));

    // Suspended by its handler (a sleep, a wait for a signal): no attempt
    // failed, and a signal would wake it.
    let suspended = outbox::submit(&mut conn, Slot { ms: 1 }).await.unwrap();
    db.take_intake().await;
    sql(
        &db,
        &format!(
            "UPDATE outbox_tasks SET claims = 1, execute_at = now() + interval '1 minute' \
             WHERE id = {suspended}"
        ),
    )
    .await;
    let why = reasons(&db, suspended).await;
    assert!(matches!(&why[..], [Reason::Suspended { .. }]), "{why:?}");
    assert!(why[0].to_string().contains("a signal sent to it wakes it"));

    let head = outbox::submit(&mut conn, step("acct-1", 1)).await.unwrap();
    let behind = outbox::submit(&mut conn, step("acct-1", 2)).await.unwrap();
    assert_eq!(
        reasons(&db, behind).await,
        vec![Reason::BehindKey {
            key: "acct-1".to_owned(),
            holder: Some(head.0),
            holder_state: Some("pending".to_owned()),
        }]
    );

    admin::pause_queue(&db.pool, "limited").await.unwrap();
    assert!(matches!(
        &reasons(&db, due).await[..],
        [Reason::QueuePaused { .. }]
    ));
    admin::resume_queue(&db.pool, "limited").await.unwrap();

    let change = QueueChange::new()
        .global_concurrency(1)
        .rate_per_second(5.0);
    admin::set_queue(&db.pool, "limited", &change)
        .await
        .unwrap();
    db.take_intake().await;
    sql(
        &db,
        &format!(
            "UPDATE outbox_tasks SET state = 'processing', claimed_by = 'w1/1', \
             heartbeat_at = now(), attempted_at = now() WHERE id = {second}"
        ),
    )
    .await;
    assert_eq!(
        reasons(&db, due).await,
        vec![
            Reason::AtGlobalLimit {
                running: 1,
                limit: 1
            },
            Reason::RateLimited { per_second: 5.0 }
        ]
    );
    assert_eq!(
        Reason::RateLimited {
            per_second: 1.0 / 3600.0
        }
        .to_string(),
        "its queue is rate limited to 1/h",
        "in the unit it was most likely given"
    );
    let running = reasons(&db, second).await;
    assert!(matches!(
        &running[..],
        [Reason::Running { worker: Some(w), since: Some(_), worker_alive: true, .. }] if w == "w1/1"
    ));
    assert!(!running[0].to_string().contains("gone"), "{}", running[0]);
    // Its worker gone (no row left for it, as after `kill -9` and
    // cleanup): explain says so, and what will put it back.
    sql(
        &db,
        &format!("UPDATE outbox_tasks SET claimed_by = 'w9/1/7' WHERE id = {second}"),
    )
    .await;
    let orphaned = reasons(&db, second).await;
    assert!(matches!(
        &orphaned[..],
        [Reason::Running {
            worker_alive: false,
            heartbeat_at: Some(_),
            ..
        }]
    ));
    assert!(
        orphaned[0]
            .to_string()
            .contains("but that worker is gone (last heartbeat"),
        "{}",
        orphaned[0]
    );

    admin::cancel_tasks(&db.pool, &[later]).await.unwrap();
    assert!(matches!(
        &reasons(&db, later).await[..],
        [Reason::Dead { error: Some(e), blocking: None, .. }] if e == "cancelled by an operator"
    ));

    db.take_intake().await;
    sql(
        &db,
        &format!(
            "UPDATE outbox_tasks SET state = 'completed', claimed_by = NULL, finished_at = now() \
             WHERE id = {head}"
        ),
    )
    .await;
    assert!(matches!(
        &reasons(&db, head).await[..],
        [Reason::Completed {
            finished_at: Some(_)
        }]
    ));
    // Completed behind the engine's back (raw SQL): nobody handed the key
    // on, and explain says maintenance will.
    assert_eq!(
        reasons(&db, behind).await,
        vec![Reason::BehindKey {
            key: "acct-1".to_owned(),
            holder: None,
            holder_state: None,
        }]
    );
    sql(&db, "SELECT outbox_key_advance('ordered', 'acct-1')").await;
    assert_eq!(reasons(&db, behind).await, vec![Reason::Due { ahead: 0 }]);

    // Gone workers do not count.
    sql(
        &db,
        "UPDATE outbox_workers SET expires_at = now() - interval '1 second'",
    )
    .await;
    assert_eq!(
        reasons(&db, behind).await,
        vec![Reason::NoLiveWorker {
            queue: "ordered".to_owned()
        }]
    );
    assert!(
        admin::explain_task(&db.pool, TaskId(999_999))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn queue_settings_out_of_range_are_refused_before_anything_is_written() {
    let db = TestDb::migrated().await;
    for change in [
        QueueChange {
            global_concurrency: Some(Some(0)),
            ..QueueChange::default()
        },
        QueueChange {
            rate_per_second: Some(Some(f64::NAN)),
            ..QueueChange::default()
        },
        QueueChange {
            rate_per_second: Some(Some(0.0)),
            ..QueueChange::default()
        },
        QueueChange {
            per_key_concurrency: Some(-1),
            ..QueueChange::default()
        },
    ] {
        let err = admin::set_queue(&db.pool, "q", &change).await.unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
    }
    assert!(
        admin::set_queue(&db.pool, "bad queue name!", &QueueChange::default())
            .await
            .is_err()
    );
    assert!(admin::list_queues(&db.pool).await.unwrap().is_empty());
}
