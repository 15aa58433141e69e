use outbox::outbox_task;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "report.generate", queu = "reports")]
struct GenerateReport {
    month: u32,
}

fn main() {}
