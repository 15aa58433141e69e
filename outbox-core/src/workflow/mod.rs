//! Workflows: graphs of tasks submitted as one unit, where a step runs only
//! once every step it depends on has completed, and sagas whose completed
//! steps are undone in reverse order when a later step dies.
//!
//! A chain is each step after the one before; a group is steps with the
//! same parents; a chord is a step after every member of a group. All are
//! shapes of one mechanism, [`Workflow::add_after`]:
//!
//! ```no_run
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Serialize, Deserialize)]
//! # #[outbox::outbox_task(task_type = "shop.charge")]
//! # struct Charge { order: i64, cents: i64 }
//! # #[derive(Serialize, Deserialize)]
//! # #[outbox::outbox_task(task_type = "shop.refund")]
//! # struct Refund { order: i64 }
//! # #[derive(Serialize, Deserialize)]
//! # #[outbox::outbox_task(task_type = "shop.reserve")]
//! # struct Reserve { order: i64 }
//! # #[derive(Serialize, Deserialize)]
//! # #[outbox::outbox_task(task_type = "shop.ship")]
//! # struct Ship { order: i64 }
//! # async fn f(pool: sqlx::PgPool) -> outbox::Result<()> {
//! use outbox::Workflow;
//! let mut checkout = Workflow::new("checkout");
//! checkout
//!     .add("charge", &Charge { order: 7, cents: 1999 })?
//!     .compensate("charge", &Refund { order: 7 })?
//!     .add_after("reserve", &["charge"], &Reserve { order: 7 })?
//!     .add_after("ship", &["reserve"], &Ship { order: 7 })?;
//! let mut tx = pool.begin().await?;
//! // ... insert the order in the same transaction ...
//! let id = checkout.submit(&mut tx).await?;
//! tx.commit().await?;
//! # let _ = id; Ok(()) }
//! ```
//!
//! The database does the bookkeeping (migration 15 says how): a step's
//! task is inserted when its last dependency completes, in the transaction
//! that records the completion, so no crash can complete a parent without
//! releasing its children.

mod context;
mod status;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;

use sqlx::PgConnection;

use crate::db::NewTask;
use crate::error::{Error, Result};
use crate::options::TaskOptions;
use crate::submit::Batch;
use crate::task::Task;

pub use status::{
    CancelReport, StepStatus, WorkflowStatus, WorkflowSummary, cancel, list, workflow_status,
};

/// The most steps one workflow may have.
pub const MAX_STEPS: usize = 100_000;

/// The longest step or workflow name, in bytes.
pub const MAX_NAME: usize = 100;

/// A workflow's id (from the database's identity column).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct WorkflowId(pub i64);

impl fmt::Display for WorkflowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a step does when one of its dependencies died (its retries used
/// up, given up, or cancelled by an operator) or was itself cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnParentDead {
    /// The step is cancelled and never runs; its own dependents see a
    /// cancelled parent. The default.
    #[default]
    Cancel,
    /// The step is skipped: it never runs, and its dependents go on as if
    /// it had completed (without a result). It is skipped as soon as the
    /// parent dies, so its dependents may start while its other parents
    /// still run.
    Skip,
    /// The step runs anyway, once its other dependencies finished.
    Run,
}

impl OnParentDead {
    fn as_sql(self) -> &'static str {
        match self {
            OnParentDead::Cancel => "cancel",
            OnParentDead::Skip => "skip",
            OnParentDead::Run => "run",
        }
    }
}

/// How one step is added: its dependencies, what their death does to it,
/// and the task options of its task (queue, priority, delay, run-at,
/// ordering key, attempts; a delay counts from the moment the step is
/// released).
#[derive(Debug, Clone, Default)]
pub struct Step {
    after: Vec<String>,
    on_parent_dead: OnParentDead,
    options: TaskOptions,
}

impl Step {
    /// A step that depends on nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs after every one of these steps completed.
    pub fn after<I, S>(mut self, steps: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.after
            .extend(steps.into_iter().map(|s| s.as_ref().to_owned()));
        self
    }

    /// What a dead dependency does to this step (default: cancel it).
    pub fn on_parent_dead(mut self, policy: OnParentDead) -> Self {
        self.on_parent_dead = policy;
        self
    }

    /// Options of the step's task. Uniqueness is refused: a step is already
    /// one of a kind, by its workflow and name.
    pub fn options(mut self, options: TaskOptions) -> Self {
        self.options = options;
        self
    }
}

/// A graph of steps to submit as one unit. See the [module docs](self).
#[derive(Debug)]
pub struct Workflow {
    name: String,
    steps: Vec<Planned>,
    index: HashMap<String, usize>,
}

#[derive(Debug)]
struct Planned {
    name: String,
    after: Vec<String>,
    on_parent_dead: OnParentDead,
    row: NewTask,
    compensation: Option<NewTask>,
}

