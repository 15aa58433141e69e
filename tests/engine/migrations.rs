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
