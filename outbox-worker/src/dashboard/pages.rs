//! The page and action handlers: each reads or changes tasks through
//! `outbox::admin` (the functions the CLI uses) under a deadline, and
//! renders a template.

use std::future::Future;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, Query, RawForm, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use outbox::TaskId;
use outbox::admin::{self, TaskFilter};
use serde::Deserialize;

use super::auth::{CsrfToken, Identity, check_csrf};
use super::views::{
    DonePage, FilterView, OverviewPage, PeriodicPage, QueueSettingsRow, QueuesPage, Refusal,
    TaskPage, TaskRow, TasksPage, render,
};
use super::{Dashboard, QUERY_DEADLINE};

/// Runs one admin query under the page deadline; an error page otherwise.
pub(super) async fn query<T>(
    what: &str,
    f: impl Future<Output = outbox::Result<T>>,
) -> Result<T, Refusal> {
    match tokio::time::timeout(QUERY_DEADLINE, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(outbox::Error::InvalidOption(message))) => {
            Err(Refusal::new(StatusCode::BAD_REQUEST, message))
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, what, "dashboard query failed");
            Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the database did not answer ({what}): {error}"),
            ))
        }
        Err(_) => Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the database did not answer ({what}) within {}s",
                QUERY_DEADLINE.as_secs()
            ),
        )),
    }
}

/// Refuses every action of a read-only dashboard.
pub(super) fn writable(d: &Dashboard) -> Result<(), Refusal> {
    if d.config.read_only {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "this dashboard is read-only",
        ));
    }
    Ok(())
}

/// The stylesheet, embedded in the binary.
pub(crate) async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("style.css"),
    )
        .into_response()
}

/// Every queue at a glance.
pub(crate) async fn overview(
    State(d): State<Arc<Dashboard>>,
    Extension(csrf): Extension<CsrfToken>,
) -> Response {
    // Only token sign-ins have a session to end (basic auth is the
    // browser's, and the insecure mode has none).
    let sign_out = matches!(d.config.auth, super::Auth::Token(_)).then_some(&*csrf.0);
    match query("overview", admin::overview(&d.pool)).await {
        Ok(o) => render(
            StatusCode::OK,
            &OverviewPage::new(&d.config.base_path, sign_out, o, chrono::Utc::now()),
        ),
        Err(refused) => refused.page(&d.config),
    }
}

/// Periodic tasks, as the cluster's leader recorded them.
pub(crate) async fn periodic(State(d): State<Arc<Dashboard>>) -> Response {
    match query("periodic tasks", outbox::periodic::list(&d.pool)).await {
        Ok(rows) => render(
            StatusCode::OK,
            &PeriodicPage {
                base: &d.config.base_path,
                rows,
            },
        ),
        Err(refused) => refused.page(&d.config),
    }
}

/// The tasks page's query string; every field may be absent or empty.
#[derive(Deserialize)]
pub(crate) struct TasksQuery {
    #[serde(default)]
    state: String,
    #[serde(default, rename = "type")]
    task_type: String,
    #[serde(default)]
    queue: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    before: String,
}

fn some(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

fn parse_id(field: &str, s: &str) -> Result<Option<i64>, Refusal> {
    match some(s) {
        None => Ok(None),
        Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("{field} must be a task id (a whole number), not {v:?}"),
            )
        }),
    }
}

