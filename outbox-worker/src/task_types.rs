//! Looking up a task type by name for the commands that take one
//! (`tasks submit`, `run --periodic`).

use outbox::RegisteredTask;

use crate::failure::Failure;

/// The registered task type `name`, or a configuration error (exit 2)
/// listing the ones this binary knows.
pub(crate) fn registered(name: &str) -> Result<&'static RegisteredTask, Failure> {
    outbox::find_registered(name).ok_or_else(|| {
        let known: Vec<&str> = outbox::registered_tasks()
            .iter()
            .map(|r| r.task_type)
            .collect();
        Failure::config(format!(
            "unknown task type {name:?}; this binary knows: {}",
            known.join(", ")
        ))
    })
}
