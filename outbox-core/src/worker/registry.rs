//! The handlers a worker runs, and the start-up checks over them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::handler::ErasedHandler;
use crate::options::validate_queue;
use crate::retry::DEFAULT_RETRY_DELAYS;
use crate::task::{RegisteredTask, find_registered};

/// A handler and what the worker needs to know about its task type.
#[derive(Clone)]
pub(crate) struct HandlerEntry {
    pub(crate) handler: Arc<dyn ErasedHandler>,
    pub(crate) retry_delays: &'static [Duration],
    /// How long one attempt may run (`#[outbox_task(timeout = ..)]`).
    pub(crate) timeout: Option<Duration>,
    pub(crate) queue: &'static str,
    pub(crate) rust_type: &'static str,
}

/// Handlers by task type.
#[derive(Clone, Default)]
pub(crate) struct Handlers {
    by_type: BTreeMap<String, HandlerEntry>,
    /// Task types given a second handler: a start-up problem.
    duplicates: Vec<(String, &'static str)>,
}

impl Handlers {
    pub(crate) fn insert(&mut self, task_type: &'static str, entry: HandlerEntry) {
        if self.by_type.contains_key(task_type) {
            self.duplicates
                .push((task_type.to_owned(), entry.rust_type));
        } else {
            self.by_type.insert(task_type.to_owned(), entry);
        }
    }

    pub(crate) fn get(&self, task_type: &str) -> Option<&HandlerEntry> {
        self.by_type.get(task_type)
    }

    /// The queues the handlers' task types run on by default.
    pub(crate) fn default_queues(&self) -> BTreeSet<&'static str> {
        self.by_type.values().map(|e| e.queue).collect()
    }

    /// Task types this worker handles, for error messages.
    pub(crate) fn known_types(&self) -> String {
        let names: Vec<&str> = self.by_type.keys().map(String::as_str).collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// The retry table for a task type, even one this worker cannot run.
    pub(crate) fn retry_delays(&self, task_type: &str) -> &'static [Duration] {
        self.get(task_type)
            .map(|e| e.retry_delays)
            .or_else(|| find_registered(task_type).map(|r| r.retry_delays))
            .unwrap_or(DEFAULT_RETRY_DELAYS)
    }

    /// Every reason the worker must not start, checked against the task
    /// types registered in the binary and the queues the worker serves.
    pub(crate) fn problems(
        &self,
        registered: &[&'static RegisteredTask],
        queues: &[(String, usize)],
        has_relays: bool,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        // A worker that only relays events serves no queue.
        if queues.is_empty() && !has_relays {
            problems.push(
                "no queue to serve: register a handler or name a queue with .queue(name, concurrency)"
                    .to_owned(),
            );
        }
        for (queue, concurrency) in queues {
            if let Err(e) = validate_queue(queue) {
                problems.push(e.to_string());
            }
            if *concurrency == 0 {
                problems.push(format!(
                    "queue {queue:?} has concurrency 0: give it at least 1"
                ));
            }
        }
        let mut by_type: BTreeMap<&str, Vec<&RegisteredTask>> = BTreeMap::new();
        for r in registered {
            by_type.entry(r.task_type).or_default().push(r);
        }
        for (task_type, regs) in &by_type {
            if regs.len() > 1 {
                let types: Vec<&str> = regs.iter().map(|r| r.rust_type).collect();
                problems.push(format!(
                    "task type {task_type:?} is registered {} times, by {}: give each payload type its own task_type",
                    regs.len(),
                    types.join(" and ")
                ));
            }
        }
        for (task_type, rust_type) in &self.duplicates {
            problems.push(format!(
                "task type {task_type:?} has two handlers (the second for {rust_type}): register one handler per task type"
            ));
        }
        let served: BTreeSet<&str> = queues.iter().map(|(q, _)| q.as_str()).collect();
        for r in registered {
            if served.contains(r.queue) && !self.by_type.contains_key(r.task_type) && !r.diagnostic
            {
                problems.push(format!(
                    "task type {:?} ({}) runs on queue {:?}, which this worker serves, but has no handler: \
                     add .handler::<{}>(...) to the worker",
                    r.task_type,
                    r.rust_type,
                    r.queue,
                    short_type_name(r.rust_type)
                ));
            }
        }
        problems
    }
}

fn short_type_name(path: &str) -> &str {
    path.rsplit("::").next().unwrap_or(path)
}