impl Workflow {
    /// An empty workflow; `name` is for people (`workflows list`), not
    /// unique.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            steps: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Adds a step that depends on nothing: it runs as soon as the
    /// workflow is committed.
    pub fn add<T: Task>(&mut self, name: &str, task: &T) -> Result<&mut Self> {
        self.add_step(name, task, Step::new())
    }

    /// Adds a step that runs after every step in `after` completed (they
    /// may be added later; they must exist when the workflow is submitted).
    pub fn add_after<T: Task>(
        &mut self,
        name: &str,
        after: &[&str],
        task: &T,
    ) -> Result<&mut Self> {
        self.add_step(name, task, Step::new().after(after))
    }

    /// Adds a step described by `step`.
    pub fn add_step<T: Task>(&mut self, name: &str, task: &T, step: Step) -> Result<&mut Self> {
        check_name("step", name)?;
        if self.index.contains_key(name) {
            return Err(invalid(format!("step {name:?} is added twice")));
        }
        let row = single_row(task, step.options)?;
        self.index.insert(name.to_owned(), self.steps.len());
        self.steps.push(Planned {
            name: name.to_owned(),
            after: step.after,
            on_parent_dead: step.on_parent_dead,
            row,
            compensation: None,
        });
        Ok(self)
    }

    /// Declares `task` as the compensation of step `step`, added before: if
    /// a later step dies (or is cancelled) after `step` completed, the
    /// compensations of the completed steps run one at a time, the last
    /// completed step's first, each a task with its own retries.
    pub fn compensate<C: Task>(&mut self, step: &str, task: &C) -> Result<&mut Self> {
        let Some(&at) = self.index.get(step) else {
            return Err(invalid(format!(
                "compensate: step {step:?} is not in the workflow (add it first)"
            )));
        };
        if self.steps[at].compensation.is_some() {
            return Err(invalid(format!("step {step:?} already has a compensation")));
        }
        let row = single_row(task, TaskOptions::new())?;
        if row.ordering_key.is_some() {
            return Err(invalid(format!(
                "the compensation of step {step:?} has an ordering key; compensations run in the saga's own order and take none"
            )));
        }
        self.steps[at].compensation = Some(row);
        Ok(self)
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// True when the workflow has no step.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Checks what [`Workflow::submit`] checks before it writes anything:
    /// at least one step, every dependency a step of the workflow (and not
    /// the step itself), and no cycle.
    pub fn validate(&self) -> Result<()> {
        check_name("workflow", &self.name)?;
        if self.steps.is_empty() {
            return Err(invalid("the workflow has no step".to_owned()));
        }
        if self.steps.len() > MAX_STEPS {
            return Err(invalid(format!(
                "the workflow has {} steps; the most is {MAX_STEPS}",
                self.steps.len()
            )));
        }
        for step in &self.steps {
            for parent in &step.after {
                if parent == &step.name {
                    return Err(invalid(format!("step {:?} depends on itself", step.name)));
                }
                if !self.index.contains_key(parent) {
                    return Err(invalid(format!(
                        "step {:?} depends on {parent:?}, which is not a step of the workflow",
                        step.name
                    )));
                }
            }
        }
        if let Some(cycle) = self.find_cycle() {
            return Err(invalid(format!(
                "the steps form a cycle: {}",
                cycle.join(" -> ")
            )));
        }
        Ok(())
    }

    /// A cycle of dependencies, as step names from a step back to itself,
    /// or None (Kahn's algorithm; what remains unsorted holds a cycle).
    fn find_cycle(&self) -> Option<Vec<String>> {
        let n = self.steps.len();
        let mut indegree = vec![0usize; n];
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, step) in self.steps.iter().enumerate() {
            let parents: HashSet<&String> = step.after.iter().collect();
            for parent in parents {
                let p = self.index[parent];
                children[p].push(i);
                indegree[i] += 1;
            }
        }
        let mut queue: VecDeque<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
        let mut sorted = 0;
        while let Some(i) = queue.pop_front() {
            sorted += 1;
            for &c in &children[i] {
                indegree[c] -= 1;
                if indegree[c] == 0 {
                    queue.push_back(c);
                }
            }
        }
        if sorted == n {
            return None;
        }
        // Walk parents among the unsorted steps until one repeats.
        let mut at = (0..n).find(|&i| indegree[i] > 0)?;
        let mut seen: Vec<usize> = Vec::new();
        loop {
            if let Some(pos) = seen.iter().position(|&s| s == at) {
                let mut cycle: Vec<String> = seen[pos..]
                    .iter()
                    .rev()
                    .map(|&s| self.steps[s].name.clone())
                    .collect();
                cycle.push(cycle[0].clone());
                return Some(cycle);
            }
            seen.push(at);
            at = self.steps[at]
                .after
                .iter()
                .map(|p| self.index[p])
                .find(|&p| indegree[p] > 0)?;
        }
    }

