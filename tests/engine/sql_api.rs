//! outbox_submit and outbox_emit: tasks and events written from SQL get
//! what the Rust API gives them (the type's declared defaults, the same
//! unique and ordering keys, delays, a NOTIFY at commit, the aggregate's
//! commit order, emit-once ids), from psql too, and bad input is refused
//! with SQLSTATE 22023 and nothing written.

use std::time::Duration;

use outbox::relay::Relay;
use outbox::{TaskEventKind, TaskId, Worker, outbox_task};
use outbox_tests::sinks::Capture;
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgListener;

/// Unique by two fields, with attempts and a priority of its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.sql.invoice", queue = "sql-tests", priority = 3,
              retry_delays = ["1s", "1s"], unique_by = ["order_id", "kind"], unique_states = ["pending", "processing", "retrying", "completed"])]
struct SqlInvoice {
    order_id: i64,
    kind: String,
}

/// Ordered by its account.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.sql.step",
    queue = "sql-tests",
    ordering_key = "account"
)]
struct SqlStep {
    account: i64,
    n: i64,
}

/// One per hour, with no key fields: Rust's key is `null`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.sql.hourly",
    queue = "sql-tests",
    unique_period = "1h"
)]
struct SqlHourly {}

/// Ordered by a field renamed in JSON: SQL cannot find it by its Rust name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.sql.renamed",
    queue = "sql-tests",
    ordering_key = "account_id"
)]
struct SqlRenamed {
    #[serde(rename = "accountId")]
    account_id: i64,
}

struct Done;

impl outbox::TaskHandler<SqlInvoice> for Done {
    async fn handle(&self, _: outbox::TaskContext, _: SqlInvoice) -> outbox::HandlerResult {
        Ok(outbox::Outcome::Success)
    }
}

impl outbox::TaskHandler<SqlStep> for Done {
    async fn handle(&self, _: outbox::TaskContext, _: SqlStep) -> outbox::HandlerResult {
        Ok(outbox::Outcome::Success)
    }
}

impl outbox::TaskHandler<SqlHourly> for Done {
    async fn handle(&self, _: outbox::TaskContext, _: SqlHourly) -> outbox::HandlerResult {
        Ok(outbox::Outcome::Success)
    }
}

impl outbox::TaskHandler<SqlRenamed> for Done {
    async fn handle(&self, _: outbox::TaskContext, _: SqlRenamed) -> outbox::HandlerResult {
        Ok(outbox::Outcome::Success)
    }
}

fn worker(pool: &PgPool) -> RunningWorker {
    RunningWorker::start(
        Worker::builder(pool.clone())
            .handler::<SqlInvoice>(Done)
            .handler::<SqlStep>(Done)
            .handler::<SqlHourly>(Done)
            .handler::<SqlRenamed>(Done)
            .poll_interval(Duration::from_millis(100))
            .build()
            .unwrap(),
    )
}

/// Waits until a worker has declared this binary's task types.
async fn declared(pool: &PgPool) {
    outbox_tests::process::wait_until(
        pool,
        "SELECT count(*) = 4 FROM outbox_task_types WHERE task_type LIKE 'test.sql.%'",
        Duration::from_secs(60),
    )
    .await;
}

async fn submit_sql(
    pool: &PgPool,
    task_type: &str,
    payload: serde_json::Value,
    options: serde_json::Value,
) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT outbox_submit($1, $2, $3)")
        .bind(task_type)
        .bind(payload)
        .bind(options)
        .fetch_one(pool)
        .await
}

