//! Periodic tasks on the CLI: `run --periodic 'NAME=SCHEDULE TYPE JSON'`
//! and `periodic list | delete`.

use clap::{Args, Subcommand};
use outbox::periodic::{PeriodicDeletion, PeriodicTask};

use crate::connect::{DbArgs, connect_operator_migrated};
use crate::failure::{Failure, names_or};

/// A `--periodic` value, split but not yet checked against the registry.
#[derive(Debug, Clone)]
pub(crate) struct PeriodicSpec {
    name: String,
    schedule: String,
    task_type: String,
    payload: String,
}

impl PeriodicSpec {
    /// The name before the `=`.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// Parses `NAME=SCHEDULE TYPE JSON`: the name up to the first `=`, the
/// JSON payload from the first `{` or `[`, the task type the word before
/// it, and the schedule everything between.
pub(crate) fn parse_spec(s: &str) -> Result<PeriodicSpec, String> {
    let usage = "write it as 'NAME=SCHEDULE TYPE JSON', for example 'nightly=0 3 * * * report.generate {\"days\": 1}' or 'sweep=every 30s cache.sweep {}'";
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} has no NAME= at the start: {usage}"))?;
    let json_at = rest.find(['{', '[']).ok_or_else(|| {
        format!("{s:?} does not end with a JSON object or array payload: {usage}")
    })?;
    let (before, payload) = rest.split_at(json_at);
    let mut words: Vec<&str> = before.split_whitespace().collect();
    let task_type = words
        .pop()
        .ok_or_else(|| format!("{s:?} has no task type before its payload: {usage}"))?;
    if words.is_empty() {
        return Err(format!("{s:?} has no schedule: {usage}"));
    }
    Ok(PeriodicSpec {
        name: name.trim().to_owned(),
        schedule: words.join(" "),
        task_type: task_type.to_owned(),
        payload: payload.trim().to_owned(),
    })
}

/// Resolves a spec against the task types linked into this binary.
pub(crate) fn resolve(spec: &PeriodicSpec) -> Result<PeriodicTask, Failure> {
    let registered = crate::task_types::registered(&spec.task_type)
        .map_err(|f| Failure::config(format!("--periodic {:?}: {}", spec.name, f.message)))?;
    serde_json::from_str::<serde_json::Value>(&spec.payload).map_err(|e| {
        Failure::config(format!(
            "--periodic {:?}: the payload is not valid JSON: {e}",
            spec.name
        ))
    })?;
    PeriodicTask::from_json(&spec.name, &spec.schedule, registered, &spec.payload)
        .map_err(|e| Failure::config(format!("--periodic {:?}: {e}", spec.name)))
}

/// `periodic` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum PeriodicCommand {
    /// Periodic tasks the cluster's leader recorded: name, schedule, the
    /// tick covered so far (enqueued, often ahead of its time; for a task
    /// declared since that tick, the point its schedule started from, which
    /// enqueued nothing), the next tick, and when the declaration was
    /// recorded.
    List(ListArgs),
    /// Forget a periodic task removed from the code: its record and the
    /// ticks it enqueued ahead, not started. Refused while the current
    /// leader declares it, unless --force.
    Delete(DeleteArgs),
}

#[derive(Debug, Args)]
pub(crate) struct DeleteArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The periodic task's name.
    name: String,
    /// Delete it even though the current leader declares it: its ticks stop
    /// until a leader records it again (at the next change of leader, if
    /// its code still declares it).
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    db: DbArgs,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(command: PeriodicCommand) -> Result<(), Failure> {
    match command {
        PeriodicCommand::List(args) => list(args).await,
        PeriodicCommand::Delete(args) => delete(args).await,
    }
}

async fn delete(args: DeleteArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let name = &args.name;
    match outbox::periodic::delete(&pool, name, args.force).await? {
        PeriodicDeletion::Deleted { ticks } => {
            println!("deleted periodic task {name} and {ticks} tick(s) it had enqueued ahead");
            Ok(())
        }
        PeriodicDeletion::NotFound => {
            let names = outbox::periodic::list(&pool)
                .await?
                .into_iter()
                .map(|p| p.name);
            Err(Failure::runtime(format!(
                "no periodic task named {name:?} (recorded: {})",
                names_or(names, "none")
            )))
        }
        PeriodicDeletion::Declared => Err(Failure::config(format!(
            "the current maintenance leader declares {name}: remove it from the workers' code \
             or --periodic flags and deploy them first (or pass --force to stop its ticks \
             until a leader records it again)"
        ))),
    }
}

async fn list(args: ListArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let all = outbox::periodic::list(&pool).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&all).map_err(Failure::runtime)?
        );
        return Ok(());
    }
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map_or_else(|| "-".to_owned(), crate::when::column)
    };
    // Ticks are enqueued ahead of their time, so the latest covered is
    // often still to come: it is not the last that ran. A new declaration
    // starts covered up to its schedule's latest point before it (that
    // tick is not enqueued). A declaration no leader has recorded since its
    // workers went (one removed from the code) shows an older DECLARED than
    // the rest.
    println!(
        "{:<24} {:<28} {:<24} {:<20} {:<20} {:<20}",
        "NAME", "SCHEDULE", "TYPE", "COVERED UP TO (UTC)", "NEXT TICK (UTC)", "DECLARED (UTC)"
    );
    for p in &all {
        println!(
            "{:<24} {:<28} {:<24} {:<20} {:<20} {:<20}",
            p.name,
            p.schedule,
            p.task_type,
            time(p.last_run),
            time(p.next_run),
            time(Some(p.declared_at))
        );
    }
    if all.is_empty() {
        println!("(none: declare them with run --periodic, or on the worker builder)");
    }
    let overdue: Vec<&str> = all
        .iter()
        .filter(|p| p.overdue)
        .map(|p| p.name.as_str())
        .collect();
    if !overdue.is_empty() {
        println!(
            "overdue: {}: no running maintenance leader enqueues them (none runs, or the leader \
             does not declare them: only the leader enqueues ticks, so declare the same periodic \
             tasks on every worker; `periodic delete` removes one no longer declared)",
            overdue.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_split_into_name_schedule_type_and_payload() {
        let s = parse_spec(r#"nightly=CRON_TZ=Europe/Paris 0 3 * * * report.generate {"days": 1}"#)
            .unwrap();
        assert_eq!(s.name, "nightly");
        assert_eq!(s.schedule, "CRON_TZ=Europe/Paris 0 3 * * *");
        assert_eq!(s.task_type, "report.generate");
        assert_eq!(s.payload, r#"{"days": 1}"#);
        let s = parse_spec("sweep=every 30s outbox.noop {}").unwrap();
        assert_eq!(
            (s.schedule.as_str(), s.task_type.as_str()),
            ("every 30s", "outbox.noop")
        );
        for bad in [
            "no-equals",
            "x=every 30s outbox.noop",
            "x={}",
            "x=outbox.noop {}",
        ] {
            assert!(parse_spec(bad).is_err(), "{bad}");
        }
    }
}
