//! The dashboard in a real browser (headless Debian chromium over
//! WebDriver): sign in, read the overview, filter tasks, open one, retry
//! dead tasks by clicking, and see forged or anonymous state changes and
//! injected markup refused.

mod http;

use fantoccini::{Client, Locator};
use outbox::TaskId;
use outbox::admin;
use outbox_tests::TestDb;
use outbox_tests::browser::{
    ServedDashboard, click, navigate_by_click, sign_in, text_of, with_browser,
};
use outbox_worker::dashboard::{Auth, DashboardConfig};
use serde::{Deserialize, Serialize};

/// A long enough token.
const TOKEN: &str = "dashboard-test-token-0123456789";

/// A task type for the dashboard's tests.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox::outbox_task(task_type = "test.dashboard.mail", queue = "mail")]
struct Mail {
    to: String,
}

/// Another type, to filter by.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox::outbox_task(task_type = "test.dashboard.report", queue = "reports")]
struct Report {
    note: String,
}

fn token_auth() -> DashboardConfig {
    DashboardConfig::new(Auth::Token(TOKEN.to_owned()))
}

/// Submits `task` and returns its id.
async fn submit<T: outbox::Task>(db: &TestDb, task: T) -> TaskId {
    outbox::submit(&mut *db.conn().await, task).await.unwrap()
}

/// A dead task: submitted, then cancelled by an operator.
async fn dead<T: outbox::Task>(db: &TestDb, task: T) -> TaskId {
    let id = submit(db, task).await;
    assert_eq!(
        admin::cancel_tasks(&db.pool, &[id]).await.unwrap(),
        vec![id]
    );
    id
}

async fn state_of(db: &TestDb, id: TaskId) -> admin::TaskRecord {
    admin::get_task(&db.pool, id).await.unwrap().unwrap()
}

