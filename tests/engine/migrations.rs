//! Migrations: embedded, recorded, idempotent, safe to run concurrently.

use outbox_tests::TestDb;

#[tokio::test]
async fn migrating_twice_is_a_no_op() {
    let db = TestDb::empty().await;
    let before = outbox::schema_status(&db.pool).await.unwrap();
    assert_eq!(before.current, 0);
    assert!(!before.is_up_to_date());

    let first = outbox::migrate(&db.pool).await.unwrap();
    assert_eq!(
        first.applied,
        (1..=outbox::latest_version()).collect::<Vec<_>>()
    );
    let second = outbox::migrate(&db.pool).await.unwrap();
    assert!(second.applied.is_empty());
    assert_eq!(second.current, outbox::latest_version());
    assert!(
        outbox::schema_status(&db.pool)
            .await
            .unwrap()
            .is_up_to_date()
    );
}

#[tokio::test]
async fn concurrent_migrations_from_separate_pools_are_safe() {
    let db = TestDb::empty().await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        let pool = TestDb::pool_on(&db.url, 2).await;
        runs.push(tokio::spawn(async move { outbox::migrate(&pool).await }));
    }
    let mut results = Vec::new();
    for run in runs {
        results.push(run.await.unwrap());
    }
    let applied: usize = results
        .iter()
        .map(|r| r.as_ref().unwrap().applied.len())
        .sum();
    assert_eq!(
        applied,
        outbox::MIGRATIONS.len(),
        "each migration applied exactly once: {results:?}"
    );
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_migrations")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(recorded, outbox::MIGRATIONS.len() as i64);
}

#[tokio::test]
async fn a_database_from_a_newer_build_is_refused() {
    let db = TestDb::migrated().await;
    sqlx::query("INSERT INTO outbox_migrations (version, name, checksum) VALUES (9999, 'from_the_future', 'x')")
        .execute(&db.pool)
        .await
        .unwrap();
    let err = outbox::migrate(&db.pool).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("has migration 9999, which this build does not know"),
        "{err}"
    );
}

#[derive(serde::Serialize, serde::Deserialize)]
#[outbox::outbox_task(task_type = "test.migrations.waiting", queue = "migration-tests")]
struct Waiting {}

struct Done;

impl outbox::TaskHandler<Waiting> for Done {
    async fn handle(&self, _: outbox::TaskContext, _: Waiting) -> outbox::HandlerResult {
        Ok(outbox::Outcome::Success)
    }
}

/// A worker started on a schema one migration behind its build claims
/// nothing (its statements may call what only the last migration made; an
/// outcome failing so would record a success as a failed attempt), shows
/// itself alive meanwhile and stops when asked; another, waiting the same
/// way, runs the task once the schema is migrated, on its first attempt.
#[tokio::test]
async fn a_worker_on_a_schema_behind_its_build_claims_nothing_until_migrated() {
    use std::time::Duration;
    let db = TestDb::empty().await;
    outbox::migrate_to(&db.pool, outbox::latest_version() - 1)
        .await
        .unwrap();
    let id = outbox::submit(&mut *db.conn().await, Waiting {})
        .await
        .unwrap()
        .0;
    let config = outbox::WorkerConfig {
        heartbeat_interval: Duration::from_millis(100),
        ..outbox::WorkerConfig::default()
    };
    let running = outbox_tests::RunningWorker::start(
        outbox::Worker::builder(db.pool.clone())
            .handler::<Waiting>(Done)
            .config(config)
            .build()
            .unwrap(),
    );
    // Alive for a second by its own renewals: a worker that claimed at
    // start would have run the task by then.
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM outbox_workers \
         WHERE last_seen_at > started_at + interval '1 second'",
        Duration::from_secs(60),
    )
    .await;
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks WHERE id = $1 AND state = 'pending' AND claims = 0",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        pending, 1,
        "nothing is claimed on a schema behind the build"
    );
    // A worker waiting for its schema stops when asked.
    tokio::time::timeout(Duration::from_secs(60), running.stop())
        .await
        .expect("a waiting worker stops");

    let mut running = outbox_tests::RunningWorker::start(
        outbox::Worker::builder(db.pool.clone())
            .handler::<Waiting>(Done)
            .build()
            .unwrap(),
    );
    outbox::migrate(&db.pool).await.unwrap();
    running
        .wait_for(outbox::TaskEventKind::Completed, 1, Duration::from_secs(60))
        .await;
    running.stop().await;
    let attempts: i32 = sqlx::query_scalar("SELECT claims FROM outbox_all_tasks WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(attempts, 1);
}