    /// Writes the workflow on `conn`, inside whatever transaction is open
    /// on it, in one statement: the steps that depend on nothing become
    /// tasks at once (workers are woken at commit), the others when their
    /// dependencies complete. Nothing is written if the workflow is invalid
    /// ([`Workflow::validate`]).
    pub async fn submit(self, conn: &mut PgConnection) -> Result<WorkflowId> {
        self.validate()?;
        let n = self.steps.len();
        let mut cols = Columns::with_capacity(n);
        let mut edge_parents = Vec::new();
        let mut edge_children = Vec::new();
        for step in self.steps {
            let mut parents: Vec<String> = step.after;
            parents.sort();
            parents.dedup();
            for parent in parents {
                edge_parents.push(parent);
                edge_children.push(step.name.clone());
            }
            cols.push(step.name, step.row, step.on_parent_dead, step.compensation);
        }
        crate::trace::propagate(conn).await?;
        let id: i64 = sqlx::query_scalar(include_str!("../db/sql/submit_workflow.sql"))
            .bind(&self.name)
            .bind(cols.names)
            .bind(cols.task_types)
            .bind(cols.queues)
            .bind(cols.payloads)
            .bind(cols.priorities)
            .bind(cols.max_attempts)
            .bind(cols.run_ats)
            .bind(cols.delays_us)
            .bind(cols.ordering_keys)
            .bind(cols.skip_deads)
            .bind(cols.on_parent_deads)
            .bind(cols.compensations)
            .bind(edge_parents)
            .bind(edge_children)
            .fetch_one(conn)
            .await?;
        Ok(WorkflowId(id))
    }
}

/// The steps as the arrays submit_workflow.sql takes.
#[derive(Default)]
struct Columns {
    names: Vec<String>,
    task_types: Vec<String>,
    queues: Vec<String>,
    payloads: Vec<String>,
    priorities: Vec<i16>,
    max_attempts: Vec<i32>,
    run_ats: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    delays_us: Vec<Option<i64>>,
    ordering_keys: Vec<Option<String>>,
    skip_deads: Vec<bool>,
    on_parent_deads: Vec<&'static str>,
    compensations: Vec<Option<String>>,
}

impl Columns {
    fn with_capacity(n: usize) -> Self {
        Self {
            names: Vec::with_capacity(n),
            task_types: Vec::with_capacity(n),
            queues: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            ..Self::default()
        }
    }

    fn push(
        &mut self,
        name: String,
        row: NewTask,
        on_parent_dead: OnParentDead,
        compensation: Option<NewTask>,
    ) {
        self.names.push(name);
        self.task_types.push(row.task_type);
        self.queues.push(row.queue);
        self.payloads.push(row.payload);
        self.priorities.push(row.priority);
        self.max_attempts.push(row.max_attempts);
        self.run_ats.push(row.run_at);
        self.delays_us.push(row.delay_us);
        self.ordering_keys.push(row.ordering_key);
        self.skip_deads.push(row.skip_dead);
        self.on_parent_deads.push(on_parent_dead.as_sql());
        self.compensations.push(compensation.map(|c| {
            // The payload was serialised and checked by Batch already: it
            // is valid JSON, embedded as it is.
            let payload: Box<serde_json::value::RawValue> =
                serde_json::value::RawValue::from_string(c.payload)
                    .expect("a serialised payload is JSON");
            serde_json::json!({
                "task_type": c.task_type,
                "queue": c.queue,
                "payload": payload,
                "priority": c.priority,
                "max_attempts": c.max_attempts,
            })
            .to_string()
        }));
    }
}

/// One task as a row, through the same checks as a submit.
fn single_row<T: Task>(task: &T, options: TaskOptions) -> Result<NewTask> {
    if options.unique.is_some() {
        return Err(invalid(format!(
            "a step of type {:?} was given uniqueness; a workflow step is one of a kind by its workflow and name, and takes none",
            T::TASK_TYPE
        )));
    }
    let mut batch = Batch::new();
    batch.push_with(task, options)?;
    let row = batch.into_rows().pop().expect("one row pushed");
    if row.unique.is_some() {
        return Err(invalid(format!(
            "task type {:?} declares uniqueness (unique_by or unique_period); a workflow step is one of a kind by its workflow and name, so it cannot also be unique: use a type without it",
            T::TASK_TYPE
        )));
    }
    Ok(row)
}

/// Step and workflow names: what `workflows show` prints and handlers pass
/// to `step_result`, so plain: letters, digits, `_`, `-` and `.`.
fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(invalid(format!(
            "a {what} name must be 1 to {MAX_NAME} bytes long, got {} ({:?})",
            name.len(),
            // A name far too long is shown by its start.
            crate::task_result::excerpt(name)
        )));
    }
    if what == "step"
        && !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(invalid(format!(
            "step name {name:?}: use letters, digits, '_', '-' and '.' only"
        )));
    }
    Ok(())
}

fn invalid(reason: String) -> Error {
    Error::InvalidWorkflow(reason)
}

#[cfg(test)]
mod tests;
