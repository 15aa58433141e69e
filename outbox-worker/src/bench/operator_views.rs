//! The operator views' queries timed on the benchmark's table: the
//! dashboard overview and task pages must stay fast with a large completed
//! history and many dead tasks (the overview's target is 100 ms with 1M
//! completed and 100k dead).

use std::time::Instant;

use outbox::admin::{self, TaskFilter};
use serde::Serialize;
use sqlx::PgPool;

use super::{Latency, db};
use crate::failure::Failure;

/// Times of each view, in milliseconds.
#[derive(Debug, Serialize)]
pub(super) struct OperatorViews {
    /// `admin::overview`: every queue's counts and the last hour.
    pub(super) overview_ms: Latency,
    /// The newest 50 tasks.
    pub(super) tasks_first_page_ms: Latency,
    /// The 20th page of 50 completed tasks (keyset paging).
    pub(super) completed_page_20_ms: Latency,
    /// The newest 50 dead tasks.
    pub(super) dead_page_ms: Latency,
}

const SAMPLES: usize = 30;

async fn time<T, F, Fut>(mut f: F) -> Result<Latency, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = outbox::Result<T>>,
{
    f().await?; // warm the cache and the prepared statement
    let mut ms = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        f().await?;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(Latency::of(ms))
}

/// Fills the last hour of `outbox_throughput` as 10 busy workers would,
/// then times each view.
pub(super) async fn measure(pool: &PgPool) -> Result<OperatorViews, Failure> {
    sqlx::query(
        "INSERT INTO outbox_throughput (minute, queue, worker, completed, failed)
         SELECT date_trunc('minute', now()) - m * interval '1 minute', 'outbox-bench',
                'bench-worker-' || w, 1000, 3
         FROM generate_series(0, 59) AS m, generate_series(1, 10) AS w
         ON CONFLICT DO NOTHING",
    )
    .execute(pool)
    .await
    .map_err(db)?;
    let overview_ms = time(|| admin::overview(pool)).await?;
    let any = TaskFilter::default();
    let tasks_first_page_ms = time(|| admin::search_tasks(pool, &any)).await?;
    let completed = TaskFilter {
        state: Some("completed".to_owned()),
        ..TaskFilter::default()
    };
    let mut before = None;
    for _ in 0..19 {
        let page = admin::search_tasks(
            pool,
            &TaskFilter {
                before,
                ..completed.clone()
            },
        )
        .await?;
        before = page.next_before;
    }
    let page_20 = TaskFilter {
        before,
        ..completed
    };
    let completed_page_20_ms = time(|| admin::search_tasks(pool, &page_20)).await?;
    let dead = TaskFilter {
        state: Some("dead".to_owned()),
        ..TaskFilter::default()
    };
    let dead_page_ms = time(|| admin::search_tasks(pool, &dead)).await?;
    Ok(OperatorViews {
        overview_ms,
        tasks_first_page_ms,
        completed_page_20_ms,
        dead_page_ms,
    })
}