/// Tasks, filtered, a page at a time.
pub(crate) async fn tasks(
    State(d): State<Arc<Dashboard>>,
    Extension(csrf): Extension<CsrfToken>,
    Query(q): Query<TasksQuery>,
) -> Response {
    let result = async {
        let given = [&q.state, &q.task_type, &q.queue, &q.id, &q.text, &q.before];
        if given.iter().any(|v| v.contains('\0')) {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "a filter contains the character U+0000, which no task can hold",
            ));
        }
        let filter = TaskFilter {
            state: some(&q.state),
            task_type: some(&q.task_type),
            queue: some(&q.queue),
            id: parse_id("id", &q.id)?,
            text: some(&q.text),
            before: parse_id("before", &q.before)?,
            limit: Some(50),
            // The list shows neither; a payload can be megabytes.
            without_payload: true,
        };
        let page = query("tasks", admin::search_tasks(&d.pool, &filter)).await?;
        let view = FilterView {
            state: q.state.trim().to_owned(),
            task_type: q.task_type.trim().to_owned(),
            queue: q.queue.trim().to_owned(),
            id: q.id.trim().to_owned(),
            text: q.text.trim().to_owned(),
        };
        let next = page.next_before.map(|before| {
            let filters = view.query();
            if filters.is_empty() {
                format!("before={before}")
            } else {
                format!("{filters}&before={before}")
            }
        });
        Ok::<_, Refusal>(render(
            StatusCode::OK,
            &TasksPage {
                base: &d.config.base_path,
                csrf: &csrf.0,
                read_only: d.config.read_only,
                filter: view,
                states: admin::STATES,
                rows: page.tasks.into_iter().map(TaskRow::from).collect(),
                next,
            },
        ))
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

/// One task, in full.
pub(crate) async fn task(
    State(d): State<Arc<Dashboard>>,
    Extension(csrf): Extension<CsrfToken>,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let Some(id) = parse_id("the task id", &id)? else {
            return Err(Refusal::new(StatusCode::NOT_FOUND, "no such task"));
        };
        let Some(found) = query("task", admin::explain_task(&d.pool, TaskId(id))).await? else {
            return Err(Refusal::new(StatusCode::NOT_FOUND, format!("no task {id}")));
        };
        let mut why: Vec<String> = found.reasons.iter().map(ToString::to_string).collect();
        if let Some((workflow, step)) = &found.workflow {
            why.push(format!("it is step {step} of workflow {workflow}"));
        }
        let t = found.task;
        let payload = serde_json::to_string_pretty(&t.payload).unwrap_or_default();
        let result = t
            .result
            .as_ref()
            .map(|r| serde_json::to_string_pretty(r).unwrap_or_default());
        // A scheduled task (pending, due later, not held by a run) can be
        // made due now: the same action.
        let scheduled =
            t.state == "pending" && t.claimed_by.is_none() && t.execute_at > chrono::Utc::now();
        // A completed one runs again (refused, with the reason, for a
        // workflow's step or a unique key a live task holds).
        let can_retry = matches!(t.state.as_str(), "failed" | "dead" | "completed") || scheduled;
        let retry_label = match t.state.as_str() {
            _ if scheduled => "Run now",
            "completed" => "Run again",
            _ => "Retry now",
        };
        // A dead task holding its ordering key can be skipped (cancelled).
        let can_cancel = matches!(t.state.as_str(), "pending" | "failed" | "processing")
            || (t.state == "dead" && t.ordering_key.is_some());
        Ok(render(
            StatusCode::OK,
            &TaskPage {
                base: &d.config.base_path,
                csrf: &csrf.0,
                read_only: d.config.read_only,
                t,
                payload,
                result,
                can_retry,
                retry_label,
                can_cancel,
                why,
            },
        ))
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

/// A form that carries only the CSRF token.
#[derive(Deserialize)]
pub(crate) struct TokenForm {
    #[serde(default)]
    pub(crate) csrf: String,
}

/// Which single-task action.
#[derive(Clone, Copy)]
enum Action {
    Retry,
    Cancel,
}

impl Action {
    fn past(self) -> &'static str {
        match self {
            Action::Retry => "Retried",
            Action::Cancel => "Cancelled",
        }
    }

    async fn apply(self, d: &Dashboard, ids: &[TaskId]) -> Result<Vec<TaskId>, Refusal> {
        match self {
            Action::Retry => query("retry", admin::retry_tasks(&d.pool, ids)).await,
            Action::Cancel => query("cancel", admin::cancel_tasks(&d.pool, ids)).await,
        }
    }
}