/// A worker whose role may not read `outbox_migrations` cannot know the
/// schema's version: it claims as it would without the check, rather than
/// never.
#[tokio::test]
async fn a_worker_that_may_not_read_the_schema_version_claims_all_the_same() {
    use std::time::Duration;
    let db = TestDb::migrated().await;
    let role = db.role_without("outbox_migrations").await;
    let pool = role.pool.clone();
    let refused = outbox::schema_status(&pool).await.unwrap_err();
    assert!(
        refused.to_string().contains("permission denied"),
        "{refused}"
    );
    outbox::submit(&mut *db.conn().await, Waiting {})
        .await
        .unwrap();
    let config = outbox::WorkerConfig {
        maintenance: false,
        ..outbox::WorkerConfig::default()
    };
    let mut running = outbox_tests::RunningWorker::start(
        outbox::Worker::builder(pool.clone())
            .handler::<Waiting>(Done)
            .config(config)
            .build()
            .unwrap(),
    );
    running
        .wait_for(outbox::TaskEventKind::Completed, 1, Duration::from_secs(60))
        .await;
    running.stop().await;
    role.drop_role().await;
}

/// A pool on `db` whose sessions carry `name` as their application_name.
async fn named_pool(db: &TestDb, name: &str) -> sqlx::PgPool {
    let options: sqlx::postgres::PgConnectOptions = db.url.parse().unwrap();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.application_name(name))
        .await
        .unwrap()
}

/// A migration that alters a table a long transaction has read waits for
/// its lock at most `lock_timeout` at a time. Statements on that table
/// get through between its tries (without the timeout they would queue
/// behind the waiting migration for as long as the transaction stays
/// open), it gives up after `retry_for` with an error naming the
/// migration and changing nothing, and it is applied once the transaction
/// ends. A second `migrate` meanwhile waits for the first's whole retry,
/// away from the table (taking turns at it, the two would keep it
/// blocked), and then finds nothing to apply.
#[tokio::test]
async fn a_migration_behind_a_long_transaction_holds_nothing_up_and_tries_again() {
    use std::time::Duration;
    let (db, holder) = TestDb::held_before_migration_43().await;

    let brief = outbox::MigrateOptions {
        lock_timeout: Duration::from_millis(200),
        retry_for: Duration::from_secs(2),
    };
    let gave_up = outbox::migrate_with(&db.pool, outbox::latest_version(), brief);
    let err = tokio::time::timeout(Duration::from_secs(60), gave_up)
        .await
        .expect("the migration gives up after retry_for")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("migration 43 (runs_held_in_place) waited for a lock")
            && err.contains("changing nothing"),
        "{err}"
    );
    assert_eq!(outbox::schema_status(&db.pool).await.unwrap().current, 42);

    let patient = outbox::MigrateOptions {
        lock_timeout: Duration::from_millis(200),
        retry_for: Duration::from_secs(600),
    };
    let spawn_migrate = |pool: sqlx::PgPool| {
        tokio::spawn(
            async move { outbox::migrate_with(&pool, outbox::latest_version(), patient).await },
        )
    };
    let first = spawn_migrate(named_pool(&db, "migrate-first").await);
    // Each session's locks on the task table, and its advisory lock waits.
    let locks = |name: &str| {
        format!(
            "SELECT count(*) FILTER (WHERE l.relation = 'outbox_tasks'::regclass), \
                    count(*) FILTER (WHERE l.locktype = 'advisory' AND NOT l.granted) \
             FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = '{name}'"
        )
    };
    let waits_for_table = format!(
        "SELECT table_locks > 0 FROM ({}) AS l(table_locks, advisory_waits)",
        locks("migrate-first")
    );
    outbox_tests::process::wait_until(&db.pool, &waits_for_table, Duration::from_secs(60)).await;
    let second = spawn_migrate(named_pool(&db, "migrate-second").await);
    let waits_for_first = format!(
        "SELECT advisory_waits = 1 FROM ({}) AS l(table_locks, advisory_waits)",
        locks("migrate-second")
    );
    outbox_tests::process::wait_until(&db.pool, &waits_for_first, Duration::from_secs(60)).await;
    for _ in 0..10 {
        let read =
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox_tasks").fetch_one(&db.pool);
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("a read of the table gets through while the migration waits")
            .unwrap();
        let (table_locks, _): (i64, i64) =
            sqlx::query_as(sqlx::AssertSqlSafe(locks("migrate-second")))
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(
            table_locks, 0,
            "the second migrate keeps away from the table"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!first.is_finished(), "the migration waits for the lock");
    holder.commit().await.unwrap();
    let report = tokio::time::timeout(Duration::from_secs(120), first)
        .await
        .expect("applied once the transaction ended")
        .unwrap()
        .unwrap();
    assert_eq!(report.current, outbox::latest_version());
    assert_eq!(report.applied.first(), Some(&43));
    let after = tokio::time::timeout(Duration::from_secs(120), second)
        .await
        .expect("the second migrate ends after the first")
        .unwrap()
        .unwrap();
    assert!(after.applied.is_empty(), "{after:?}");
}

