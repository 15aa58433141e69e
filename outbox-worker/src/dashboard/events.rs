//! The events page: every subscription with its lag (and a retry of every
//! aggregate its broker refused), the events held back for parked
//! aggregates, and retry or skip for each parked aggregate, publish now or
//! drop for a delayed one (the same functions as `outbox-worker events`).

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use outbox::relay::{ParkedEvent, Subscription};
use serde::Deserialize;

use super::Dashboard;
use super::auth::{CsrfToken, Identity, check_csrf};
use super::pages::{query, writable};
use super::views::{Refusal, render, when};

/// Parked events shown at most.
const PARKED_SHOWN: i64 = 200;

#[derive(Template)]
#[template(path = "events.html")]
pub(crate) struct EventsPage<'a> {
    pub(crate) base: &'a str,
    pub(crate) csrf: &'a str,
    pub(crate) read_only: bool,
    pub(crate) subscriptions: Vec<Subscription>,
    pub(crate) parked: Vec<ParkedEvent>,
}

impl EventsPage<'_> {
    /// Whether `p` is the first held-back event of its aggregate (the one
    /// the actions act on).
    fn first_of_aggregate(&self, i: &usize) -> bool {
        let p = &self.parked[*i];
        *i == 0 || {
            let q = &self.parked[*i - 1];
            (
                q.subscription.as_str(),
                q.aggregatetype.as_str(),
                q.aggregateid.as_str(),
            ) != (
                p.subscription.as_str(),
                p.aggregatetype.as_str(),
                p.aggregateid.as_str(),
            )
        }
    }

    /// Whether `p` waits for its own delay: a retry would not cut it short,
    /// so none is offered. By its publish time, as the statements that
    /// act on it decide, not by when it is tried next.
    fn delayed(&self, p: &ParkedEvent) -> bool {
        p.error.is_none() && p.publish_at.is_some_and(|t| t > chrono::Utc::now())
    }

    /// Whether the first held-back event `p` is offered `action`: retry
    /// unless it waits for its delay, skip when the broker refused it,
    /// publish now or drop when it waits for its delay.
    fn offers(&self, p: &ParkedEvent, action: &str) -> bool {
        match action {
            "retry" => !self.delayed(p),
            "skip" => p.error.is_some(),
            "retry-now" | "drop" => self.delayed(p),
            _ => false,
        }
    }

    /// When the relay tries the event again: only an aggregate's first
    /// has a time; the others wait behind it.
    fn retry_at(&self, i: &usize) -> String {
        let p = &self.parked[*i];
        if !self.first_of_aggregate(i) {
            return "behind the first".to_owned();
        }
        p.retry_at
            .as_ref()
            .map_or_else(|| "when an operator says so".to_owned(), |t| when(Some(t)))
    }
}

pub(crate) async fn events(
    State(d): State<Arc<Dashboard>>,
    Extension(csrf): Extension<CsrfToken>,
) -> Response {
    let result = async {
        let subscriptions = query("subscriptions", outbox::relay::subscriptions(&d.pool)).await?;
        let parked = query(
            "parked events",
            outbox::relay::parked(&d.pool, None, PARKED_SHOWN),
        )
        .await?;
        Ok::<_, Refusal>(render(
            StatusCode::OK,
            &EventsPage {
                base: &d.config.base_path,
                csrf: &csrf.0,
                read_only: d.config.read_only,
                subscriptions,
                parked,
            },
        ))
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

/// The event an action names, or a 400 for a post without one.
fn named<'a>(event: Option<&'a str>, action: &str) -> Result<&'a str, Refusal> {
    event.ok_or_else(|| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("{action} names the first held-back event (event_id)"),
        )
    })
}

/// The aggregate a parked-event action is for.
#[derive(Deserialize)]
pub(crate) struct AggregateForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    aggregate_type: String,
    #[serde(default)]
    aggregate_id: String,
    /// For a skip, a drop or a publish now: the first held-back event the
    /// page showed. Only that one is acted on, so a second click or a
    /// stale page does nothing.
    #[serde(default)]
    event_id: Option<String>,
}

/// Retries or skips a parked aggregate of a subscription, publishes a
/// delayed one now or drops its delayed event, or (`retry-all`, no
/// aggregate) retries every aggregate the broker refused.
pub(crate) async fn parked_action(
    State(d): State<Arc<Dashboard>>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
    Path((subscription, action)): Path<(String, String)>,
    axum::Form(form): axum::Form<AggregateForm>,
) -> Response {
    let result = async {
        writable(&d)?;
        check_csrf(identity, &headers, &form.csrf)?;
        let (t, i) = (&form.aggregate_type, &form.aggregate_id);
        let event = form.event_id.as_deref().filter(|e| !e.is_empty());
        let done = match action.as_str() {
            "retry-all" => {
                let retried = query(
                    "retry all",
                    outbox::relay::retry_all_parked(&d.pool, &subscription, None),
                )
                .await?;
                let known = retried > 0
                    || query(
                        "subscription",
                        outbox::relay::subscription_exists(&d.pool, &subscription),
                    )
                    .await?;
                known.then(String::new)
            }
            // These act on the event the page showed, named by its id, so
            // a second click or a stale page does nothing to the next one.
            "retry-now" => {
                let e = named(event, "publish now")?;
                query(
                    "publish now",
                    outbox::relay::retry_parked_now(&d.pool, &subscription, t, i, e),
                )
                .await?
            }
            "drop" | "skip" => {
                let e = named(event, &action)?;
                query(
                    "skip",
                    outbox::relay::skip_parked_event(&d.pool, &subscription, t, i, e),
                )
                .await?
            }
            "retry" => {
                query(
                    "retry",
                    outbox::relay::retry_parked(&d.pool, &subscription, t, i),
                )
                .await?
            }
            _ => return Err(Refusal::new(StatusCode::NOT_FOUND, "no such action")),
        };
        if done.is_none() {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                match action.as_str() {
                    "skip" | "drop" => format!(
                        "skipped nothing: the first event {subscription} holds back for {t}/{i} is not a refused or delayed one, or not the one the page showed (reload it)"
                    ),
                    "retry-now" => format!(
                        "published nothing early: the first event {subscription} holds back for {t}/{i} is not the one the page showed (reload it)"
                    ),
                    "retry-all" => format!("there is no subscription {subscription:?}"),
                    _ => format!("{subscription} holds nothing back for aggregate {t}/{i}"),
                },
            ));
        }
        Ok(Redirect::to(&format!("{}/events", d.config.base_path)).into_response())
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}
