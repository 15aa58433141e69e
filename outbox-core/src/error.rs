//! The one error type of the library.

use std::fmt;

/// Everything that can go wrong in the outbox library.
///
/// Each variant says what went wrong and, where there is one, what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database rejected a statement or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),

    /// A payload could not be serialised to JSON; nothing was written.
    #[error("task payload of type {task_type:?} could not be serialised to JSON: {source}")]
    Serialize {
        /// The task type whose payload failed.
        task_type: String,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },

    /// A payload PostgreSQL cannot store; nothing was written.
    #[error("task payload of type {task_type:?} cannot be stored: {reason}")]
    InvalidPayload {
        /// The task type whose payload was refused.
        task_type: String,
        /// Why, and what to do instead.
        reason: String,
    },

    /// An event that cannot be emitted (a field too long or empty, a bad
    /// id or header); nothing was written.
    #[error("event refused: {0}")]
    InvalidEvent(String),

    /// A submit option is out of range; nothing was written.
    #[error("invalid task option: {0}")]
    InvalidOption(String),

    /// A workflow that cannot be submitted (a cycle, an unknown or
    /// repeated step, a bad name), or a step's question about a workflow it
    /// is not part of; nothing was written.
    #[error("workflow refused: {0}")]
    InvalidWorkflow(String),

    /// A worker refused to start. Every problem found is listed.
    #[error("the worker cannot start:\n{0}")]
    Startup(StartupProblems),

    /// A handler's transactional completion found the task no longer held
    /// by its attempt (recovered and claimed again, or cancelled): roll the
    /// transaction back.
    #[error(
        "task {0} is no longer held by this attempt (recovered, claimed again or cancelled): roll the transaction back"
    )]
    NotHeld(crate::TaskId),

    /// A task's stored result does not decode into the type asked for.
    #[error("the result of task {id} does not decode into the type asked for: {reason}")]
    ResultDecode {
        /// The task.
        id: crate::TaskId,
        /// What serde said, and the stored JSON.
        reason: String,
    },

    /// The database schema is older or newer than this build expects.
    #[error("migration error: {0}")]
    Migration(String),
}

/// The result type of the outbox library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The list of problems that stopped a worker from starting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupProblems(pub Vec<String>);

impl fmt::Display for StartupProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  - {problem}")?;
        }
        Ok(())
    }
}

/// `error`'s message followed by each of its causes' (`: cause`), for
/// errors whose own message leaves the cause out (hyper's client says
/// "client error (Connect)" for a refused connection, a failed name lookup
/// and a TLS handshake alike). A cause whose text the message already ends
/// with is not said twice (many errors, sqlx's among them, end their own
/// message with their source's).
pub(crate) fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}
