//! The bench's workflow figures: the drain of workflows of ten no-op steps
//! (a root, a group of eight, a chord) against plain drains of as many
//! tasks, in alternating rounds at the same concurrency, and one wide
//! fan-in: how long its chord waits after its last part completed.

use std::time::Instant;

use clap::Args;
use outbox::{Step, TaskOptions, Workflow};
use serde::Serialize;

use super::{Bench, QUEUE, db};
use crate::builtin::Noop;
use crate::failure::Failure;
use crate::flags;

/// Steps of each workflow in the drain: a root, a group, a chord.
const STEPS_PER_WORKFLOW: usize = 10;

/// Workflows submitted per transaction.
const WORKFLOWS_PER_TX: usize = 50;

/// Rounds of the workflow drain, each beside a plain drain of as many
/// tasks.
const ROUNDS: usize = 4;

/// The workflow phase's flags.
#[derive(Debug, Args)]
pub(crate) struct WorkflowArgs {
    /// Steps of the workflow drain, in workflows of ten (0 skips it).
    #[arg(long, default_value_t = 20_000, value_parser = flags::count(0, 10_000_000))]
    pub(crate) workflow_steps: usize,
    /// Parts of the one wide fan-in (0 skips it).
    #[arg(long, default_value_t = 10_000, value_parser = flags::count(0, outbox::workflow::MAX_STEPS as u64 - 1))]
    pub(crate) fan_in: usize,
}

/// What the workflow phase measured.
#[derive(Debug, Serialize)]
pub(crate) struct WorkflowReport {
    steps: usize,
    submit_steps_per_s: f64,
    drain_steps_per_s: f64,
    /// The plain drains of as many tasks, alternating with the workflow
    /// drains in the same phase.
    plain_tasks_per_s: f64,
    /// A step's drain cost over a plain task's (the rate of those plain
    /// drains over the workflow drains'): 1.0 costs nothing more.
    cost_vs_plain: f64,
    /// The same against the bench's main drain (run first, on a fresh
    /// table, with more tasks).
    cost_vs_main_drain: f64,
    fan_in_parts: usize,
    fan_in_submit_s: f64,
    fan_in_drain_s: f64,
    /// From the last part's completion to the chord's completion, by the
    /// database's clock.
    fan_in_chord_after_last_part_s: f64,
}

/// Submits `workflows` workflows of the drain's shape, in transactions of
/// [`WORKFLOWS_PER_TX`]; the seconds it took.
async fn submit_workflows(bench: &Bench, workflows: usize) -> Result<f64, Failure> {
    let group: Vec<String> = (0..STEPS_PER_WORKFLOW - 2)
        .map(|i| format!("part-{i}"))
        .collect();
    let members: Vec<&str> = group.iter().map(String::as_str).collect();
    let started = Instant::now();
    let mut left = workflows;
    while left > 0 {
        let mut tx = bench.pool.begin().await.map_err(db)?;
        for _ in 0..left.min(WORKFLOWS_PER_TX) {
            let mut w = Workflow::new("bench");
            w.add_step("root", &Noop {}, step(&[]))?;
            for name in &members {
                w.add_step(name, &Noop {}, step(&["root"]))?;
            }
            w.add_step("chord", &Noop {}, step(&members))?;
            w.submit(&mut tx).await?;
        }
        tx.commit().await.map_err(db)?;
        left = left.saturating_sub(WORKFLOWS_PER_TX);
    }
    Ok(started.elapsed().as_secs_f64())
}

fn step(after: &[&str]) -> Step {
    Step::new()
        .after(after)
        .options(TaskOptions::new().queue(QUEUE))
}

