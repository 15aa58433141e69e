//! Reading back what a handler returned with [`crate::Outcome::success_with`].

use serde::de::DeserializeOwned;
use sqlx::{PgConnection, Row};

use crate::error::{Error, Result};
use crate::task::TaskId;

/// The result task `id` completed with, decoded into `R`: `None` while the
/// task is not completed (or it completed without a result, or no longer
/// exists: cleanup deletes completed tasks after the retention, and
/// `--retention 0` at once, so keep a retention if you read results).
///
/// ```no_run
/// # async fn f(conn: &mut sqlx::PgConnection, id: outbox::TaskId) -> outbox::Result<()> {
/// #[derive(serde::Deserialize)]
/// struct Report { rows: u64, url: String }
/// if let Some(report) = outbox::result::<Report>(conn, id).await? {
///     println!("{} rows at {}", report.rows, report.url);
/// }
/// # Ok(()) }
/// ```
pub async fn result<R: DeserializeOwned>(conn: &mut PgConnection, id: TaskId) -> Result<Option<R>> {
    let Some(row) = sqlx::query(include_str!("db/sql/task_result.sql"))
        .bind(id.0)
        .fetch_optional(conn)
        .await?
    else {
        return Ok(None);
    };
    let state: String = row.try_get("state")?;
    decode_completed(id, &state, row.try_get("result")?)
}

/// A completed task's stored result decoded into `R`; `None` in any other
/// state or without a result.
pub(crate) fn decode_completed<R: DeserializeOwned>(
    id: TaskId,
    state: &str,
    text: Option<String>,
) -> Result<Option<R>> {
    match text {
        Some(text) if state == "completed" => {
            serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| Error::ResultDecode {
                    id,
                    reason: format!("{e} (stored: {})", excerpt(&text)),
                })
        }
        _ => Ok(None),
    }
}

/// The first 200 characters of stored JSON, for an error message.
pub(crate) fn excerpt(text: &str) -> String {
    let mut out: String = text.chars().take(200).collect();
    if out.len() < text.len() {
        out.push_str("...");
    }
    out
}
