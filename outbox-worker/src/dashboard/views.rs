//! The pages' templates (in `outbox-worker/templates/`, compiled into the
//! binary and HTML-escaped by default) and what they are given.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use outbox::admin::{MinuteThroughput, Overview, QueueOverview, TaskRecord};

use super::DashboardConfig;

/// Renders `page` with `status`; a template error becomes a plain 500.
pub(crate) fn render(status: StatusCode, page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(error) => {
            tracing::error!(%error, "dashboard template failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "template error\n").into_response()
        }
    }
}

/// Why a request was not served: its status and what to tell the
/// operator, rendered as an error page by [`Refusal::page`].
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// The error page.
    pub(crate) fn page(&self, config: &DashboardConfig) -> Response {
        error(self.status, &self.message, config)
    }
}

/// An error page.
pub(crate) fn error(status: StatusCode, message: &str, config: &DashboardConfig) -> Response {
    render(
        status,
        &ErrorPage {
            base: &config.base_path,
            status: status.as_u16(),
            message,
        },
    )
}

#[derive(Template)]
#[template(path = "error.html")]
pub(crate) struct ErrorPage<'a> {
    pub(crate) base: &'a str,
    pub(crate) status: u16,
    pub(crate) message: &'a str,
}

#[derive(Template)]
#[template(path = "login.html")]
pub(crate) struct LoginPage<'a> {
    pub(crate) base: &'a str,
    pub(crate) csrf: &'a str,
    pub(crate) wrong: bool,
}

/// One bar of a queue's hourly chart: completed above the axis, failed
/// below, in SVG user units.
pub(crate) struct Bar {
    pub(crate) x: usize,
    pub(crate) completed_h: u32,
    pub(crate) failed_h: u32,
    pub(crate) label: String,
}

/// A queue's row on the overview, with its chart.
pub(crate) struct QueueRow {
    pub(crate) q: QueueOverview,
    pub(crate) oldest: String,
    pub(crate) bars: Vec<Bar>,
    pub(crate) peak: i64,
}

/// Height of the completed half of a chart, and of the failed half.
pub(crate) const CHART_UP: u32 = 30;
pub(crate) const CHART_DOWN: u32 = 12;

#[derive(Template)]
#[template(path = "overview.html")]
pub(crate) struct OverviewPage<'a> {
    pub(crate) base: &'a str,
    /// Set for a signed-in browser session: the sign-out form's token.
    pub(crate) sign_out_csrf: Option<&'a str>,
    pub(crate) rows: Vec<QueueRow>,
    pub(crate) completed_estimate: i64,
    pub(crate) now: String,
}

impl<'a> OverviewPage<'a> {
    pub(crate) fn new(
        base: &'a str,
        sign_out_csrf: Option<&'a str>,
        overview: Overview,
        now: DateTime<Utc>,
    ) -> Self {
        let rows = overview
            .queues
            .into_iter()
            .map(|q| {
                let (bars, peak) = chart(&overview.last_hour, &q.queue, now);
                QueueRow {
                    oldest: age(q.oldest_available_age_s),
                    q,
                    bars,
                    peak,
                }
            })
            .collect();
        Self {
            base,
            sign_out_csrf,
            rows,
            completed_estimate: overview.completed_estimate,
            now: now.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        }
    }
}

/// The 60 one-minute bars ending at `now`'s minute for `queue`, scaled to
/// the busiest minute, and that minute's count.
fn chart(points: &[MinuteThroughput], queue: &str, now: DateTime<Utc>) -> (Vec<Bar>, i64) {
    let last = now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now);
    let first = last - TimeDelta::minutes(59);
    let mut minutes = [(0i64, 0i64); 60];
    for p in points.iter().filter(|p| p.queue == queue) {
        let i = (p.minute - first).num_minutes();
        if let Ok(i) = usize::try_from(i)
            && i < 60
        {
            minutes[i].0 += p.completed;
            minutes[i].1 += p.failed;
        }
    }
    let peak = minutes.iter().map(|(c, f)| (*c).max(*f)).max().unwrap_or(0);
    let scale = |n: i64, height: u32| -> u32 {
        if n <= 0 || peak <= 0 {
            0
        } else {
            // At least one unit, so that a single failure is visible.
            ((n as f64 / peak as f64) * f64::from(height)).ceil() as u32
        }
    };
    let bars = minutes
        .iter()
        .enumerate()
        .map(|(i, (c, f))| Bar {
            x: i * 4,
            completed_h: scale(*c, CHART_UP),
            failed_h: scale(*f, CHART_DOWN),
            label: format!(
                "{}: {c} completed, {f} failed",
                (first + TimeDelta::minutes(i as i64)).format("%H:%M")
            ),
        })
        .collect();
    (bars, peak)
}

/// A duration in seconds as an operator reads it.
pub(crate) fn age(seconds: f64) -> String {
    if seconds <= 0.0 {
        return "-".to_owned();
    }
    let s = seconds.round() as i64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

/// The tasks page's filters as given, for the form and the paging links.
#[derive(Default)]
pub(crate) struct FilterView {
    pub(crate) state: String,
    pub(crate) task_type: String,
    pub(crate) queue: String,
    pub(crate) id: String,
    pub(crate) text: String,
}

impl FilterView {
    /// The query string of these filters (percent-encoded), without `before`.
    pub(crate) fn query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("state", &self.state),
            ("type", &self.task_type),
            ("queue", &self.queue),
            ("id", &self.id),
            ("text", &self.text),
        ] {
            if !v.is_empty() {
                q.append_pair(k, v);
            }
        }
        q.finish()
    }
}