async fn one(
    d: Arc<Dashboard>,
    identity: Identity,
    headers: HeaderMap,
    id: String,
    csrf: String,
    action: Action,
) -> Response {
    let result = async {
        writable(&d)?;
        check_csrf(identity, &headers, &csrf)?;
        let Some(id) = parse_id("the task id", &id)? else {
            return Err(Refusal::new(StatusCode::NOT_FOUND, "no such task"));
        };
        let changed = action.apply(&d, &[TaskId(id)]).await?;
        if changed.is_empty() && matches!(action, Action::Retry) {
            let why = query("retry", admin::why_not_retried(&d.pool, &[TaskId(id)])).await?;
            let reason = why.first().map_or("no such task", |(_, r)| r.as_str());
            return Err(Refusal::new(
                StatusCode::CONFLICT,
                format!("task {id} was not retried: {reason}"),
            ));
        }
        if changed.is_empty() {
            return Err(Refusal::new(
                StatusCode::CONFLICT,
                format!(
                    "task {id} was not changed: it is not in a state that allows this (see its page)"
                ),
            ));
        }
        Ok(Redirect::to(&format!("{}/tasks/{id}", d.config.base_path)).into_response())
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

/// Queue settings and workers, with pause and resume.
pub(crate) async fn queues(
    State(d): State<Arc<Dashboard>>,
    Extension(csrf): Extension<CsrfToken>,
) -> Response {
    let result = async {
        let settings = query("queues", admin::list_queues(&d.pool)).await?;
        let overview = query("overview", admin::overview(&d.pool)).await?;
        let workers = query("workers", admin::list_workers(&d.pool)).await?;
        // Queues with tasks but no settings row run with the defaults.
        let unset: Vec<QueueSettingsRow> = admin::queues_without_settings(&settings, &overview)
            .into_iter()
            .map(|o| QueueSettingsRow {
                name: o.queue.clone(),
                paused: false,
                unset: true,
                global: "-".to_owned(),
                rate: "-".to_owned(),
                per_key: 1,
                available: o.available,
                blocked: o.blocked,
                running: o.processing,
                dead: o.dead,
            })
            .collect();
        let queues = settings
            .into_iter()
            .map(|q| {
                let counts = overview.queues.iter().find(|o| o.queue == q.name);
                let count = |f: fn(&admin::QueueOverview) -> i64| counts.map_or(0, f);
                QueueSettingsRow {
                    paused: q.paused_at.is_some(),
                    unset: false,
                    global: q
                        .global_concurrency
                        .map_or("-".to_owned(), |n| n.to_string()),
                    rate: q
                        .rate_per_second
                        .map_or("-".to_owned(), outbox::admin::show_rate),
                    per_key: q.per_key_concurrency,
                    available: count(|o| o.available),
                    blocked: count(|o| o.blocked),
                    running: count(|o| o.processing),
                    dead: count(|o| o.dead),
                    name: q.name,
                }
            })
            .chain(unset)
            .collect();
        Ok(render(
            StatusCode::OK,
            &QueuesPage {
                base: &d.config.base_path,
                csrf: &csrf.0,
                read_only: d.config.read_only,
                queues,
                workers,
            },
        ))
    }
    .await;
    result.unwrap_or_else(|refused: Refusal| refused.page(&d.config))
}

/// Pauses (`pause`) or resumes a queue for the whole cluster.
pub(crate) async fn queue_action(
    State(d): State<Arc<Dashboard>>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    axum::Form(form): axum::Form<TokenForm>,
) -> Response {
    let result = async {
        writable(&d)?;
        check_csrf(identity, &headers, &form.csrf)?;
        match action.as_str() {
            "pause" => {
                // As the CLI: a mistyped name is refused, not paused (and
                // listed from then on).
                admin::check_queue_name(&name)
                    .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, e.to_string()))?;
                if query("pause", admin::unknown_queue(&d.pool, &name))
                    .await?
                    .is_some()
                {
                    return Err(Refusal::new(
                        StatusCode::NOT_FOUND,
                        format!("no queue named {name:?}: no worker serves it and it has no tasks"),
                    ));
                }
                query("pause", admin::pause_queue(&d.pool, &name)).await?
            }
            "resume" => query("resume", admin::resume_queue(&d.pool, &name)).await?,
            _ => return Err(Refusal::new(StatusCode::NOT_FOUND, "no such action")),
        };
        Ok(Redirect::to(&format!("{}/queues", d.config.base_path)).into_response())
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

/// Retries one failed or dead task, or makes a scheduled one due now.
pub(crate) async fn retry_one(
    State(d): State<Arc<Dashboard>>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<TokenForm>,
) -> Response {
    one(d, identity, headers, id, form.csrf, Action::Retry).await
}

/// Cancels one task that is not running.
pub(crate) async fn cancel_one(
    State(d): State<Arc<Dashboard>>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<TokenForm>,
) -> Response {
    one(d, identity, headers, id, form.csrf, Action::Cancel).await
}

/// Most tasks one bulk action may name.
const MAX_BULK: usize = 1000;

/// Retries or cancels the ticked tasks. The form repeats `id` once per
/// ticked task, which serde's form decoding cannot gather, so it is read
/// pair by pair.
pub(crate) async fn bulk(
    State(d): State<Arc<Dashboard>>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
    RawForm(body): RawForm,
) -> Response {
    let result = async {
        writable(&d)?;
        let mut csrf = String::new();
        let mut action = None;
        let mut ids = Vec::new();
        for (k, v) in form_urlencoded::parse(&body) {
            match &*k {
                "csrf" => csrf = v.into_owned(),
                "action" => action = Some(v.into_owned()),
                "id" => ids.push(v.into_owned()),
                _ => {}
            }
        }
        check_csrf(identity, &headers, &csrf)?;
        let action = match action.as_deref() {
            Some("retry") => Action::Retry,
            Some("cancel") => Action::Cancel,
            other => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    format!("unknown action {other:?}: use retry or cancel"),
                ));
            }
        };
        if ids.is_empty() || ids.len() > MAX_BULK {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("tick between 1 and {MAX_BULK} tasks"),
            ));
        }
        let mut parsed = Vec::with_capacity(ids.len());
        for id in &ids {
            if let Some(id) = parse_id("id", id)? {
                parsed.push(TaskId(id));
            }
        }
        let changed = action.apply(&d, &parsed).await?;
        Ok::<_, Refusal>(done_page(&d, action.past(), &parsed, &changed))
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

/// The "retry every dead task" form.
#[derive(Deserialize)]
pub(crate) struct RetryDeadForm {
    #[serde(default)]
    csrf: String,
    #[serde(default, rename = "type")]
    task_type: String,
}

/// Retries every dead task, or those of one type.
pub(crate) async fn retry_all_dead(
    State(d): State<Arc<Dashboard>>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<RetryDeadForm>,
) -> Response {
    let result = async {
        writable(&d)?;
        check_csrf(identity, &headers, &form.csrf)?;
        let task_type = some(&form.task_type);
        let changed = query(
            "retry dead",
            admin::retry_dead(&d.pool, task_type.as_deref()),
        )
        .await?;
        Ok::<_, Refusal>(done_page(&d, "Retried", &changed, &changed))
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

fn done_page(d: &Dashboard, action: &str, asked: &[TaskId], changed: &[TaskId]) -> Response {
    let ids: Vec<i64> = changed.iter().map(|t| t.0).collect();
    let skipped = asked
        .iter()
        .map(|t| t.0)
        .filter(|id| !ids.contains(id))
        .collect();
    render(
        StatusCode::OK,
        &DonePage {
            base: &d.config.base_path,
            action,
            ids,
            skipped,
        },
    )
}
