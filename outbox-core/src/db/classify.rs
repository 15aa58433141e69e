//! The one place that decides whether a database error is worth retrying.
//!
//! Every loop of the worker (claim, outcome, heartbeat, release, recovery,
//! cleanup, listener, leader) asks [`is_transient`]: a transient error is
//! retried with backoff on a fresh connection and never makes the worker
//! drop what it owes the database; a permanent one is about the data or the
//! statement and retrying it would fail the same way.

/// Whether `error` may go away by itself: the connection or the server was
/// lost, the server is starting, stopping or short of resources, the
/// statement lost a serialization or deadlock race, waited too long, or was
/// cancelled. Everything else (bad data, a constraint, a bug) is permanent.
pub fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        // The connection broke, timed out (our own deadlines report as
        // `Io(TimedOut)`), or its byte stream no longer makes sense.
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| transient_sqlstate(&code)),
        // Configuration, decoding, a closed pool (we are stopping), and any
        // error kind added later: retrying cannot help.
        _ => false,
    }
}

/// SQLSTATEs that describe the moment rather than the statement.
fn transient_sqlstate(code: &str) -> bool {
    match code {
        // The database was dropped under us: no retry brings it back.
        "57P04" => false,
        // serialization_failure, transaction_rollback, deadlock_detected,
        // statement_completion_unknown, lock_not_available,
        // read_only_sql_transaction (a failover left us on a standby),
        // system_error, io_error.
        "40000" | "40001" | "40P01" | "40003" | "55P03" | "25006" | "58000" | "58030" => true,
        // Class 08 connection exception, 53 insufficient resources, 57
        // operator intervention (admin shutdown, crash shutdown, cannot
        // connect now, query_canceled by statement_timeout).
        _ => matches!(code.get(..2), Some("08" | "53" | "57")),
    }
}

/// Whether PostgreSQL aborted the transaction to break a deadlock or a
/// serialization conflict: running it again, from its start, may succeed.
pub(crate) fn lost_a_race(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| code == "40P01" || code == "40001"))
}

/// Whether a statement stopped waiting for a lock: its `lock_timeout`
/// passed, or PostgreSQL broke a deadlock it was part of. What it waited
/// for is held elsewhere, for now; the whole transaction may succeed later.
pub(crate) fn lock_wait_cut_short(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| code == "55P03" || code == "40P01"))
}

/// Whether `error` says the session itself is gone, not only the
/// statement: the connection broke or timed out, or the server ended the
/// session (admin or crash shutdown, or not accepting sessions). Sessions
/// opened to the same server before it most likely went with it: a
/// restart or failover ends them all at once.
pub(crate) fn is_session_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

/// The error our client-side deadlines report: an I/O timeout, so it is
/// classified (and logged) like the network fault it almost always is.
pub(crate) fn deadline_exceeded(what: &str, deadline: std::time::Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no answer from the database within {deadline:?} ({what}); the connection was discarded"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_split_by_what_they_describe() {
        for code in [
            "08006", "08001", "57P01", "57P02", "57P03", "57014", "53300", "53100", "40001",
            "40P01", "55P03", "25006", "58030",
        ] {
            assert!(transient_sqlstate(code), "{code} is transient");
        }
        for code in [
            "23505", "23514", "22P05", "22021", "42P01", "42703", "57P04", "XX000", "0A000", "",
        ] {
            assert!(!transient_sqlstate(code), "{code} is permanent");
        }
    }

    #[test]
    fn client_side_failures_are_transient_and_data_errors_are_not() {
        assert!(is_transient(&deadline_exceeded(
            "claim",
            std::time::Duration::from_secs(1)
        )));
        assert!(is_transient(&sqlx::Error::PoolTimedOut));
        assert!(is_transient(&sqlx::Error::Protocol("garbled".into())));
        assert!(!is_transient(&sqlx::Error::RowNotFound));
        assert!(!is_transient(&sqlx::Error::PoolClosed));
        assert!(!is_transient(&sqlx::Error::ColumnNotFound("id".into())));
    }

    #[test]
    fn a_lost_session_is_told_from_a_failed_statement() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(is_session_lost(&sqlx::Error::Io(reset)));
        assert!(is_session_lost(&sqlx::Error::Protocol("garbled".into())));
        // Transient, but the session is fine: a retry on it may succeed.
        assert!(!is_session_lost(&sqlx::Error::PoolTimedOut));
        assert!(!is_session_lost(&sqlx::Error::RowNotFound));
    }
}