/// One row of the tasks table.
pub(crate) struct TaskRow {
    pub(crate) t: TaskRecord,
    pub(crate) created: String,
    pub(crate) error_excerpt: String,
}

impl From<TaskRecord> for TaskRow {
    fn from(t: TaskRecord) -> Self {
        let error_excerpt = t
            .last_error
            .as_deref()
            .map(|e| excerpt(e, 80))
            .unwrap_or_default();
        Self {
            created: t.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            error_excerpt,
            t,
        }
    }
}

fn excerpt(text: &str, max_chars: usize) -> String {
    let mut out: String = text.chars().take(max_chars).collect();
    if text.chars().nth(max_chars).is_some() {
        out.push('…');
    }
    out
}

#[derive(Template)]
#[template(path = "tasks.html")]
pub(crate) struct TasksPage<'a> {
    pub(crate) base: &'a str,
    pub(crate) csrf: &'a str,
    pub(crate) read_only: bool,
    pub(crate) filter: FilterView,
    pub(crate) states: &'static [&'static str],
    pub(crate) rows: Vec<TaskRow>,
    pub(crate) next: Option<String>,
}

#[derive(Template)]
#[template(path = "task.html")]
pub(crate) struct TaskPage<'a> {
    pub(crate) base: &'a str,
    pub(crate) csrf: &'a str,
    pub(crate) read_only: bool,
    pub(crate) t: TaskRecord,
    pub(crate) payload: String,
    pub(crate) result: Option<String>,
    pub(crate) can_retry: bool,
    /// "Retry now" for a failed or dead task, "Run now" for a scheduled one.
    pub(crate) retry_label: &'static str,
    pub(crate) can_cancel: bool,
    /// `tasks explain`'s reasons, as text.
    pub(crate) why: Vec<String>,
}

/// One queue on the queues page.
pub(crate) struct QueueSettingsRow {
    pub(crate) name: String,
    pub(crate) paused: bool,
    /// No settings row yet: the defaults apply.
    pub(crate) unset: bool,
    pub(crate) global: String,
    pub(crate) rate: String,
    pub(crate) per_key: i32,
    pub(crate) available: i64,
    pub(crate) blocked: i64,
    pub(crate) running: i64,
    pub(crate) dead: i64,
}

#[derive(Template)]
#[template(path = "queues.html")]
pub(crate) struct QueuesPage<'a> {
    pub(crate) base: &'a str,
    pub(crate) csrf: &'a str,
    pub(crate) read_only: bool,
    pub(crate) queues: Vec<QueueSettingsRow>,
    pub(crate) workers: Vec<outbox::admin::WorkerRecord>,
}

/// A timestamp or a dash.
pub(crate) fn when(at: Option<&DateTime<Utc>>) -> String {
    at.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string(),
    )
}

#[derive(Template)]
#[template(path = "periodic.html")]
pub(crate) struct PeriodicPage<'a> {
    pub(crate) base: &'a str,
    pub(crate) rows: Vec<outbox::periodic::PeriodicRecord>,
}

#[derive(Template)]
#[template(path = "done.html")]
pub(crate) struct DonePage<'a> {
    pub(crate) base: &'a str,
    pub(crate) action: &'a str,
    pub(crate) ids: Vec<i64>,
    pub(crate) skipped: Vec<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_an_operator_says_them() {
        assert_eq!(age(0.0), "-");
        assert_eq!(age(42.4), "42s");
        assert_eq!(age(125.0), "2m 5s");
        assert_eq!(age(7260.0), "2h 1m");
        assert_eq!(age(90000.0), "1d 1h");
    }

    #[test]
    fn the_chart_places_minutes_and_scales_to_the_busiest() {
        let now = DateTime::parse_from_rfc3339("2026-11-22T10:30:20Z")
            .unwrap()
            .with_timezone(&Utc);
        let at =
            |m: i64| now.duration_trunc(TimeDelta::minutes(1)).unwrap() - TimeDelta::minutes(m);
        let points = vec![
            MinuteThroughput {
                minute: at(0),
                queue: "a".into(),
                completed: 100,
                failed: 1,
            },
            MinuteThroughput {
                minute: at(59),
                queue: "a".into(),
                completed: 50,
                failed: 0,
            },
            MinuteThroughput {
                minute: at(60),
                queue: "a".into(),
                completed: 999,
                failed: 0,
            },
            MinuteThroughput {
                minute: at(0),
                queue: "b".into(),
                completed: 7,
                failed: 0,
            },
        ];
        let (bars, peak) = chart(&points, "a", now);
        assert_eq!(peak, 100, "the minute before the hour is left out");
        assert_eq!(bars.len(), 60);
        assert_eq!((bars[59].completed_h, bars[59].failed_h), (CHART_UP, 1));
        assert_eq!(bars[0].completed_h, CHART_UP / 2);
        assert!(bars[1..59].iter().all(|b| b.completed_h == 0));
    }

    #[test]
    fn filters_become_an_encoded_query() {
        let f = FilterView {
            state: "dead".into(),
            text: "a&b=<c>".into(),
            ..FilterView::default()
        };
        assert_eq!(f.query(), "state=dead&text=a%26b%3D%3Cc%3E");
    }
}
