//! Exit codes and the failure every command returns: what to tell the
//! operator, and the code to exit with.

/// Exit code: a runtime failure.
pub const EXIT_RUNTIME: u8 = 1;
/// Exit code: bad configuration, flags or input (clap uses it for bad flags).
pub const EXIT_CONFIG: u8 = 2;
/// Exit code: the database could not be reached.
pub const EXIT_DATABASE_UNREACHABLE: u8 = 3;
/// Exit code: the database schema is behind this build; run `migrate`.
pub const EXIT_SCHEMA_BEHIND: u8 = 4;
/// Exit code: the connection failed while a write was committing and its
/// outcome could not be learnt; the message names the write's id and the
/// retry that is safe.
pub const EXIT_OUTCOME_UNKNOWN: u8 = 5;

/// A failed command: what to tell the operator, and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn runtime(message: impl std::fmt::Display) -> Self {
        Self {
            code: EXIT_RUNTIME,
            message: message.to_string(),
        }
    }

    pub(crate) fn config(message: impl std::fmt::Display) -> Self {
        Self {
            code: EXIT_CONFIG,
            message: message.to_string(),
        }
    }

    pub(crate) fn unreachable(message: impl std::fmt::Display) -> Self {
        Self {
            code: EXIT_DATABASE_UNREACHABLE,
            message: message.to_string(),
        }
    }
}

impl From<outbox::Error> for Failure {
    fn from(e: outbox::Error) -> Self {
        match e {
            outbox::Error::Startup(_)
            | outbox::Error::InvalidOption(_)
            | outbox::Error::InvalidPayload { .. }
            | outbox::Error::InvalidEvent(_)
            | outbox::Error::InvalidWorkflow(_)
            | outbox::Error::Serialize { .. } => Self::config(e),
            outbox::Error::Database(ref db) if crate::connect::is_unreachable(db) => {
                Self::unreachable(format!("cannot reach the database: {db}"))
            }
            other => Self::runtime(other),
        }
    }
}

/// Names for a refusal's "there are: ..." part: joined, or `empty` when
/// there are none.
pub(crate) fn names_or(names: impl IntoIterator<Item = String>, empty: &str) -> String {
    let names: Vec<String> = names.into_iter().collect();
    if names.is_empty() {
        empty.to_owned()
    } else {
        names.join(", ")
    }
}
