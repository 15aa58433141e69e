//! The `queues`, `workers` and `tasks explain` commands and
//! `tasks submit --ordering-key`, through the real binary.

use outbox_tests::TestDb;
use serde_json::Value;

mod common;

use common::{cli, ok};

#[tokio::test]
async fn queues_are_paused_resumed_limited_and_listed() {
    let db = TestDb::migrated().await;
    let url = db.url.as_str();
    // A queue no worker serves and no task names: a typo, unless --create.
    let set_mail = |create: bool| {
        let mut args = vec![
            "queues",
            "set",
            "mail",
            "--global-concurrency",
            "3",
            "--rate",
            "120/m",
            "--per-key-concurrency",
            "2",
            "--database-url",
            url,
        ];
        if create {
            args.push("--create");
        }
        args
    };
    for unknown in [
        set_mail(false),
        vec!["queues", "pause", "mail", "--database-url", url],
        vec!["queues", "resume", "mail", "--database-url", url],
    ] {
        let out = cli(&unknown).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{unknown:?}: {err}");
        assert!(
            err.contains("no queue named \"mail\"") && err.contains("--create"),
            "{err}"
        );
    }
    let none: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_queues")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(none, 0, "a refused command wrote a queue");
    let set = ok(&cli(&set_mail(true)).await);
    assert!(
        set.contains("global concurrency 3, rate 2/s, per-key concurrency 2"),
        "{set}"
    );
    // The same rate set again keeps the bucket (an empty one stays empty: a
    // fresh bucket would grant a fresh burst); a new rate starts afresh.
    sqlx::query("UPDATE outbox_queues SET rate_tokens = 0, rate_filled_at = now()")
        .execute(&db.pool)
        .await
        .unwrap();
    let tokens = || async {
        sqlx::query_scalar::<_, Option<f64>>("SELECT rate_tokens FROM outbox_queues")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    ok(&cli(&[
        "queues",
        "set",
        "mail",
        "--rate",
        "2/s",
        "--database-url",
        url,
    ])
    .await);
    assert_eq!(tokens().await, Some(0.0));
    ok(&cli(&[
        "queues",
        "set",
        "mail",
        "--rate",
        "3/s",
        "--database-url",
        url,
    ])
    .await);
    assert_eq!(tokens().await, None);
    ok(&cli(&[
        "queues",
        "set",
        "mail",
        "--rate",
        "2/s",
        "--database-url",
        url,
    ])
    .await);
    assert!(
        ok(&cli(&["queues", "pause", "mail", "--database-url", url]).await).contains("paused mail")
    );
    let listed: Value = serde_json::from_str(&ok(&cli(&[
        "queues",
        "list",
        "--json",
        "--database-url",
        url,
    ])
    .await))
    .unwrap();
    let settings = &listed[0]["settings"];
    assert_eq!(settings["name"], "mail");
    assert!(settings["paused_at"].is_string());
    assert_eq!(settings["global_concurrency"], 3);
    assert_eq!(settings["rate_per_second"], 2.0);
    ok(&cli(&["queues", "resume", "mail", "--database-url", url]).await);
    ok(&cli(&[
        "queues",
        "set",
        "mail",
        "--global-concurrency",
        "none",
        "--rate",
        "none",
        "--database-url",
        url,
    ])
    .await);
    let table = ok(&cli(&["queues", "list", "--database-url", url]).await);
    let row = table
        .lines()
        .find(|l| l.starts_with("mail"))
        .expect("a row for mail");
    assert!(row.contains("running") && row.contains(" - "), "{table}");

    // Bad values: exit 2, the range named, nothing written.
    for (args, needle) in [
        (&["--global-concurrency", "0"][..], "use 1 to 1000000"),
        (&["--global-concurrency", "x"][..], "not a whole number"),
        (&["--rate", "0/s"][..], "out of range"),
        (&["--rate", "5"][..], "N/s, N/m or N/h"),
        (&["--rate", "NaN/s"][..], "out of range"),
        (
            &["--per-key-concurrency", "99999999999"][..],
            "use 1 to 1000000",
        ),
        (&[][..], "nothing to set"),
    ] {
        let mut all = vec!["queues", "set", "other", "--database-url", url];
        all.extend_from_slice(args);
        let out = cli(&all).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let out = cli(&["queues", "pause", "no such queue!", "--database-url", url]).await;
    assert_eq!(out.status.code(), Some(2));
    // Refused for its name, which --create would not mend.
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("--create"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM outbox_queues")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(names, vec!["mail"]);
}

/// `queues delete` forgets a queue left behind, and only such a queue: not
/// one a live worker serves (it would add the row back) nor one with tasks
/// waiting.
#[tokio::test]
async fn a_queue_left_behind_is_deleted_and_one_in_use_is_not() {
    let db = TestDb::migrated().await;
    let url = db.url.as_str();
    let delete = || ["queues", "delete", "mail", "--database-url", url];
    ok(&cli(&["queues", "pause", "mail", "--create", "--database-url", url]).await);
    sqlx::query(
        "INSERT INTO outbox_workers (id, host, pid, queues, expires_at) VALUES \
         ('h:1:a/1', 'h', 1, '[{\"queue\": \"mail\", \"concurrency\": 10}]', now() + interval '1 hour')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // Where the queue's last slow walk began (migration 35), and another
    // queue's.
    sqlx::query(
        "INSERT INTO outbox_claim_fronts (queue, priority, execute_at, id, walk_ms, walked_at) \
         VALUES ('mail', 0, now(), 1, 150, now()), ('other', 0, now(), 1, 150, now())",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let out = cli(&delete()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("1 live worker(s) serve mail"), "{err}");
    // The worker is gone, but a task still waits on the queue.
    sqlx::query("UPDATE outbox_workers SET expires_at = now() - interval '1 second'")
        .execute(&db.pool)
        .await
        .unwrap();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) VALUES ('outbox.noop', 'mail', '{}', 3) \
         RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let out = cli(&delete()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("tasks wait or run on mail"), "{err}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_queues")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 1, "a refused delete deleted");
    let fronts: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_claim_fronts")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(fronts, 2, "a refused delete deleted a queue's last walk");
    ok(&cli(&["tasks", "cancel", &id.to_string(), "--database-url", url]).await);
    assert!(ok(&cli(&delete()).await).contains("deleted the settings of mail"));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_queues")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    let fronts: Vec<String> = sqlx::query_scalar("SELECT queue FROM outbox_claim_fronts")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        fronts,
        ["other"],
        "the deleted queue's last walk went with it"
    );
    // Nothing to delete is a runtime refusal (1), as for a task id that
    // names no task.
    let out = cli(&delete()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no queue named \"mail\" has settings"),
        "{err}"
    );
}

#[tokio::test]
async fn ordered_submits_are_explained_and_workers_listed() {
    let db = TestDb::migrated().await;
    let url = db.url.as_str();
    let submit = |key: &'static str| {
        let url = url.to_owned();
        async move {
            ok(&cli(&[
                "tasks",
                "submit",
                "outbox.noop",
                "{}",
                "--ordering-key",
                key,
                "--database-url",
                &url,
            ])
            .await)
            .trim()
            .parse::<i64>()
            .expect("the id")
        }
    };
    let first = submit("acct-1").await;
    let second = submit("acct-1").await;
    let explained = ok(&cli(&[
        "tasks",
        "explain",
        &second.to_string(),
        "--database-url",
        url,
    ])
    .await);
    assert!(
        explained.contains(&format!(
            "why: behind task {first} (pending) of its ordering key \"acct-1\""
        )),
        "{explained}"
    );
    assert!(
        explained.contains("why: no live worker serves its queue \"default\""),
        "{explained}"
    );
    assert!(explained.contains("ordering key  acct-1"), "{explained}");
    let json: Value = serde_json::from_str(&ok(&cli(&[
        "tasks",
        "explain",
        &first.to_string(),
        "--json",
        "--database-url",
        url,
    ])
    .await))
    .unwrap();
    assert_eq!(json["reasons"][0]["reason"], "no_live_worker");
    let out = cli(&["tasks", "explain", "424242", "--database-url", url]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no task with id 424242"));
    let out = cli(&[
        "tasks",
        "submit",
        "outbox.noop",
        "{}",
        "--ordering-key",
        "",
        "--database-url",
        url,
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(ok(&cli(&["workers", "list", "--database-url", url]).await).contains("(no workers)"));
    sqlx::query(
        "INSERT INTO outbox_workers (id, host, pid, queues, expires_at) VALUES \
         ('h:1:a/1', 'h', 1, '[{\"queue\": \"default\", \"concurrency\": 10}]', now() + interval '1 hour')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let table = ok(&cli(&["workers", "list", "--database-url", url]).await);
    assert!(
        table.contains("h:1:a/1") && table.contains("alive") && table.contains("default=10"),
        "{table}"
    );
    // The one holding the maintenance lease is marked the leader.
    sqlx::query(
        "INSERT INTO outbox_leases (name, holder, expires_at) \
         VALUES ('maintenance', 'h:1:a/1', now() + interval '1 hour')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let table = ok(&cli(&["workers", "list", "--database-url", url]).await);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("h:1:a/1") && l.contains("alive  yes")),
        "{table}"
    );
}

/// A queue with tasks but no settings row (no worker has served it) is
/// listed, with the defaults it runs under, and can be paused by name.
#[tokio::test]
async fn a_queue_with_tasks_but_no_settings_is_listed_with_the_defaults() {
    let db = TestDb::migrated().await;
    let url = db.url.as_str();
    ok(&cli(&[
        "tasks",
        "submit",
        "outbox.noop",
        "{}",
        "--queue",
        "reports",
        "--database-url",
        url,
    ])
    .await);
    let table = ok(&cli(&["queues", "list", "--database-url", url]).await);
    let row = table
        .lines()
        .find(|l| l.starts_with("reports"))
        .unwrap_or_else(|| panic!("a row for reports:\n{table}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        columns,
        ["reports", "default", "-", "-", "1", "1", "0", "0", "0"],
        "{table}"
    );
    assert!(table.contains("no settings yet"), "{table}");
    let listed: Value = serde_json::from_str(&ok(&cli(&[
        "queues",
        "list",
        "--json",
        "--database-url",
        url,
    ])
    .await))
    .unwrap();
    let reports = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "reports")
        .expect("reports in the JSON listing");
    assert!(reports["settings"].is_null(), "{reports}");
    assert_eq!(reports["counts"]["available"], 1);
    ok(&cli(&["queues", "pause", "reports", "--database-url", url]).await);
    let table = ok(&cli(&["queues", "list", "--database-url", url]).await);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("reports") && l.contains("paused")),
        "{table}"
    );
    assert!(!table.contains("no settings yet"), "{table}");
}
