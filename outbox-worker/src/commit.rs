//! Commands that write (`tasks submit`, `events emit`) and a COMMIT whose
//! answer is lost. The write's id is known, and logged, before COMMIT is
//! sent; when the connection fails during COMMIT the command asks the
//! server what became of its transaction (`pg_xact_status`), so it never
//! reports a failure for a write that committed, and when it cannot find
//! out it says so with its own exit code and the id to retry with.

use std::sync::Mutex;
use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};

use crate::connect::is_unreachable;
use crate::failure::{EXIT_OUTCOME_UNKNOWN, Failure};

/// How long a command keeps asking for its transaction's outcome after
/// the connection failed during COMMIT.
const RESOLVE_WITHIN: Duration = Duration::from_secs(30);

/// Where the command's write stands, for a command given up by
/// `--command-timeout`: its future is dropped where it stands, so this is
/// read then (and is not cleared on the way out of a failed write, which
/// nothing reads after).
enum Stage {
    /// No write begun, or its outcome known.
    Idle,
    /// Begun, COMMIT not sent: the server rolls back the transaction of a
    /// connection that goes away, so nothing was written.
    Writing,
    /// COMMIT sent and not answered: the sentence to print.
    Committing(String),
}

static STAGE: Mutex<Stage> = Mutex::new(Stage::Idle);

fn enter(stage: Stage) {
    *STAGE.lock().unwrap_or_else(|e| e.into_inner()) = stage;
}

/// For a command given up by `--command-timeout`: the failure to report
/// when its COMMIT was unanswered, else whether a write was begun (and so
/// nothing written).
pub(crate) fn given_up() -> Result<bool, Failure> {
    match std::mem::replace(
        &mut *STAGE.lock().unwrap_or_else(|e| e.into_inner()),
        Stage::Idle,
    ) {
        Stage::Idle => Ok(false),
        Stage::Writing => Ok(true),
        Stage::Committing(pending) => Err(Failure {
            code: EXIT_OUTCOME_UNKNOWN,
            message: format!("{pending} (--command-timeout ran out while committing)"),
        }),
    }
}

/// A write of one command, described for the operator.
pub(crate) struct Write {
    /// What is written, with its id: "event 0190…" or "task 42".
    pub(crate) what: String,
    /// What to do when the outcome is unknown (a retry that is safe).
    pub(crate) retry: String,
}

/// Runs `write` in a transaction on a connection of `pool`, then commits,
/// resolving a COMMIT whose answer is lost. `describe` names what the
/// write made (with its id) for the log line before COMMIT and for a
/// failure.
pub(crate) async fn write_and_commit<T>(
    pool: &PgPool,
    write: impl AsyncFnOnce(&mut PgConnection) -> Result<T, outbox::Error>,
    describe: impl FnOnce(&T) -> Write,
) -> Result<T, Failure> {
    enter(Stage::Writing);
    let mut conn = pool.acquire().await.map_err(outbox::Error::from)?;
    let mut tx = if outbox::pooler::is_marked(pool) {
        conn.begin_with(outbox::pooler::BEGIN).await
    } else {
        conn.begin().await
    }
    .map_err(not_written)?;
    let value = write(&mut tx).await.map_err(|e| match e {
        outbox::Error::Database(db) => not_written(db),
        other => Failure::from(other),
    })?;
    // None when the write wrote nothing (emit_once of an id seen before):
    // then COMMIT has nothing to lose.
    let xid: Option<String> = sqlx::query_scalar("SELECT pg_current_xact_id_if_assigned()::text")
        .fetch_one(&mut *tx)
        .await
        .map_err(not_written)?;
    enter(Stage::Idle);
    let Some(xid) = xid else {
        tx.commit().await.map_err(not_written)?;
        return Ok(value);
    };
    let write = describe(&value);
    tracing::info!(xid, "committing {}", write.what);
    let doubt = format!(
        "the outcome of {} (transaction {xid}) is unknown: it may have been written; {}",
        write.what, write.retry
    );
    enter(Stage::Committing(doubt.clone()));
    let committed = tx.commit().await;
    if committed.is_err() {
        // Not back into the pool: the resolving queries need a good one
        // (a command's pool may hold a single connection).
        drop(conn.detach());
    }
    let outcome = match committed {
        Ok(()) => Ok(value),
        Err(e) if is_unreachable(&e) => match resolve(pool, &xid).await {
            Some(true) => {
                tracing::warn!(xid, error = %e, "the connection failed during COMMIT, but {} committed", write.what);
                Ok(value)
            }
            Some(false) => Err(Failure::unreachable(format!(
                "the connection failed before {} committed, and nothing was written \
                 (transaction {xid} aborted): {e}; running the command again is safe",
                write.what
            ))),
            None => Err(Failure {
                code: EXIT_OUTCOME_UNKNOWN,
                message: format!("{doubt} ({e})"),
            }),
        },
        // The server answered: the transaction did not commit.
        Err(e) => Err(Failure::from(outbox::Error::from(e))),
    };
    enter(Stage::Idle);
    outcome
}

/// A failure before COMMIT was sent: the server rolls the transaction back
/// whatever happened to the connection.
fn not_written(e: sqlx::Error) -> Failure {
    let mut failure = Failure::from(outbox::Error::from(e));
    failure.message.push_str(" (nothing was written)");
    failure
}

/// Whether transaction `xid` committed, asked on new connections until
/// the server knows or [`RESOLVE_WITHIN`] runs out (`None`).
async fn resolve(pool: &PgPool, xid: &str) -> Option<bool> {
    let deadline = tokio::time::Instant::now() + RESOLVE_WITHIN;
    let mut pause = Duration::from_millis(50);
    loop {
        let status = tokio::time::timeout_at(deadline, async {
            outbox::pooler::on(pool, async |conn| {
                sqlx::query_scalar::<_, Option<String>>("SELECT pg_xact_status($1::text::xid8)")
                    .bind(xid)
                    .fetch_one(conn)
                    .await
            })
            .await
        })
        .await;
        match status {
            Err(_) => return None,
            Ok(Ok(Some(s))) if s == "committed" => return Some(true),
            Ok(Ok(Some(s))) if s == "aborted" => return Some(false),
            // "in progress": the server is still ending the session that
            // ran it. None: too old to know, which cannot be this one.
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => return None,
            Ok(Err(e)) => tracing::debug!(error = %e, "asking for the transaction's outcome"),
        }
        if tokio::time::Instant::now() + pause >= deadline {
            return None;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
