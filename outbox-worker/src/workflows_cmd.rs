//! `workflows list`, `workflows show ID` and `workflows cancel ID`.

use clap::{Args, Subcommand};
use outbox::WorkflowId;
use outbox::workflow::{self, WorkflowStatus};

use crate::connect::{DbArgs, connect_operator_migrated};
use crate::failure::Failure;

/// The states `workflows list --state` accepts; `cancelled` picks the
/// workflows an operator cancelled, whatever state they ended in.
const STATES: [&str; 7] = [
    "running",
    "completed",
    "failed",
    "compensating",
    "compensated",
    "compensation_failed",
    "cancelled",
];

/// `workflows` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum WorkflowsCommand {
    /// The latest workflows, newest first, with their state and open steps.
    List(ListArgs),
    /// One workflow's steps: state, dependencies, task, last error.
    Show(ShowArgs),
    /// Cancel a workflow: waiting steps never run, released tasks are
    /// cancelled, and a saga compensates what completed.
    Cancel(ShowArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Only workflows in this state (`cancelled`: those an operator cancelled).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(STATES))]
    state: Option<String>,
    /// At most this many (1 to 10000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    limit: i64,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The workflow id.
    id: i64,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(command: WorkflowsCommand) -> Result<(), Failure> {
    match command {
        WorkflowsCommand::List(args) => list(args).await,
        WorkflowsCommand::Show(args) => show(args).await,
        WorkflowsCommand::Cancel(args) => cancel(args).await,
    }
}

async fn list(args: ListArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let all = workflow::list(&pool, args.state.as_deref(), args.limit).await?;
    if args.json {
        return print_json(&all);
    }
    println!(
        "{:<10} {:<24} {:<32} {:>6} {:>6} {:<20}",
        "ID", "NAME", "STATE", "STEPS", "OPEN", "CREATED (UTC)"
    );
    for w in &all {
        // A cancel shows beside what the workflow became ("failed" alone
        // read as a step's death).
        let state = if w.cancelled_at.is_some() {
            format!("{} (cancelled)", w.state)
        } else {
            w.state.clone()
        };
        println!(
            "{:<10} {:<24} {:<32} {:>6} {:>6} {:<20}",
            w.id,
            w.name,
            state,
            w.steps,
            w.open_steps,
            crate::when::column(w.created_at)
        );
    }
    if all.is_empty() {
        println!("(none)");
    }
    Ok(())
}

async fn show(args: ShowArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let Some(status) = workflow::workflow_status(&pool, WorkflowId(args.id)).await? else {
        return Err(Failure::runtime(format!("no workflow with id {}", args.id)));
    };
    if args.json {
        return print_json(&status);
    }
    print_status(&status);
    Ok(())
}

async fn cancel(args: ShowArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let Some(report) = workflow::cancel(&pool, WorkflowId(args.id)).await? else {
        return Err(Failure::runtime(format!("no workflow with id {}", args.id)));
    };
    if args.json {
        return print_json(&report);
    }
    if report.steps_cancelled == 0 && report.tasks_cancelled == 0 {
        // Nothing was left to cancel: say why, rather than print zeros.
        let status = workflow::workflow_status(&pool, WorkflowId(args.id)).await?;
        if let Some(w) = status.map(|s| s.workflow)
            && w.finished_at.is_some()
        {
            println!(
                "workflow {} had already ended ({}): nothing to cancel",
                args.id, w.state
            );
            return Ok(());
        }
    }
    let (steps, tasks) = (report.steps_cancelled, report.tasks_cancelled);
    println!(
        "workflow {}: {steps} waiting step{} cancelled, {tasks} task{} cancelled or asked to stop",
        args.id,
        if steps == 1 { "" } else { "s" },
        if tasks == 1 { "" } else { "s" },
    );
    Ok(())
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<(), Failure> {
    println!(
        "{}",
        serde_json::to_string_pretty(value).map_err(Failure::runtime)?
    );
    Ok(())
}

fn print_status(s: &WorkflowStatus) {
    let w = &s.workflow;
    println!("workflow  {} ({})", w.id, w.name);
    println!("state     {}", w.state);
    println!("steps     {} ({} open)", w.steps, w.open_steps);
    println!("created   {}", crate::when::at(w.created_at));
    if let Some(at) = w.cancelled_at {
        println!("cancelled {}", crate::when::at(at));
    }
    if let Some(at) = w.finished_at {
        println!("finished  {}", crate::when::at(at));
    }
    println!();
    println!(
        "{:<24} {:<10} {:<12} {:<10} {:<24} AFTER / NOTE",
        "STEP", "STATE", "TASK STATE", "TASK", "TYPE"
    );
    for step in &s.step_list {
        // Labelled parts, so that a step's own error does not read as its
        // parent's.
        let mut parts = Vec::new();
        if !step.after.is_empty() {
            parts.push(format!("after {}", step.after.join(",")));
        }
        if let Some(undone) = &step.compensates {
            parts.push(format!("undoes {undone}"));
        }
        if let Some(due) = step.due_at.filter(|d| *d > chrono::Utc::now()) {
            parts.push(format!("due {}", crate::when::at(due)));
        }
        if let Some(error) = &step.last_error {
            parts.push(format!("error: {error}"));
        }
        let note = if parts.is_empty() {
            "-".to_owned()
        } else {
            parts.join("; ")
        };
        println!(
            "{:<24} {:<10} {:<12} {:<10} {:<24} {}",
            step.name,
            step.state,
            step.task_state.as_deref().unwrap_or("-"),
            step.task_id.map_or("-".to_owned(), |t| t.to_string()),
            step.task_type,
            note
        );
    }
}