#[tokio::test]
async fn a_task_from_sql_takes_its_types_declaration_and_the_keys_rust_would_give_it() {
    let db = TestDb::migrated().await;
    let mut running = worker(&db.pool);
    declared(&db.pool).await;
    let declared: (String, i16, i32, Vec<String>, i16, Option<String>) = sqlx::query_as(
        "SELECT queue, priority, max_attempts, unique_fields, unique_states, \
         (SELECT ordering_field FROM outbox_task_types WHERE task_type = 'test.sql.step') \
         FROM outbox_task_types WHERE task_type = 'test.sql.invoice'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        declared,
        (
            "sql-tests".into(),
            3,
            2,
            vec!["order_id".into(), "kind".into()],
            15,
            Some("account".into())
        )
    );

    // The same task from Rust and from SQL is one task: the keys agree,
    // escapes and all.
    let kind = "a \"quoted\" kind, é\n";
    let from_rust = outbox::submit(
        &mut *db.conn().await,
        SqlInvoice {
            order_id: 7,
            kind: kind.into(),
        },
    )
    .await
    .unwrap();
    let payload = json!({"order_id": 7, "kind": kind});
    let from_sql = submit_sql(&db.pool, "test.sql.invoice", payload.clone(), json!({}))
        .await
        .unwrap();
    assert_eq!(
        TaskId(from_sql),
        from_rust,
        "a duplicate names the task holding the key"
    );
    let other = submit_sql(
        &db.pool,
        "test.sql.invoice",
        json!({"order_id": 8, "kind": kind}),
        json!({}),
    )
    .await
    .unwrap();
    assert_ne!(other, from_sql);
    let row: (String, i16, i32) =
        sqlx::query_as("SELECT queue, priority, max_attempts FROM outbox_tasks WHERE id = $1")
            .bind(other)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(row, ("sql-tests".into(), 3, 2));

    // One per period with no key fields: the same key as Rust's (in one
    // transaction, so the worker cannot finish the first in between).
    let mut tx = db.pool.begin().await.unwrap();
    let hourly = outbox::submit(&mut tx, SqlHourly {}).await.unwrap();
    let hourly_sql: i64 = sqlx::query_scalar("SELECT outbox_submit('test.sql.hourly', '{}')")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(TaskId(hourly_sql), hourly);

    // The ordering key from its field, as Rust's to_string writes it.
    let step = submit_sql(
        &db.pool,
        "test.sql.step",
        json!({"account": 42, "n": 1}),
        json!({}),
    )
    .await
    .unwrap();
    let rust_step = outbox::submit(&mut *db.conn().await, SqlStep { account: 42, n: 2 })
        .await
        .unwrap();
    let keys: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT ordering_key FROM outbox_all_tasks WHERE id = ANY($1) ORDER BY id",
    )
    .bind([step, rust_step.0])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(keys, [Some("42".to_owned()), Some("42".to_owned())]);

    running
        .wait_for(TaskEventKind::Completed, 5, Duration::from_secs(60))
        .await;
    // unique_states = ["completed"]: still a duplicate once done.
    let again = submit_sql(&db.pool, "test.sql.invoice", payload, json!({}))
        .await
        .unwrap();
    assert_eq!(again, from_sql);
    running.stop().await;
}