/// The text of `selector` within the overview row of `queue`.
async fn cell(client: &Client, queue: &str, class: &str) -> String {
    client
        .find(Locator::Css(&format!(
            "tr.queue[data-queue=\"{queue}\"] td.{class}"
        )))
        .await
        .unwrap_or_else(|e| panic!("no {class} cell for queue {queue}: {e}"))
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_overview_shows_every_queue_with_its_counts_and_last_hour() {
    let db = TestDb::migrated().await;
    for to in ["a@example.com", "b@example.com"] {
        submit(&db, Mail { to: to.into() }).await;
    }
    outbox::submit_with(
        &mut *db.conn().await,
        Mail {
            to: "later@example.com".into(),
        },
        outbox::TaskOptions::new().delay(std::time::Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    dead(&db, Mail { to: "x".into() }).await;
    // What workers add every few seconds: 40 completed and 3 failed, two
    // minutes ago.
    sqlx::query(
        "INSERT INTO outbox_throughput (minute, queue, worker, completed, failed)
         VALUES (date_trunc('minute', now()) - interval '2 minutes', 'mail', 'w1', 40, 3)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let url = served.url.clone();
    with_browser("overview", move |client| async move {
        sign_in(&client, &url, TOKEN).await;
        assert_eq!(cell(&client, "mail", "available").await, "2");
        assert_eq!(cell(&client, "mail", "scheduled").await, "1");
        assert_eq!(cell(&client, "mail", "dead").await, "1");
        assert_eq!(cell(&client, "mail", "completed").await, "40");
        assert_eq!(cell(&client, "mail", "failed").await, "3");
        let bars = client
            .find_all(Locator::Css("tr.queue[data-queue=\"mail\"] svg rect.ok"))
            .await
            .unwrap();
        assert_eq!(bars.len(), 1, "one minute with completed tasks");
        let failed = client
            .find_all(Locator::Css("tr.queue[data-queue=\"mail\"] svg rect.bad"))
            .await
            .unwrap();
        assert_eq!(failed.len(), 1, "one minute with failures");
    })
    .await;
}

#[tokio::test]
async fn a_wrong_token_is_refused_and_an_anonymous_visit_sees_nothing() {
    let db = TestDb::migrated().await;
    let id = submit(
        &db,
        Mail {
            to: "secret@example.com".into(),
        },
    )
    .await;
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let url = served.url.clone();
    with_browser("wrong_token", move |client| async move {
        sign_in(&client, &url, "not-the-token-at-all").await;
        assert!(
            text_of(&client, "login-wrong")
                .await
                .contains("not the dashboard's token")
        );
        client.goto(&format!("{url}/tasks/{id}")).await.unwrap();
        assert!(
            client
                .current_url()
                .await
                .unwrap()
                .path()
                .ends_with("/login"),
            "a task page needs a session"
        );
        assert!(
            !client
                .source()
                .await
                .unwrap()
                .contains("secret@example.com")
        );
        // Signed in, then out: the session no longer opens pages.
        sign_in(&client, &url, TOKEN).await;
        click(&client, "sign-out").await;
        client.goto(&format!("{url}/tasks/{id}")).await.unwrap();
        assert!(
            client
                .current_url()
                .await
                .unwrap()
                .path()
                .ends_with("/login")
        );
    })
    .await;
}

#[tokio::test]
async fn tasks_are_filtered_by_type_and_text_and_open_in_full() {
    let db = TestDb::migrated().await;
    for i in 0..3 {
        submit(
            &db,
            Mail {
                to: format!("m{i}@example.com"),
            },
        )
        .await;
    }
    let report = submit(
        &db,
        Report {
            note: "quarterly 100% _done_".into(),
        },
    )
    .await;
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let url = served.url.clone();
    with_browser("filter", move |client| async move {
        sign_in(&client, &url, TOKEN).await;
        client.goto(&format!("{url}/tasks")).await.unwrap();
        let all = client.find_all(Locator::Css("tr.task")).await.unwrap();
        assert_eq!(all.len(), 4);

        client
            .find(Locator::Id("filter-type"))
            .await
            .unwrap()
            .send_keys("test.dashboard.mail")
            .await
            .unwrap();
        click(&client, "apply-filters").await;
        let rows = client.find_all(Locator::Css("tr.task")).await.unwrap();
        assert_eq!(rows.len(), 3, "only the mail tasks");
        for row in rows {
            assert!(row.text().await.unwrap().contains("test.dashboard.mail"));
        }

        // Text is matched literally: '%' and '_' are not wildcards.
        client
            .goto(&format!("{url}/tasks?text=100%25%20_done_"))
            .await
            .unwrap();
        let rows = client.find_all(Locator::Css("tr.task")).await.unwrap();
        assert_eq!(rows.len(), 1);
        client
            .goto(&format!("{url}/tasks?text=100%25_"))
            .await
            .unwrap();
        assert_eq!(text_of(&client, "no-tasks").await, "No task matches.");

        client.goto(&format!("{url}/tasks")).await.unwrap();
        let link = format!("tr.task[data-id=\"{report}\"] a.task-link");
        navigate_by_click(&client, Locator::Css(&link)).await;
        assert_eq!(text_of(&client, "task-type").await, "test.dashboard.report");
        assert_eq!(text_of(&client, "task-state").await, "pending");
        assert!(
            text_of(&client, "task-payload")
                .await
                .contains("quarterly 100% _done_")
        );
    })
    .await;
}

#[tokio::test]
async fn retrying_dead_tasks_by_clicking_makes_them_claimable() {
    let db = TestDb::migrated().await;
    let one = dead(
        &db,
        Mail {
            to: "one@example.com".into(),
        },
    )
    .await;
    let two = dead(
        &db,
        Mail {
            to: "two@example.com".into(),
        },
    )
    .await;
    let three = dead(
        &db,
        Mail {
            to: "three@example.com".into(),
        },
    )
    .await;
    let pending = submit(
        &db,
        Mail {
            to: "busy@example.com".into(),
        },
    )
    .await;
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let url = served.url.clone();
    let pool = db.pool.clone();
    with_browser("retry", move |client| async move {
        sign_in(&client, &url, TOKEN).await;
        click(&client, "nav-dead").await;
        let rows = client.find_all(Locator::Css("tr.task")).await.unwrap();
        assert_eq!(rows.len(), 3, "the dead page lists the dead tasks only");

        client.goto(&format!("{url}/tasks/{one}")).await.unwrap();
        assert_eq!(text_of(&client, "task-state").await, "dead");
        click(&client, "retry").await;
        assert_eq!(text_of(&client, "task-state").await, "pending");
        let row = admin::get_task(&pool, one).await.unwrap().unwrap();
        assert_eq!(row.state, "pending");
        assert!(row.dead_at.is_none() && row.retry_count == 0);
        assert!(row.execute_at <= chrono::Utc::now(), "claimable now");

        // In bulk: tick two dead tasks and the pending one.
        client.goto(&format!("{url}/tasks")).await.unwrap();
        for id in [two, three, pending] {
            client
                .find(Locator::Css(&format!(
                    "input[type=checkbox][value=\"{id}\"]"
                )))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
        }
        click(&client, "bulk-retry").await;
        let done = text_of(&client, "done-ids").await;
        assert!(
            done.contains(&two.to_string()) && done.contains(&three.to_string()),
            "{done}"
        );
        assert!(
            text_of(&client, "skipped-ids")
                .await
                .contains(&pending.to_string())
        );
        for id in [two, three] {
            assert_eq!(
                admin::get_task(&pool, id).await.unwrap().unwrap().state,
                "pending"
            );
        }
    })
    .await;
    assert_eq!(state_of(&db, pending).await.state, "pending");
}

#[tokio::test]
async fn a_state_change_without_the_page_token_is_refused() {
    let db = TestDb::migrated().await;
    let id = dead(
        &db,
        Mail {
            to: "keep@example.com".into(),
        },
    )
    .await;
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let url = served.url.clone();
    with_browser("forged", move |client| async move {
        sign_in(&client, &url, TOKEN).await;
        client.goto(&format!("{url}/tasks/{id}")).await.unwrap();
        // What a forged form from another page would carry: no valid token.
        client
            .execute(
                "document.querySelectorAll('input[name=csrf]').forEach(i => i.value = 'forged');",
                vec![],
            )
            .await
            .unwrap();
        click(&client, "retry").await;
        let message = text_of(&client, "error-message").await;
        assert!(message.contains("CSRF token"), "{message}");

        // Signed out (the session cookie gone), the same form is refused too.
        client.goto(&format!("{url}/tasks/{id}")).await.unwrap();
        client.delete_cookie("outbox_session").await.unwrap();
        click(&client, "retry").await;
        let message = text_of(&client, "error-message").await;
        assert!(message.contains("not signed in"), "{message}");
    })
    .await;
    let row = state_of(&db, id).await;
    assert_eq!(row.state, "dead", "nothing was changed");
}

#[tokio::test]
async fn a_read_only_dashboard_shows_no_actions() {
    let db = TestDb::migrated().await;
    let id = dead(
        &db,
        Mail {
            to: "ro@example.com".into(),
        },
    )
    .await;
    admin::resume_queue(&db.pool, "mail").await.unwrap();
    let served = ServedDashboard::start(db.pool.clone(), token_auth().read_only(true)).await;
    let url = served.url.clone();
    with_browser("read_only", move |client| async move {
        sign_in(&client, &url, TOKEN).await;
        client.goto(&format!("{url}/tasks/{id}")).await.unwrap();
        assert_eq!(text_of(&client, "task-state").await, "dead");
        assert!(
            client.find(Locator::Id("retry")).await.is_err(),
            "no retry button"
        );
        client
            .goto(&format!("{url}/tasks?state=dead"))
            .await
            .unwrap();
        assert!(client.find(Locator::Id("bulk-retry")).await.is_err());
        assert!(client.find(Locator::Id("retry-all-dead")).await.is_err());
        client.goto(&format!("{url}/queues")).await.unwrap();
        client
            .find(Locator::Css("tr.queue-setting[data-queue=\"mail\"]"))
            .await
            .expect("the queue is listed");
        assert!(
            client.find(Locator::Css("button.pause")).await.is_err(),
            "no pause button"
        );
    })
    .await;
}

#[tokio::test]
async fn an_injected_script_is_shown_as_text_and_never_runs() {
    let db = TestDb::migrated().await;
    let attack = "<script>window.__outbox_pwned = true;</script><img src=x onerror=\"window.__outbox_pwned = true\">";
    let id = submit(
        &db,
        Report {
            note: attack.into(),
        },
    )
    .await;
    db.take_intake().await;
    sqlx::query("UPDATE outbox_tasks SET last_error = $1 WHERE id = $2")
        .bind(attack)
        .bind(id.0)
        .execute(&db.pool)
        .await
        .unwrap();
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let url = served.url.clone();
    with_browser("injection", move |client| async move {
        sign_in(&client, &url, TOKEN).await;
        for page in [
            format!("{url}/tasks/{id}"),
            format!("{url}/tasks?text=%3Cscript"),
        ] {
            client.goto(&page).await.unwrap();
            let pwned = client
                .execute("return window.__outbox_pwned === true;", vec![])
                .await
                .unwrap();
            assert_eq!(
                pwned,
                serde_json::Value::Bool(false),
                "script ran on {page}"
            );
            let scripts = client
                .find_all(Locator::Css("main script, main img"))
                .await
                .unwrap();
            assert!(
                scripts.is_empty(),
                "markup from the data became elements on {page}"
            );
        }
        client.goto(&format!("{url}/tasks/{id}")).await.unwrap();
        assert!(
            text_of(&client, "task-payload")
                .await
                .contains("<script>window.__outbox_pwned")
        );
        assert!(
            text_of(&client, "task-error")
                .await
                .contains("<img src=x onerror=")
        );
    })
    .await;
}

#[tokio::test]
async fn the_periodic_page_lists_what_the_leader_recorded() {
    let db = TestDb::migrated().await;
    sqlx::query(
        "INSERT INTO outbox_periodic (name, schedule, task_type, queue, payload, last_tick, next_tick) \
         VALUES ('nightly', '0 3 * * *', 'test.dashboard.report', 'reports', '{\"note\": \"n\"}', \
                 '2026-11-22T03:00:00Z', '2026-11-23T03:00:00Z')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let url = served.url.clone();
    with_browser("periodic", move |client| async move {
        sign_in(&client, &url, TOKEN).await;
        click(&client, "nav-periodic").await;
        let row = client
            .find(Locator::Css("tr.periodic-task[data-name=\"nightly\"]"))
            .await
            .expect("the nightly row")
            .text()
            .await
            .unwrap();
        assert!(row.contains("0 3 * * *"), "{row}");
        assert!(row.contains("2026-11-23 03:00:00"), "{row}");
    })
    .await;
}

/// An ordered task type for the queues page's test.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox::outbox_task(
    task_type = "test.dashboard.ledger",
    queue = "ledger",
    ordering_key = "account"
)]
struct Ledger {
    account: u32,
}

#[tokio::test]
async fn queues_are_paused_and_resumed_by_clicking_and_a_waiting_task_says_why() {
    let db = TestDb::migrated().await;
    let head = submit(&db, Ledger { account: 7 }).await;
    let behind = submit(&db, Ledger { account: 7 }).await;
    admin::resume_queue(&db.pool, "ledger").await.unwrap();
    sqlx::query(
        "INSERT INTO outbox_workers (id, host, pid, queues, expires_at) VALUES \
         ('host-a:42:1/1', 'host-a', 42, '[{\"queue\": \"ledger\", \"concurrency\": 4}]', now() + interval '1 hour')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let url = served.url.clone();
    let pool = db.pool.clone();
    with_browser("queues", move |client| async move {
        sign_in(&client, &url, TOKEN).await;
        click(&client, "nav-queues").await;
        let row = "tr.queue-setting[data-queue=\"ledger\"]";
        let text = |css: String| {
            let client = client.clone();
            async move {
                client
                    .find(Locator::Css(&css))
                    .await
                    .unwrap_or_else(|e| panic!("no {css}: {e}"))
                    .text()
                    .await
                    .unwrap()
            }
        };
        assert_eq!(text(format!("{row} td.queue-state")).await, "running");
        assert_eq!(text(format!("{row} td.blocked")).await, "1");
        let worker = text("tr.worker[data-worker=\"host-a:42:1/1\"]".to_owned()).await;
        assert!(
            worker.contains("alive") && worker.contains("ledger=4"),
            "{worker}"
        );

        navigate_by_click(&client, Locator::Css(&format!("{row} button.pause"))).await;
        assert_eq!(text(format!("{row} td.queue-state")).await, "paused");
        let paused = admin::list_queues(&pool).await.unwrap();
        assert!(paused[0].paused_at.is_some());
        navigate_by_click(&client, Locator::Css(&format!("{row} button.resume"))).await;
        assert_eq!(text(format!("{row} td.queue-state")).await, "running");
        assert!(
            admin::list_queues(&pool).await.unwrap()[0]
                .paused_at
                .is_none()
        );

        client.goto(&format!("{url}/tasks/{behind}")).await.unwrap();
        let why = text_of(&client, "task-why").await;
        assert!(
            why.contains(&format!(
                "behind task {head} (pending) of its ordering key \"7\""
            )),
            "{why}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_workflow_is_drawn_with_each_steps_state_and_cancelled_by_clicking() {
    let db = TestDb::migrated().await;
    let chain = || {
        let mut w = outbox::Workflow::new("welcome");
        w.add(
            "mail",
            &Mail {
                to: "a@example.com".into(),
            },
        )
        .unwrap()
        .add_after(
            "report",
            &["mail"],
            &Report {
                note: "<b>sent</b>".into(),
            },
        )
        .unwrap();
        w
    };
    let failed = chain().submit(&mut *db.conn().await).await.unwrap();
    let status = outbox::workflow::workflow_status(&db.pool, failed)
        .await
        .unwrap()
        .unwrap();
    let root = status.step_list[0].task_id.unwrap();
    admin::cancel_tasks(&db.pool, &[root]).await.unwrap();
    let running = chain().submit(&mut *db.conn().await).await.unwrap();

    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let url = served.url.clone();
    with_browser("workflows", move |client| async move {
        sign_in(&client, &url, TOKEN).await;
        click(&client, "nav-workflows").await;
        let row = |id: outbox::WorkflowId| {
            let client = client.clone();
            async move {
                client
                    .find(Locator::Css(&format!("tr.workflow[data-id=\"{id}\"]")))
                    .await
                    .expect("the workflow's row")
                    .text()
                    .await
                    .unwrap()
            }
        };
        assert!(row(failed).await.contains("failed"));
        assert!(row(running).await.contains("running"));
        navigate_by_click(
            &client,
            Locator::Css(&format!("tr.workflow[data-id=\"{running}\"] a")),
        )
        .await;
        let state_of_step = |step: &'static str| {
            let client = client.clone();
            async move {
                client
                    .find(Locator::Css(&format!(
                        "#workflow-graph g.step[data-step=\"{step}\"]"
                    )))
                    .await
                    .expect("the step's box")
                    .attr("data-state")
                    .await
                    .unwrap()
                    .unwrap()
            }
        };
        assert_eq!(state_of_step("mail").await, "pending");
        assert_eq!(state_of_step("report").await, "waiting");
        let lines = client
            .find_all(Locator::Css("#workflow-graph line.dependency"))
            .await
            .unwrap();
        assert_eq!(lines.len(), 1);
        click(&client, "cancel-workflow").await;
        // The cancel redirects back to the workflow, now failed.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while text_of(&client, "workflow-state").await != "failed" {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cancel never showed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(state_of_step("mail").await, "dead");
        assert_eq!(state_of_step("report").await, "cancelled");
        assert!(
            text_of(&client, "workflow-cancelled")
                .await
                .starts_with("cancelled by an operator ")
        );
    })
    .await;
    let status = outbox::workflow::workflow_status(&db.pool, running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.workflow.state, "failed");
    assert!(status.workflow.cancelled_at.is_some());
}