/// Lock timeouts outside 1 ms to 1 h are refused before anything runs.
#[tokio::test]
async fn a_lock_timeout_out_of_range_is_refused() {
    let db = TestDb::empty().await;
    for lock_timeout in [
        std::time::Duration::ZERO,
        std::time::Duration::from_secs(3601),
    ] {
        let options = outbox::MigrateOptions {
            lock_timeout,
            ..outbox::MigrateOptions::default()
        };
        let err = outbox::migrate_with(&db.pool, outbox::latest_version(), options)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("use 1ms to 1h"), "{err}");
    }
    assert_eq!(outbox::schema_status(&db.pool).await.unwrap().current, 0);
}

/// Migration 40 as builds 7aa706c to ae25e2e applied it, before it was
/// edited (outbox_event_digest and the nil-UUID check came after).
const MIGRATION_40_AS_RELEASED: &str = include_str!("fixtures/0040_as_released_by_7aa706c.sql");

/// A database at migration 40 as those builds left it, with `extra` rows
/// recorded after it.
async fn at_the_released_40(extra: &[i64]) -> TestDb {
    let db = TestDb::empty().await;
    outbox::migrate_to(&db.pool, 39).await.unwrap();
    sqlx::raw_sql(MIGRATION_40_AS_RELEASED)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox_migrations (version, name, checksum) \
         VALUES (40, 'sql_emit_once_digest', '9fa93177cece1957')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    for v in extra {
        // Recorded as applied by this build (FNV-1a of its text, as
        // migrate.rs checks), without running it.
        let m = outbox::MIGRATIONS
            .iter()
            .find(|m| m.version == *v)
            .expect("a migration of this build");
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in m.up.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        sqlx::query("INSERT INTO outbox_migrations (version, name, checksum) VALUES ($1, $2, $3)")
            .bind(v)
            .bind(m.name)
            .bind(format!("{hash:016x}"))
            .execute(&db.pool)
            .await
            .unwrap();
    }
    db
}

/// A database migrated by a build whose migration 40 was later edited is
/// brought up to this build's text and migrated on, where it was refused
/// for good ("applied to the database differs from this build's"): a
/// rolling upgrade from those builds had no way forward.
#[tokio::test]
async fn a_database_at_an_earlier_text_of_migration_40_is_brought_up_to_date() {
    let db = at_the_released_40(&[]).await;
    let report = outbox::migrate(&db.pool).await.expect("migrated on");
    assert_eq!(report.current, outbox::latest_version());
    assert_eq!(report.applied.first(), Some(&41));
    let digest: String =
        sqlx::query_scalar("SELECT outbox_event_digest('order', '1', 'placed', '{}')")
            .fetch_one(&db.pool)
            .await
            .expect("the function the edit added");
    assert_eq!(digest.len(), 32);
    // Recorded as this build's text: the next migrate finds nothing amiss.
    let again = outbox::migrate(&db.pool).await.expect("nothing to do");
    assert!(again.applied.is_empty());

    // Over a database that applied something after it, it is refused.
    let later = at_the_released_40(&[41]).await;
    let refused = outbox::migrate(&later.pool).await.expect_err("refused");
    assert!(
        refused.to_string().contains(
            "migration 40 (sql_emit_once_digest) applied to the database is an earlier text"
        ),
        "{refused}"
    );
}