#[tokio::test]
async fn options_set_queue_delay_run_at_keys_and_a_due_task_notifies_at_commit() {
    let db = TestDb::migrated().await;
    let mut listener = PgListener::connect(&db.url).await.unwrap();
    listener.listen("outbox_tasks").await.unwrap();

    // Undeclared types need a queue; then defaults apply.
    let mut tx = db.pool.begin().await.unwrap();
    let id: i64 = sqlx::query_scalar(
        "SELECT outbox_submit('mail.send', '{\"to\": \"a@example.com\"}', '{\"queue\": \"mail\", \"priority\": 9}')",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let note = tokio::time::timeout(Duration::from_secs(60), listener.recv())
        .await
        .expect("a NOTIFY at commit")
        .unwrap();
    assert_eq!(note.payload(), "mail");
    // notify: false sends none: the next notification is a later commit's.
    for (queue, notify) in [("quiet", false), ("loud", true)] {
        submit_sql(
            &db.pool,
            "mail.send",
            json!({}),
            json!({"queue": queue, "notify": notify}),
        )
        .await
        .unwrap();
    }
    let note = tokio::time::timeout(Duration::from_secs(60), listener.recv())
        .await
        .expect("a NOTIFY at commit")
        .unwrap();
    assert_eq!(note.payload(), "loud");
    let row: (String, i16, i32, bool) = sqlx::query_as(
        "SELECT queue, priority, max_attempts, execute_at <= now() FROM outbox_tasks WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(row, ("mail".into(), 9, 10, true));

    let mut later = Vec::new();
    for options in [
        json!({"queue": "mail", "delay": 3600}),
        json!({"queue": "mail", "delay": "2 hours"}),
        json!({"queue": "mail", "run_at": "2100-01-01T00:00:00Z"}),
    ] {
        let id = submit_sql(&db.pool, "mail.send", json!({}), options)
            .await
            .unwrap();
        let (after, at): (f64, chrono::DateTime<chrono::Utc>) = sqlx::query_as(
            "SELECT extract(epoch FROM execute_at - created_at)::float8, execute_at \
             FROM outbox_tasks WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        later.push((after, at));
    }
    assert!(
        (later[0].0 - 3600.0).abs() < 5.0 && (later[1].0 - 7200.0).abs() < 5.0,
        "{later:?}"
    );
    assert_eq!(later[2].1.to_rfc3339(), "2100-01-01T00:00:00+00:00");

    // An explicit unique key and ordering key, as TaskOptions gives them.
    let options = json!({"queue": "mail", "unique_key": "welcome-7", "ordering_key": "user-7"});
    let first = submit_sql(&db.pool, "mail.send", json!({}), options.clone())
        .await
        .unwrap();
    let second = submit_sql(&db.pool, "mail.send", json!({}), options)
        .await
        .unwrap();
    assert_eq!(first, second);
    let keys: (Option<String>, Option<String>) =
        sqlx::query_as("SELECT unique_key, ordering_key FROM outbox_tasks WHERE id = $1")
            .bind(first)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        keys,
        (Some("mail.send:welcome-7".into()), Some("user-7".into()))
    );

    // An attempt budget of its own, as TaskOptions::max_attempts gives it;
    // a whole number written as 3.0 (jsonb keeps it so) is that number.
    for (options, expected) in [
        (json!({"queue": "mail", "max_attempts": 1}), (1, 0)),
        (
            json!({"queue": "mail", "max_attempts": 3.0, "priority": 4.0}),
            (3, 4),
        ),
    ] {
        let id = submit_sql(&db.pool, "mail.send", json!({}), options)
            .await
            .unwrap();
        let row: (i32, i16) =
            sqlx::query_as("SELECT max_attempts, priority FROM outbox_tasks WHERE id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(row, expected);
    }
}

#[tokio::test]
async fn bad_submits_are_refused_with_what_is_wrong_and_write_nothing() {
    let db = TestDb::migrated().await;
    // Options of an undeclared type, each with what the refusal must say.
    let cases: &[(serde_json::Value, &str)] = &[
        (json!({}), "unknown task type 'mail.send'"),
        (json!({"queue": "m", "prio": 1}), "unknown option 'prio'"),
        (json!({"queue": "a b"}), "queue name 'a b' is invalid"),
        (
            json!({"queue": "m", "priority": 10}),
            "priority 10 is out of range: use 0 (first) to 9 (last)",
        ),
        (
            json!({"queue": "m", "priority": "3"}),
            "priority \"3\" is not a number: use 0 (first) to 9 (last)",
        ),
        (json!({"queue": "m", "delay": -1}), "out of range"),
        (json!({"queue": "m", "delay": "soon"}), "is not an interval"),
        (json!({"queue": "m", "delay": 1e12}), "too long"),
        (
            json!({"queue": "m", "delay": 1, "run_at": "2100-01-01"}),
            "not both",
        ),
        (
            json!({"queue": "m", "run_at": "tomorrow-ish"}),
            "not a timestamp",
        ),
        (
            json!({"queue": "m", "unique_key": "k", "unique_including": ["done"]}),
            "\"completed\" and \"dead\"",
        ),
        (
            json!({"queue": "m", "unique_key": "k", "unique_period": 0.5}),
            "is out of range: use 1 second to 36500 days",
        ),
        (
            json!({"queue": "m", "unique_key": "k", "unique_period": "1 century"}),
            "36500 days",
        ),
        (
            json!({"queue": "m", "unique_period": 60}),
            "need unique_key",
        ),
        (json!({"queue": "m", "ordering_key": ""}), "1 to 512 bytes"),
        (
            json!({"queue": "m", "unique_key": ""}),
            "a unique key cannot be empty: use 1 to 1024 bytes",
        ),
        (
            json!({"queue": "m", "notify": "no"}),
            "notify must be true or false",
        ),
        (json!({"queue": 5}), "option queue must be text"),
        (
            json!({"queue": "m", "unique_key": {"a": 1}}),
            "option unique_key must be text",
        ),
        (
            json!({"queue": "m", "unique_key": "k", "unique_including": [null]}),
            "\"completed\" and \"dead\"",
        ),
        (json!({"queue": "m", "delay": "36501 days"}), "out of range"),
        (
            json!({"queue": "m", "max_attempts": 0}),
            "max_attempts 0 is out of range: use 1 (no retry) to 10000",
        ),
        (
            json!({"queue": "m", "max_attempts": 10001}),
            "max_attempts 10001 is out of range",
        ),
        (
            json!({"queue": "m", "max_attempts": 1.5}),
            "max_attempts 1.5 is out of range",
        ),
        (
            json!({"queue": "m", "max_attempts": "3"}),
            "max_attempts \"3\" is out of range",
        ),
        (json!([1]), "options must be a JSON object"),
    ];
    let mut refused = Vec::new();
    for (options, expected) in cases {
        let err = submit_sql(&db.pool, "mail.send", json!({}), options.clone()).await;
        refused.push((err.expect_err(expected), *expected));
    }
    let err = submit_sql(&db.pool, "", json!({}), json!({"queue": "m"})).await;
    refused.push((err.expect_err("an empty type"), "task type is empty"));
    let err = submit_sql(&db.pool, "a type", json!({}), json!({"queue": "m"})).await;
    refused.push((
        err.expect_err("a bad type"),
        "task type 'a type' is invalid",
    ));
    for (err, expected) in refused {
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("22023"), "{db_err}");
        assert!(db_err.message().contains(expected), "{expected}: {db_err}");
    }
    // A declared type whose payload lacks a key field.
    let _declaring = worker(&db.pool);
    declared(&db.pool).await;
    let err = submit_sql(&db.pool, "test.sql.step", json!({"n": 1}), json!({}))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("payload field 'account', which is missing"),
        "{err}"
    );
    let err = submit_sql(
        &db.pool,
        "test.sql.invoice",
        json!({"order_id": [1], "kind": "a"}),
        json!({}),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("which is array"), "{err}");
    // A renamed key field: refused rather than guessed.
    let err = submit_sql(
        &db.pool,
        "test.sql.renamed",
        json!({"accountId": 1}),
        json!({}),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("give options.ordering_key"),
        "{err}"
    );
    assert_eq!(db.task_count().await, 0);
    // Given, it is taken.
    let given = json!({"ordering_key": "1", "delay": 3600});
    submit_sql(&db.pool, "test.sql.renamed", json!({"accountId": 1}), given)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_event_from_sql_is_published_like_one_from_rust_and_once_means_once() {
    let db = TestDb::migrated().await;
    let given = "6f1c2a4e-0b5d-4c7a-9e3f-2a1b0c9d8e7f";
    let mut tx = db.pool.begin().await.unwrap();
    let (id, position): (String, i64) = sqlx::query_as(
        "SELECT id::text, position FROM outbox_emit('order', '7', 'order.placed', '{\"total\": 990}', \
         '{\"tenant\": \"acme\"}')",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(&id[14..15], "7", "a made id is a UUIDv7: {id}");
    let once = format!(
        "SELECT id::text, position FROM outbox_emit('order', '7', 'order.paid', '{{}}', NULL, \
                        '{{\"id\": \"{given}\", \"once\": true}}')"
    );
    let first: (String, Option<i64>) = sqlx::query_as(sqlx::AssertSqlSafe(once.clone()))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(first.0, given);
    assert!(first.1.unwrap() > position);
    let retry: (String, Option<i64>) = sqlx::query_as(sqlx::AssertSqlSafe(once))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(retry, (given.to_owned(), None), "the retry writes nothing");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_event_log")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 2);

    let sink = Capture::default();
    let worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .relay(Relay::new("capture", sink.clone()).poll_interval(Duration::from_millis(5)))
            .build()
            .unwrap(),
    );
    let got = sink.wait_until("both published", |g| g.len() == 2).await;
    worker.stop().await;
    assert_eq!(
        (got[0].event_id.as_str(), got[1].event_id.as_str()),
        (id.as_str(), given)
    );
    assert_eq!(got[0].sequence, position);
    assert_eq!(got[0].payload, br#"{"total":990}"#);
    assert!(
        got[0]
            .headers
            .contains(&("tenant".to_owned(), "acme".to_owned()))
    );
}

/// An id given again with another event (from SQL or from Rust, either
/// way round) is refused with 22023 and nothing written; the same event
/// given its id again, its payload's keys in another order, writes nothing.
#[tokio::test]
async fn an_sql_once_refuses_an_id_recorded_for_another_event_from_sql_or_rust() {
    let db = TestDb::migrated().await;
    let once = |id: &str, event_type: &str, payload: serde_json::Value| {
        sqlx::query_as::<_, (String, Option<i64>)>(
            "SELECT id::text, position FROM outbox_emit('order', '3', $1, $2, NULL, \
             jsonb_build_object('id', $3::text, 'once', true))",
        )
        .bind(event_type.to_owned())
        .bind(payload)
        .bind(id.to_owned())
        .fetch_one(&db.pool)
    };
    let from_sql = "0193b9e0-0000-7000-8000-00000000000a";
    let first = once(from_sql, "order.placed", json!({"a": 1, "b": [2]}))
        .await
        .unwrap();
    assert!(first.1.is_some(), "written: {first:?}");
    let again = once(from_sql, "order.placed", json!({"b": [2], "a": 1}))
        .await
        .unwrap();
    assert_eq!(again.1, None, "the same event again writes nothing");
    let refused = |err: sqlx::Error| {
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("22023"), "{db_err}");
        assert!(
            db_err
                .message()
                .contains("emitted before for a different event"),
            "{db_err}"
        );
    };
    refused(
        once(from_sql, "order.placed", json!({"a": 2, "b": [2]}))
            .await
            .expect_err("another payload"),
    );
    refused(
        once(from_sql, "order.paid", json!({"a": 1, "b": [2]}))
            .await
            .expect_err("another type"),
    );
    // Rust's emit_once reads the digest SQL recorded.
    let mut conn = db.pool.acquire().await.unwrap();
    let rust = |id: &str, event_type: &str| {
        outbox::Event::new("order", "3", event_type, json!({"a": 1, "b": [2]})).id(id)
    };
    let same = outbox::events::emit_once(&mut conn, rust(from_sql, "order.placed"))
        .await
        .unwrap();
    assert!(same.is_none(), "Rust sees the SQL emit's event as the same");
    let err = outbox::events::emit_once(&mut conn, rust(from_sql, "order.shipped"))
        .await
        .expect_err("Rust refuses another event under the SQL emit's id");
    assert!(matches!(err, outbox::Error::InvalidEvent(_)), "{err}");
    // And SQL reads the digest Rust recorded.
    let from_rust = "0193b9e0-0000-7000-8000-00000000000b";
    outbox::events::emit_once(&mut conn, rust(from_rust, "order.placed"))
        .await
        .unwrap()
        .expect("written");
    let same = once(from_rust, "order.placed", json!({"a": 1, "b": [2]}))
        .await
        .unwrap();
    assert_eq!(same.1, None);
    refused(
        once(from_rust, "order.placed", json!({"a": 1}))
            .await
            .expect_err("another payload under Rust's id"),
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_event_log")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 2, "one event from each side, nothing else");
}

#[tokio::test]
async fn an_sql_emit_waits_for_an_open_rust_emit_of_its_aggregate_and_follows_it() {
    let db = TestDb::migrated().await;
    let mut open = db.pool.begin().await.unwrap();
    let from_rust = outbox::emit(
        &mut open,
        outbox::Event::new("order", "9", "order.placed", json!({})),
    )
    .await
    .unwrap();
    let pool = db.pool.clone();
    let from_sql = tokio::spawn(async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT position FROM outbox_emit('order', '9', 'order.paid', '{}')",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    });
    // It waits on the aggregate's lock while the Rust emitter is open.
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)",
        Duration::from_secs(60),
    )
    .await;
    assert!(!from_sql.is_finished());
    open.commit().await.unwrap();
    let position = from_sql.await.unwrap();
    assert!(
        position > from_rust.position,
        "drawn after the earlier commit"
    );
}

#[tokio::test]
async fn bad_emits_are_refused_with_what_is_wrong_and_write_nothing() {
    let db = TestDb::migrated().await;
    let cases: &[(&str, &str, serde_json::Value, serde_json::Value, &str)] = &[
        ("a/b", "1", json!(null), json!({}), "contains '/'"),
        ("", "1", json!(null), json!({}), "aggregate type is 0 bytes"),
        ("order", "1\n", json!(null), json!({}), "control character"),
        (
            "order",
            "1",
            json!({"sequence": "1"}),
            json!({}),
            "set by the relay itself",
        ),
        (
            "order",
            "1",
            json!({"bad name": "1"}),
            json!({}),
            "header name 'bad name'",
        ),
        (
            "order",
            "1",
            json!({"n": 1}),
            json!({}),
            "its value must be text",
        ),
        (
            "order",
            "1",
            json!(["x"]),
            json!({}),
            "headers must be a JSON object",
        ),
        (
            "order",
            "1",
            json!(null),
            json!({"id": "nope"}),
            "is not a UUID",
        ),
        (
            "order",
            "1",
            json!(null),
            json!({"id": "00000000-0000-0000-0000-000000000000"}),
            "is the nil UUID",
        ),
        (
            "order",
            "1",
            json!(null),
            json!({"stream": ""}),
            "its stream",
        ),
        (
            "order",
            "1",
            json!(null),
            json!({"delay": "400 days"}),
            "out of range",
        ),
        (
            "order",
            "1",
            json!(null),
            json!({"delay": "12 months 5 days"}),
            "out of range",
        ),
        (
            "order",
            "1",
            json!(null),
            json!({"stream": 5}),
            "option stream must be text",
        ),
        (
            "order",
            "1",
            json!({"traceparent": "garbage"}),
            json!({}),
            "header traceparent \"garbage\" is not a W3C trace context",
        ),
        (
            "order",
            "1",
            json!({"TraceParent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}),
            json!({}),
            "is not a W3C trace context",
        ),
        (
            "order",
            "1",
            json!({"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}),
            json!({}),
            "is not a W3C trace context",
        ),
        (
            "order",
            "1",
            json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}),
            json!({}),
            "is not a W3C trace context",
        ),
        (
            "order",
            "1",
            json!({"traceparent": " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}),
            json!({}),
            "is not a W3C trace context",
        ),
        (
            "order",
            "1",
            json!(null),
            json!({"once": "yes"}),
            "must be true or false",
        ),
        (
            "order",
            "1",
            json!(null),
            json!({"ordered": true}),
            "unknown option 'ordered'",
        ),
    ];
    for (aggregate_type, aggregate_id, headers, options, expected) in cases {
        let err = sqlx::query("SELECT * FROM outbox_emit($1, $2, 'order.placed', '{}', $3, $4)")
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(headers)
            .bind(options)
            .execute(&db.pool)
            .await
            .expect_err(expected);
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(
            db_err.code().as_deref(),
            Some("22023"),
            "{expected}: {db_err}"
        );
        assert!(db_err.message().contains(expected), "{expected}: {db_err}");
    }
    // An SQL NULL payload is refused, as outbox_submit's is (migration 53):
    // it emitted the body `null` to every consumer.
    let err = sqlx::query("SELECT * FROM outbox_emit('order', '1', 'order.placed', NULL)")
        .execute(&db.pool)
        .await
        .expect_err("a NULL payload");
    let db_err = err.as_database_error().expect("a database error");
    assert_eq!(db_err.code().as_deref(), Some("22023"), "{db_err}");
    assert!(
        db_err
            .message()
            .contains("the payload is null (give 'null'::jsonb for a JSON null"),
        "{db_err}"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_event_log")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    // The JSON null, given as such, is a payload like any other.
    let position: i64 = sqlx::query_scalar(
        "SELECT position FROM outbox_emit('order', '0', 'order.placed', 'null')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let payload: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM outbox_event_log WHERE position = $1")
            .bind(position)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(payload, json!(null));

    // A valid one, in any case of its name, is kept as given.
    let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    sqlx::query("SELECT outbox_emit('order', '1', 'order.placed', '{}', $1)")
        .bind(json!({ "Traceparent": valid }))
        .execute(&db.pool)
        .await
        .unwrap();
    let kept: String = sqlx::query_scalar(
        "SELECT headers ->> 'Traceparent' FROM outbox_event_log WHERE aggregateid = '1'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(kept, valid);
}

#[tokio::test]
async fn psql_submits_and_emits_in_one_transaction_and_a_worker_runs_the_task() {
    let db = TestDb::migrated().await;
    let mut running = worker(&db.pool);
    declared(&db.pool).await;
    let psql = outbox_worker::local_postgres::server_bin_dir()
        .map(|d| d.join("psql"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "psql".into());
    let script = "BEGIN;\n\
        CREATE TABLE invoices (id bigint PRIMARY KEY);\n\
        INSERT INTO invoices VALUES (11);\n\
        SELECT outbox_submit('test.sql.invoice', '{\"order_id\": 11, \"kind\": \"psql\"}');\n\
        SELECT position FROM outbox_emit('invoice', '11', 'invoice.created', '{\"id\": 11}');\n\
        COMMIT;\n";
    let file = std::env::temp_dir().join(format!("outbox-sql-api-{}.sql", std::process::id()));
    std::fs::write(&file, script).unwrap();
    let out = tokio::process::Command::new(&psql)
        // The URL without sqlx's own parameters, which psql refuses.
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            db.url.split('?').next().unwrap(),
            "-f",
        ])
        .arg(&file)
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {}: {e}", psql.display()));
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = running
        .wait_for(TaskEventKind::Completed, 1, Duration::from_secs(60))
        .await;
    let completed = events
        .iter()
        .find(|e| e.kind == TaskEventKind::Completed)
        .unwrap();
    assert_eq!(completed.task_type, "test.sql.invoice");
    running.stop().await;
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_event_log WHERE aggregateid = '11'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(events, 1);
}

#[tokio::test]
async fn a_worker_on_a_schema_without_the_sql_api_is_listed_and_declares_its_types_once_migrated() {
    let db = TestDb::empty().await;
    outbox::migrate_to(&db.pool, 13).await.unwrap();
    let config = outbox::WorkerConfig {
        heartbeat_interval: Duration::from_millis(200),
        ..outbox::WorkerConfig::default()
    };
    let running = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<SqlInvoice>(Done)
            .handler::<SqlStep>(Done)
            .handler::<SqlHourly>(Done)
            .handler::<SqlRenamed>(Done)
            .config(config)
            .build()
            .unwrap(),
    );
    // The declaration fails (no table), the worker's row does not.
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM outbox_workers",
        Duration::from_secs(60),
    )
    .await;
    outbox::migrate(&db.pool).await.unwrap();
    declared(&db.pool).await;
    running.stop().await;
}

/// `outbox_signal` (migration 49): the first signal of a name wins, a
/// finished or unknown task takes none, SQL's NULL is JSON's null, and a
/// bad name or a value too large is refused with 22023.
#[tokio::test]
async fn a_signal_sent_from_sql_is_recorded_once() {
    let db = TestDb::migrated().await;
    let task: i64 =
        sqlx::query_scalar("SELECT outbox_submit('outbox.noop', '{}', '{\"queue\": \"signals\"}')")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let send = |name: &'static str, value: Option<serde_json::Value>| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>("SELECT outbox_signal($1, $2, $3)")
                .bind(task)
                .bind(name)
                .bind(value)
                .fetch_one(&pool)
                .await
        }
    };
    assert!(send("approved", Some(json!({"by": "sql"}))).await.unwrap());
    assert!(
        !send("approved", Some(json!({"by": "again"})))
            .await
            .unwrap()
    );
    assert!(send("nothing", None).await.unwrap());
    let kept: Vec<(String, serde_json::Value)> = sqlx::query_as(
        "SELECT name, value FROM outbox_task_signals WHERE task_id = $1 ORDER BY name",
    )
    .bind(task)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        kept,
        [
            ("approved".to_owned(), json!({"by": "sql"})),
            ("nothing".to_owned(), serde_json::Value::Null)
        ]
    );
    let unknown: bool = sqlx::query_scalar("SELECT outbox_signal(987654, 'approved')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(!unknown);
    for (sql, expected) in [
        (
            "SELECT outbox_signal($1, '')",
            "must be 1 to 200 bytes long, got 0",
        ),
        (
            "SELECT outbox_signal($1, 'big', to_jsonb(repeat('x', 70000)))",
            "the most kept is 65536",
        ),
    ] {
        let err = sqlx::query(sql)
            .bind(task)
            .execute(&db.pool)
            .await
            .expect_err(expected);
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("22023"), "{db_err}");
        assert!(db_err.message().contains(expected), "{expected}: {db_err}");
    }
}
