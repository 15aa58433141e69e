//! The dashboard's protections seen from plain HTTP clients: what a script,
//! another site's page or a curl user can and cannot do.

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outbox::admin;
use outbox_tests::TestDb;
use outbox_tests::browser::ServedDashboard;
use outbox_worker::dashboard::{Auth, DashboardConfig};

use super::{Mail, TOKEN, dead, state_of, token_auth};

struct Reply {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: String,
}

async fn send(method: Method, url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client
        .request(request)
        .await
        .expect("the dashboard answers");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

#[tokio::test]
async fn a_bearer_client_needs_no_csrf_token_and_a_wrong_bearer_gets_nothing() {
    let db = TestDb::migrated().await;
    let id = dead(
        &db,
        Mail {
            to: "api@example.com".into(),
        },
    )
    .await;
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let bearer = format!("Bearer {TOKEN}");
    let wrong = send(
        Method::POST,
        &format!("{}/tasks/{id}/retry", served.url),
        &[("authorization", "Bearer nope"), FORM],
        "",
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(state_of(&db, id).await.state, "dead");
    let ok = send(
        Method::POST,
        &format!("{}/tasks/{id}/retry", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER, "{}", ok.body);
    assert_eq!(state_of(&db, id).await.state, "pending");
}

/// A scheduled task's page offers "Run now", which makes it due now.
#[tokio::test]
async fn a_scheduled_task_is_run_now_from_its_page() {
    let db = TestDb::migrated().await;
    let task = Mail {
        to: "later@example.com".into(),
    };
    let options = outbox::TaskOptions::new().delay(std::time::Duration::from_secs(3600));
    let id = outbox::submit_with(&mut *db.conn().await, task, options)
        .await
        .unwrap();
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let bearer = format!("Bearer {TOKEN}");
    let page = send(
        Method::GET,
        &format!("{}/tasks/{id}", served.url),
        &[("authorization", &bearer)],
        "",
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body.contains(r#"id="retry">Run now</button>"#),
        "{}",
        page.body
    );
    assert!(state_of(&db, id).await.execute_at > chrono::Utc::now());
    let ran = send(
        Method::POST,
        &format!("{}/tasks/{id}/retry", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(ran.status, StatusCode::SEE_OTHER, "{}", ran.body);
    let row = state_of(&db, id).await;
    assert_eq!(row.state, "pending");
    assert!(row.execute_at <= chrono::Utc::now(), "due now: {row:?}");
    // Due now, there is nothing more to run early.
    let page = send(
        Method::GET,
        &format!("{}/tasks/{id}", served.url),
        &[("authorization", &bearer)],
        "",
    )
    .await;
    assert!(!page.body.contains(r#"id="retry""#), "{}", page.body);
    // A request made anyway (a stale page) says why nothing changed.
    let again = send(
        Method::POST,
        &format!("{}/tasks/{id}/retry", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert!(
        again
            .body
            .contains(&format!("task {id} was not retried: due already")),
        "{}",
        again.body
    );
}

/// Delivers mail at once: what makes a completed task here.
struct Deliver;

impl outbox::TaskHandler<Mail> for Deliver {
    async fn handle(&self, _ctx: outbox::TaskContext, _task: Mail) -> outbox::HandlerResult {
        Ok(outbox::Outcome::Success)
    }
}

/// A completed task's page offers "Run again", which puts it back to run.
#[tokio::test]
async fn a_completed_task_is_run_again_from_its_page() {
    let db = TestDb::migrated().await;
    let id = super::submit(
        &db,
        Mail {
            to: "again@example.com".into(),
        },
    )
    .await;
    let worker = outbox::Worker::builder(db.pool.clone())
        .handler::<Mail>(Deliver)
        .build()
        .unwrap();
    let report = outbox::testing::drain(worker, std::time::Duration::from_secs(60)).await;
    assert_eq!(report.count(outbox::TaskEventKind::Completed), 1);
    assert_eq!(state_of(&db, id).await.state, "completed");
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let bearer = format!("Bearer {TOKEN}");
    let page = send(
        Method::GET,
        &format!("{}/tasks/{id}", served.url),
        &[("authorization", &bearer)],
        "",
    )
    .await;
    assert!(
        page.body.contains(r#"id="retry">Run again</button>"#),
        "{}",
        page.body
    );
    let again = send(
        Method::POST,
        &format!("{}/tasks/{id}/retry", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(again.status, StatusCode::SEE_OTHER, "{}", again.body);
    assert_eq!(state_of(&db, id).await.state, "pending");
}

#[tokio::test]
async fn a_request_from_another_sites_page_is_refused_even_with_the_token() {
    let db = TestDb::migrated().await;
    let id = dead(
        &db,
        Mail {
            to: "csrf@example.com".into(),
        },
    )
    .await;
    let served = ServedDashboard::start(db.pool.clone(), DashboardConfig::new(Auth::None)).await;
    let csrf = "a".repeat(64);
    let cookie = format!("outbox_csrf={csrf}");
    let body = format!("csrf={csrf}");
    let url = format!("{}/tasks/{id}/retry", served.url);
    let foreign = send(
        Method::POST,
        &url,
        &[("cookie", &cookie), ("origin", "http://evil.example"), FORM],
        &body,
    )
    .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    assert!(foreign.body.contains("another site"), "{}", foreign.body);
    let missing = send(Method::POST, &url, &[FORM], &body).await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN, "no cookie to match");
    assert_eq!(state_of(&db, id).await.state, "dead");
    let own = send(Method::POST, &url, &[("cookie", &cookie), FORM], &body).await;
    assert_eq!(own.status, StatusCode::SEE_OTHER, "{}", own.body);
    assert_eq!(state_of(&db, id).await.state, "pending");
}

#[tokio::test]
async fn basic_auth_is_asked_for_and_checked() {
    let db = TestDb::migrated().await;
    let config = DashboardConfig::new(Auth::Basic {
        user: "ops".into(),
        password: "correct-horse-battery".into(),
    });
    let served = ServedDashboard::start(db.pool.clone(), config).await;
    let anonymous = send(Method::GET, &served.url, &[], "").await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert!(
        anonymous.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Basic ")
    );
    let basic = |user: &str, password: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    };
    let wrong = send(
        Method::GET,
        &served.url,
        &[("authorization", &basic("ops", "wrong"))],
        "",
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let right = send(
        Method::GET,
        &served.url,
        &[("authorization", &basic("ops", "correct-horse-battery"))],
        "",
    )
    .await;
    assert_eq!(right.status, StatusCode::OK);
    assert!(right.body.contains("<h1>Queues</h1>"));
    let policy = right.headers["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("default-src 'none'"), "{policy}");
}

#[tokio::test]
async fn a_read_only_dashboard_refuses_every_change() {
    let db = TestDb::migrated().await;
    let id = dead(
        &db,
        Mail {
            to: "ro-http@example.com".into(),
        },
    )
    .await;
    let served = ServedDashboard::start(db.pool.clone(), token_auth().read_only(true)).await;
    let bearer = format!("Bearer {TOKEN}");
    for path in [
        format!("/tasks/{id}/retry"),
        "/dead/retry".to_owned(),
        "/tasks/bulk".to_owned(),
        "/queues/mail/pause".to_owned(),
    ] {
        let reply = send(
            Method::POST,
            &format!("{}{path}", served.url),
            &[("authorization", &bearer), FORM],
            &format!("action=retry&id={id}"),
        )
        .await;
        assert_eq!(
            reply.status,
            StatusCode::FORBIDDEN,
            "{path}: {}",
            reply.body
        );
    }
    assert_eq!(state_of(&db, id).await.state, "dead");
    let dead_count = admin::queue_health(&db.pool).await.unwrap().dead;
    assert_eq!(dead_count, 1);
    assert!(
        admin::list_queues(&db.pool).await.unwrap().is_empty(),
        "no queue was paused"
    );
}

#[tokio::test]
async fn a_script_pauses_and_resumes_a_queue_and_a_foreign_page_cannot() {
    let db = TestDb::migrated().await;
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let bearer = format!("Bearer {TOKEN}");
    let paused = || {
        let pool = db.pool.clone();
        async move {
            admin::list_queues(&pool)
                .await
                .unwrap()
                .first()
                .is_some_and(|q| q.paused_at.is_some())
        }
    };
    // A queue the cluster has never heard of is not paused (a typo would
    // be listed, paused, from then on).
    let typo = send(
        Method::POST,
        &format!("{}/queues/mail/pause", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(typo.status, StatusCode::NOT_FOUND, "{}", typo.body);
    assert!(typo.body.contains("no queue named"), "{}", typo.body);
    assert!(admin::list_queues(&db.pool).await.unwrap().is_empty());
    // Known once a task waits on it, and listed with the defaults it runs
    // under until a worker or an operator gives it a row.
    super::submit(&db, Mail { to: "a@b".into() }).await;
    let page = send(
        Method::GET,
        &format!("{}/queues", served.url),
        &[("authorization", &bearer)],
        "",
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body.contains("<td class=\"queue-state\">default</td>"),
        "{}",
        page.body
    );
    let reply = send(
        Method::POST,
        &format!("{}/queues/mail/pause", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    assert!(paused().await);
    let unknown = send(
        Method::POST,
        &format!("{}/queues/mail/explode", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let bad_name = send(
        Method::POST,
        &format!("{}/queues/no%20such%20queue!/pause", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(
        bad_name.status,
        StatusCode::BAD_REQUEST,
        "{}",
        bad_name.body
    );
    // A page of another site, with the browser's cookie but no page token.
    let forged = send(
        Method::POST,
        &format!("{}/queues/mail/resume", served.url),
        &[("origin", "https://evil.example"), FORM],
        "csrf=guess",
    )
    .await;
    assert_ne!(forged.status, StatusCode::SEE_OTHER);
    assert!(paused().await, "still paused");
    let resumed = send(
        Method::POST,
        &format!("{}/queues/mail/resume", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(resumed.status, StatusCode::SEE_OTHER);
    assert!(!paused().await);
}

#[tokio::test]
async fn bad_request_values_get_a_clear_error_page() {
    let db = TestDb::migrated().await;
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let bearer = format!("Bearer {TOKEN}");
    for (path, status, expected) in [
        (
            "/tasks?state=bogus",
            StatusCode::BAD_REQUEST,
            "unknown state",
        ),
        (
            "/tasks?id=12x",
            StatusCode::BAD_REQUEST,
            "must be a task id",
        ),
        (
            "/tasks?before=-",
            StatusCode::BAD_REQUEST,
            "must be a task id",
        ),
        ("/tasks/99999999", StatusCode::NOT_FOUND, "no task 99999999"),
        ("/tasks/abc", StatusCode::BAD_REQUEST, "must be a task id"),
    ] {
        let reply = send(
            Method::GET,
            &format!("{}{path}", served.url),
            &[("authorization", &bearer)],
            "",
        )
        .await;
        assert_eq!(reply.status, status, "{path}");
        assert!(reply.body.contains(expected), "{path}: {}", reply.body);
    }
}

#[tokio::test]
async fn without_authentication_only_loopback_host_names_are_served() {
    let db = TestDb::migrated().await;
    let served = ServedDashboard::start(db.pool.clone(), DashboardConfig::new(Auth::None)).await;
    let port = served.url.rsplit(':').next().unwrap().to_owned();
    // A page that rebinds its own domain to 127.0.0.1 sends its own name.
    let rebound = format!("attacker.example:{port}");
    let refused = send(
        Method::GET,
        &format!("{}/tasks", served.url),
        &[("host", &rebound)],
        "",
    )
    .await;
    assert_eq!(
        refused.status,
        StatusCode::MISDIRECTED_REQUEST,
        "{}",
        refused.body
    );
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let ok = send(
            Method::GET,
            &format!("{}/tasks", served.url),
            &[("host", &host)],
            "",
        )
        .await;
        assert_eq!(ok.status, StatusCode::OK, "{host}");
    }
}

#[tokio::test]
async fn scripts_with_a_wrong_token_get_401_and_proxies_may_rewrite_host() {
    let db = TestDb::migrated().await;
    let id = dead(
        &db,
        Mail {
            to: "proxy@example.com".into(),
        },
    )
    .await;
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let wrong = send(
        Method::GET,
        &format!("{}/tasks", served.url),
        &[("authorization", "bearer nope")],
        "",
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(
        wrong.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    let lower = format!("bearer {TOKEN}");
    let ok = send(
        Method::GET,
        &format!("{}/tasks", served.url),
        &[("authorization", &lower)],
        "",
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "the scheme is case-insensitive");

    // A browser behind a proxy that rewrote Host: the name it used is in
    // X-Forwarded-Host.
    let csrf = "b".repeat(64);
    let cookie = format!("outbox_csrf={csrf}");
    let body = format!("csrf={csrf}&token={TOKEN}");
    let signed_in = send(
        Method::POST,
        &format!("{}/login", served.url),
        &[
            ("cookie", &cookie),
            ("origin", "https://ops.example.com"),
            ("x-forwarded-host", "ops.example.com"),
            FORM,
        ],
        &body,
    )
    .await;
    assert_eq!(
        signed_in.status,
        StatusCode::SEE_OTHER,
        "{}",
        signed_in.body
    );
    assert_eq!(state_of(&db, id).await.state, "dead");
}

#[tokio::test]
async fn served_under_a_base_path_every_link_stays_under_it() {
    let db = TestDb::migrated().await;
    let id = dead(
        &db,
        Mail {
            to: "base@example.com".into(),
        },
    )
    .await;
    let served =
        ServedDashboard::start(db.pool.clone(), token_auth().base_path("/ops/outbox")).await;
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let home = send(
        Method::GET,
        &format!("{}/ops/outbox", served.url),
        &auth,
        "",
    )
    .await;
    assert_eq!(home.status, StatusCode::OK);
    assert!(
        home.body.contains(r#"class="brand" href="/ops/outbox""#),
        "{}",
        home.body
    );
    let slash = send(
        Method::GET,
        &format!("{}/ops/outbox/", served.url),
        &auth,
        "",
    )
    .await;
    assert_eq!(slash.status, StatusCode::SEE_OTHER);
    assert_eq!(slash.headers["location"], "/ops/outbox");
    let tasks = send(
        Method::GET,
        &format!("{}/ops/outbox/tasks", served.url),
        &auth,
        "",
    )
    .await;
    assert!(
        tasks
            .body
            .contains(&format!(r#"href="/ops/outbox/tasks/{id}""#)),
        "{}",
        tasks.body
    );
    let anonymous = send(
        Method::GET,
        &format!("{}/ops/outbox/tasks", served.url),
        &[],
        "",
    )
    .await;
    assert_eq!(anonymous.headers["location"], "/ops/outbox/login");
    let nul = send(
        Method::GET,
        &format!("{}/ops/outbox/tasks?text=%00", served.url),
        &auth,
        "",
    )
    .await;
    assert_eq!(nul.status, StatusCode::BAD_REQUEST, "{}", nul.body);
}

#[tokio::test]
async fn the_events_page_shows_parked_aggregates_escaped_and_a_script_skips_a_named_one() {
    let db = TestDb::migrated().await;
    sqlx::raw_sql(
        "INSERT INTO outbox_event_subscriptions (name, stream, partitions) VALUES ('hooks', 'events', 1);
         INSERT INTO outbox_event_cursors (subscription, part, position) VALUES ('hooks', 0, 0);
         INSERT INTO outbox_event_parked (subscription, position, id, aggregatetype, aggregateid, type,
                                          payload, aggregate_hash, created_at, retry_at, error,
                                          publish_at)
         VALUES ('hooks', 7, gen_random_uuid(), 'order', '42', 'order.placed', '{}', 1, now(), NULL,
                 'webhook refused the event (http_refused): <script>alert(1)</script>', NULL),
                ('hooks', 9, gen_random_uuid(), 'order', '42', 'order.paid', '{}', 1, now(), NULL, NULL,
                 NULL),
                ('hooks', 11, gen_random_uuid(), 'order', '43', 'order.reminded', '{}', 1, now(),
                 now() + interval '1 hour', NULL, now() + interval '1 hour'),
                ('hooks', 13, gen_random_uuid(), 'order', '44', 'order.reminded', '{}', 1, now(),
                 now() + interval '1 hour', NULL, now() + interval '1 hour');
         INSERT INTO outbox_event_members (subscription, member, seen_until, failing_since, failing_why)
         VALUES ('hooks', 'w1', now() + interval '1 hour', now() - interval '42 seconds',
                 'http_status: <b>503</b> Service Unavailable');",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let served = ServedDashboard::start(db.pool.clone(), token_auth()).await;
    let bearer = format!("Bearer {TOKEN}");
    let page = send(
        Method::GET,
        &format!("{}/events", served.url),
        &[("authorization", &bearer)],
        "",
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body.contains("data-subscription=\"hooks\""),
        "{}",
        page.body
    );
    assert!(page.body.contains("data-aggregate=\"order/42\""));
    // A relay whose publishes fail for now says so, its reason escaped.
    let failing = page
        .body
        .split("<tr class=\"subscription-failing\">")
        .nth(1)
        .expect("the failing relay's row");
    let seconds: f64 = failing
        .split("failed for ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("how long it has failed");
    assert!((42.0..600.0).contains(&seconds), "{failing}");
    assert!(failing.contains("&#60;b&#62;503&#60;/b&#62;"), "{failing}");
    // The event behind the refused one has no time of its own.
    let behind_row = page
        .body
        .split("<tr class=\"parked-event\"")
        .find(|row| row.contains("order.paid"))
        .expect("the row of the event behind");
    assert!(behind_row.contains("behind the first"), "{behind_row}");
    // An aggregate held back by its event's own delay is offered no
    // retry (it would not cut the delay short): its row says delayed.
    let delayed_row = page
        .body
        .split("<tr class=\"parked-event\"")
        .find(|row| row.contains("data-aggregate=\"order/43\""))
        .expect("the delayed aggregate's row");
    assert!(delayed_row.contains("delayed"), "{delayed_row}");
    assert!(!delayed_row.contains("class=\"retry\""), "{delayed_row}");
    // It is offered publish now and drop instead; the subscription, a
    // retry of every refused aggregate.
    assert!(delayed_row.contains("class=\"retry-now\""), "{delayed_row}");
    assert!(delayed_row.contains("class=\"drop\""), "{delayed_row}");
    assert!(page.body.contains("class=\"retry-all\""), "{}", page.body);
    let post = async |action: &str, body: &str| {
        send(
            Method::POST,
            &format!("{}/events/hooks/{action}", served.url),
            &[("authorization", &bearer), FORM],
            body,
        )
        .await
    };
    let due = async |position: i64| -> Option<bool> {
        sqlx::query_scalar(
            "SELECT retry_at <= now() AND coalesce(publish_at <= now(), true) \
             FROM outbox_event_parked WHERE position = $1",
        )
        .bind(position)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
    };
    let id_at = async |position: i64| -> String {
        sqlx::query_scalar("SELECT id::text FROM outbox_event_parked WHERE position = $1")
            .bind(position)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    let unnamed = post("retry-now", "aggregate_type=order&aggregate_id=43").await;
    assert_eq!(unnamed.status, StatusCode::BAD_REQUEST, "{}", unnamed.body);
    assert_eq!(due(11).await, Some(false), "not cut without its id");
    let id43 = id_at(11).await;
    assert!(
        delayed_row.contains(&format!("name=\"event_id\" value=\"{id43}\"")),
        "publish now names the event shown: {delayed_row}"
    );
    let now = post(
        "retry-now",
        &format!("aggregate_type=order&aggregate_id=43&event_id={id43}"),
    )
    .await;
    assert_eq!(now.status, StatusCode::SEE_OTHER, "{}", now.body);
    assert_eq!(due(11).await, Some(true), "its delay cut short");
    let unnamed = post("drop", "aggregate_type=order&aggregate_id=44").await;
    assert_eq!(unnamed.status, StatusCode::BAD_REQUEST, "{}", unnamed.body);
    let id44 = id_at(13).await;
    let dropped = post(
        "drop",
        &format!("aggregate_type=order&aggregate_id=44&event_id={id44}"),
    )
    .await;
    assert_eq!(dropped.status, StatusCode::SEE_OTHER, "{}", dropped.body);
    assert_eq!(due(13).await, None, "the delayed event is gone");
    let all = post("retry-all", "").await;
    assert_eq!(all.status, StatusCode::SEE_OTHER, "{}", all.body);
    assert_eq!(
        due(7).await,
        Some(true),
        "the refused aggregate is tried again"
    );
    let nobody = send(
        Method::POST,
        &format!("{}/events/nobody/retry-all", served.url),
        &[("authorization", &bearer), FORM],
        "",
    )
    .await;
    assert_eq!(nobody.status, StatusCode::NOT_FOUND, "{}", nobody.body);
    assert!(
        page.body
            .contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
        "escaped: {}",
        page.body
    );
    assert!(!page.body.contains("<script>alert(1)"), "never raw");
    let first = id_at(7).await;
    assert!(
        page.body
            .contains(&format!("name=\"event_id\" value=\"{first}\"")),
        "the skip form names the event shown: {}",
        page.body
    );
    let positions = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT position FROM outbox_event_parked WHERE aggregateid = '42' ORDER BY position",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let form = "aggregate_type=order&aggregate_id=42";
    let forged = send(
        Method::POST,
        &format!("{}/events/hooks/skip", served.url),
        &[("origin", "https://evil.example"), FORM],
        &format!("csrf=guess&{form}"),
    )
    .await;
    assert_ne!(forged.status, StatusCode::SEE_OTHER);
    assert_eq!(positions(db.pool.clone()).await, [7, 9], "nothing skipped");
    let unknown = send(
        Method::POST,
        &format!("{}/events/hooks/explode", served.url),
        &[("authorization", &bearer), FORM],
        form,
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    // A skip names the event it drops: a post without one is refused.
    let unnamed = send(
        Method::POST,
        &format!("{}/events/hooks/skip", served.url),
        &[("authorization", &bearer), FORM],
        form,
    )
    .await;
    assert_eq!(unnamed.status, StatusCode::BAD_REQUEST, "{}", unnamed.body);
    assert_eq!(positions(db.pool.clone()).await, [7, 9], "nothing skipped");
    let skip_first = format!("{form}&event_id={first}");
    let skipped = send(
        Method::POST,
        &format!("{}/events/hooks/skip", served.url),
        &[("authorization", &bearer), FORM],
        &skip_first,
    )
    .await;
    assert_eq!(skipped.status, StatusCode::SEE_OTHER, "{}", skipped.body);
    assert_eq!(
        positions(db.pool.clone()).await,
        [9],
        "the refused event is gone"
    );
    // The same skip again (a double click), even once the next event is
    // refused too: it names the event gone, and drops nothing.
    sqlx::query("UPDATE outbox_event_parked SET error = 'refused', retry_at = NULL")
        .execute(&db.pool)
        .await
        .unwrap();
    let again = send(
        Method::POST,
        &format!("{}/events/hooks/skip", served.url),
        &[("authorization", &bearer), FORM],
        &skip_first,
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{}", again.body);
    assert!(again.body.contains("skipped nothing"), "{}", again.body);
    assert_eq!(positions(db.pool.clone()).await, [9], "nothing skipped");
    // Another stale one drops nothing either, and a malformed one is a
    // bad request.
    let stale = send(
        Method::POST,
        &format!("{}/events/hooks/skip", served.url),
        &[("authorization", &bearer), FORM],
        &format!("{form}&event_id=0190a0b0-0000-7000-8000-000000000001"),
    )
    .await;
    assert_eq!(stale.status, StatusCode::NOT_FOUND, "{}", stale.body);
    let malformed = send(
        Method::POST,
        &format!("{}/events/hooks/skip", served.url),
        &[("authorization", &bearer), FORM],
        &format!("{form}&event_id=not-an-id"),
    )
    .await;
    assert_eq!(
        malformed.status,
        StatusCode::BAD_REQUEST,
        "{}",
        malformed.body
    );
    assert_eq!(positions(db.pool.clone()).await, [9], "nothing skipped");
    let shown = id_at(9).await;
    let named = send(
        Method::POST,
        &format!("{}/events/hooks/skip", served.url),
        &[("authorization", &bearer), FORM],
        &format!("{form}&event_id={shown}"),
    )
    .await;
    assert_eq!(named.status, StatusCode::SEE_OTHER, "{}", named.body);
    assert!(
        positions(db.pool.clone()).await.is_empty(),
        "the named event is gone"
    );
    let nothing = send(
        Method::POST,
        &format!("{}/events/hooks/retry", served.url),
        &[("authorization", &bearer), FORM],
        "aggregate_type=order&aggregate_id=7",
    )
    .await;
    assert_eq!(nothing.status, StatusCode::NOT_FOUND, "{}", nothing.body);
}