pub(crate) async fn measure(bench: &Bench, main_drain: f64) -> Result<WorkflowReport, Failure> {
    let args = &bench.args.workflows;
    let workflows = args.workflow_steps.div_ceil(STEPS_PER_WORKFLOW);
    let steps = workflows * STEPS_PER_WORKFLOW;
    let (mut submit_s, mut drain_rate, mut cost, mut cost_vs_main) = (0.0, 0.0, 0.0, 0.0);
    let mut plain_rate = 0.0;
    if workflows > 0 {
        // Alternating rounds, the first kind changing each round, so that a
        // slow spell of the shared machine (a checkpoint, another process)
        // falls on both kinds alike; the main drain ran first, on a fresh
        // table, and is only the second comparison.
        // Each drain is timed from its first outcome to its last: the
        // worker's start (tens of ms) would otherwise weigh on both kinds
        // alike and pull the ratio towards 1 in short rounds.
        let rounds = ROUNDS.min(workflows);
        let (mut wf_s, mut wf_n, mut plain_s, mut plain_n) = (0.0, 0, 0.0, 0);
        for round in 0..rounds {
            let share = workflows / rounds + usize::from(round < workflows % rounds);
            let n = share * STEPS_PER_WORKFLOW;
            for kind in 0..2 {
                if (round + kind) % 2 == 0 {
                    submit_s += submit_workflows(bench, share).await?;
                    wf_s += bench.drain_count(false, n).await?.after_first;
                    wf_n += n - 1;
                } else {
                    bench.insert(n).await?;
                    plain_s += bench.drain_count(false, n).await?.after_first;
                    plain_n += n - 1;
                }
            }
        }
        drain_rate = wf_n as f64 / wf_s.max(1e-9);
        plain_rate = plain_n as f64 / plain_s.max(1e-9);
        cost = plain_rate / drain_rate.max(1e-9);
        cost_vs_main = main_drain / drain_rate.max(1e-9);
        bench.say(format!(
            "workflows: {workflows} of {STEPS_PER_WORKFLOW} steps (root, group of 8, chord): submitted at {:.0} steps/s, \
             drained at {drain_rate:.0} steps/s against {plain_rate:.0} tasks/s for as many plain tasks in \
             alternating rounds ({rounds} of each): a step costs {cost:.2}x a plain task \
             ({cost_vs_main:.2}x against the main drain; concurrency {})",
            steps as f64 / submit_s.max(1e-9),
            bench.args.concurrency
        ));
    }

    let parts = args.fan_in;
    let (mut fan_submit, mut fan_drain, mut after_last) = (0.0, 0.0, 0.0);
    if parts > 0 {
        let names: Vec<String> = (0..parts).map(|i| format!("part-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut w = Workflow::new("bench-fan-in");
        for name in &refs {
            w.add_step(name, &Noop {}, step(&[]))?;
        }
        w.add_step("chord", &Noop {}, step(&refs))?;
        let started = Instant::now();
        let mut tx = bench.pool.begin().await.map_err(db)?;
        let id = w.submit(&mut tx).await?;
        tx.commit().await.map_err(db)?;
        fan_submit = started.elapsed().as_secs_f64();
        fan_drain = bench.drain_count(false, parts + 1).await?.seconds;
        after_last = sqlx::query_scalar(include_str!("sql/fan_in_wait.sql"))
            .bind(id.0)
            .fetch_one(&bench.pool)
            .await
            .map_err(db)?;
        bench.say(format!(
            "workflows: a fan-in of {parts}: submitted in {fan_submit:.2} s, drained in {fan_drain:.2} s, \
             the chord completed {after_last:.3} s after the last part"
        ));
    }
    sqlx::raw_sql(include_str!("sql/delete_workflows.sql"))
        .execute(&bench.pool)
        .await
        .map_err(db)?;
    Ok(WorkflowReport {
        steps,
        submit_steps_per_s: steps as f64 / submit_s.max(1e-9),
        drain_steps_per_s: drain_rate,
        plain_tasks_per_s: plain_rate,
        cost_vs_plain: cost,
        cost_vs_main_drain: cost_vs_main,
        fan_in_parts: parts,
        fan_in_submit_s: fan_submit,
        fan_in_drain_s: fan_drain,
        fan_in_chord_after_last_part_s: after_last,
    })
}
