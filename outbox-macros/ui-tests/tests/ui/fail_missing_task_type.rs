use outbox::outbox_task;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(queue = "reports")]
struct GenerateReport {
    month: u32,
}

fn main() {}
