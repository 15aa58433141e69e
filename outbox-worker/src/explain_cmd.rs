//! `tasks explain ID`: the task, then why it is where it is.

use outbox::TaskId;
use outbox::admin;

use crate::admin_cmd::{ShowArgs, print_task};
use crate::connect::connect_operator_migrated;
use crate::failure::Failure;

pub(crate) async fn explain(args: ShowArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let Some(found) = admin::explain_task(&pool, TaskId(args.id)).await? else {
        return Err(Failure::runtime(format!("no task with id {}", args.id)));
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&found).map_err(Failure::runtime)?
        );
        return Ok(());
    }
    print_task(&found.task, &[]);
    if let Some((workflow, step)) = &found.workflow {
        println!("workflow      {workflow}, step {step} (workflows show {workflow})");
    }
    println!();
    for reason in &found.reasons {
        println!("why: {reason}");
    }
    Ok(())
}
