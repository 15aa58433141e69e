//! An application role with exactly the grants the guide lists (section
//! 12, "The application's role"), and nothing else: it submits (plain,
//! unique, keyed, in batches, workflows), emits (ordered, unordered, once)
//! and signals, from Rust and through the SQL functions. The grants are
//! read from the guide itself, so a table a new migration makes the write
//! path touch fails here until the guide lists it.

use outbox::{Event, Workflow, outbox_task};
use outbox_tests::TestDb;
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions as _, Connection as _};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.app.plain", queue = "app-role")]
struct AppPlain {
    n: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.app.unique", queue = "app-role", unique_by = ["order"],
              unique_states = ["pending", "processing", "retrying", "completed"])]
struct AppUnique {
    order: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.app.keyed",
    queue = "app-role",
    ordering_key = "account"
)]
struct AppKeyed {
    account: i64,
}

/// The guide's GRANT block, for `role`.
fn guide_grants(role: &str) -> String {
    let guide = include_str!("../../docs/guide.md");
    let start = guide
        .find("```sql\n-- The application role's grants")
        .expect("the guide's block of the application role's grants");
    let block = &guide[start + "```sql\n".len()..];
    let block = &block[..block.find("```").expect("the block's end")];
    assert!(block.contains(" TO app;"), "{block}");
    block.replace(" TO app;", &format!(" TO {role};"))
}

/// A role of its own (roles are the cluster's), dropped at the end.
struct Role {
    name: String,
    admin: sqlx::PgPool,
}

impl Role {
    async fn drop(self) {
        for sql in [
            format!("DROP OWNED BY {}", self.name),
            format!("DROP ROLE {}", self.name),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&self.admin)
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn an_application_role_with_the_guides_grants_submits_emits_and_signals() {
    let db = TestDb::migrated().await;
    let name = format!("outbox_test_app_{}_{}", std::process::id(), rand_suffix());
    let created = sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {name} LOGIN PASSWORD 'app-secret' NOSUPERUSER NOINHERIT"
    )))
    .execute(&db.pool)
    .await;
    if let Err(e) = created {
        // A DATABASE_URL of a role that cannot make roles: nothing to try.
        assert!(
            std::env::var_os("DATABASE_URL").is_some(),
            "the harness's own server refused a role: {e}"
        );
        eprintln!("skipping: cannot create a role here: {e}");
        return;
    }
    let role = Role {
        name: name.clone(),
        admin: db.pool.clone(),
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(guide_grants(&name)))
        .execute(&db.pool)
        .await
        .expect("the guide's grants apply");
    let options: PgConnectOptions = db.url.parse().unwrap();
    let mut app: PgConnection = options
        .username(&name)
        .password("app-secret")
        .connect()
        .await
        .expect("the role connects");

    // From Rust, in one transaction of the application's.
    let mut tx = app.begin().await.unwrap();
    let plain = outbox::submit(&mut tx, AppPlain { n: 1 }).await.unwrap();
    let unique = outbox::submit(&mut tx, AppUnique { order: 7 })
        .await
        .unwrap();
    let again = outbox::submit(&mut tx, AppUnique { order: 7 })
        .await
        .unwrap();
    assert_eq!(unique, again, "a duplicate returns the holder's id");
    outbox::submit(&mut tx, AppKeyed { account: 1 })
        .await
        .unwrap();
    outbox::submit(&mut tx, AppKeyed { account: 1 })
        .await
        .unwrap();
    let mut batch = outbox::Batch::new();
    batch
        .push(&AppPlain { n: 2 })
        .unwrap()
        .push(&AppUnique { order: 8 })
        .unwrap()
        .push(&AppKeyed { account: 2 })
        .unwrap();
    assert_eq!(batch.submit(&mut tx).await.unwrap().len(), 3);
    outbox::emit(&mut tx, Event::new("order", "7", "order.placed", 1))
        .await
        .unwrap();
    outbox::emit_all(
        &mut tx,
        vec![
            Event::new("order", "7", "order.paid", 2),
            Event::new("order", "8", "order.placed", 3).unordered(),
        ],
    )
    .await
    .unwrap();
    let once =
        Event::new("order", "9", "order.placed", 4).id("0191f0a0-0000-7000-8000-0000000000a1");
    assert!(
        outbox::emit_once(&mut tx, once.clone())
            .await
            .unwrap()
            .is_some()
    );
    assert!(outbox::emit_once(&mut tx, once).await.unwrap().is_none());
    assert!(outbox::signal(&mut tx, plain, "go", &1).await.unwrap());
    let mut flow = Workflow::new("app's");
    flow.add("a", &AppPlain { n: 3 })
        .unwrap()
        .add_after("b", &["a"], &AppPlain { n: 4 })
        .unwrap();
    flow.submit(&mut tx).await.unwrap();
    tx.commit().await.unwrap();

    // From SQL, as another language's service would.
    let mut tx = app.begin().await.unwrap();
    for sql in [
        "SELECT outbox_submit('test.app.plain', '{\"n\": 5}', '{\"queue\": \"app-role\"}')",
        "SELECT outbox_submit('test.app.plain', '{\"n\": 6}', \
         '{\"queue\": \"app-role\", \"unique_key\": \"u\", \"unique_including\": [\"completed\", \"dead\"]}')",
        "SELECT outbox_submit('test.app.plain', '{\"n\": 7}', \
         '{\"queue\": \"app-role\", \"unique_key\": \"p\", \"unique_period\": \"1h\"}')",
        "SELECT outbox_submit('test.app.keyed', '{\"account\": 3}', \
         '{\"queue\": \"app-role\", \"ordering_key\": \"3\"}')",
        "SELECT outbox_submit('test.app.keyed', '{\"account\": 3}', \
         '{\"queue\": \"app-role\", \"ordering_key\": \"3\"}')",
        "SELECT * FROM outbox_emit('order', '10', 'order.placed', '{}')",
        "SELECT * FROM outbox_emit('order', '10', 'order.paid', '{}', NULL, '{\"unordered\": true}')",
        "SELECT * FROM outbox_emit('order', '11', 'order.placed', '{}', NULL, \
         '{\"once\": true, \"id\": \"0191f0a0-0000-7000-8000-0000000000a2\"}')",
        "SELECT * FROM outbox_emit('order', '11', 'order.placed', '{}', NULL, \
         '{\"once\": true, \"id\": \"0191f0a0-0000-7000-8000-0000000000a2\"}')",
        "SELECT * FROM outbox_emit('order', '12', 'order.placed', '{}', NULL, '{\"delay\": 60}')",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let signalled: bool = sqlx::query_scalar("SELECT outbox_signal($1, 'sql', '2')")
        .bind(plain.0)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert!(signalled);
    tx.commit().await.unwrap();
    app.close().await.unwrap();

    let (tasks, events): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM outbox_tasks WHERE queue = 'app-role') \
                + (SELECT count(*) FROM outbox_intake WHERE queue = 'app-role'), \
                (SELECT count(*) FROM outbox_event_log)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // Rust: 1 + 1 + 2 + 3 + the workflow's first step (the second waits
    // for it); SQL: 5.
    assert_eq!(tasks, 13);
    // Rust: 1 + 2 + 1; SQL: 2 + 1 + 1.
    assert_eq!(events, 8);
    role.drop().await;
}

/// A few random letters, so that two test runs on one server do not take
/// the same role name.
fn rand_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{nanos:x}")
}
