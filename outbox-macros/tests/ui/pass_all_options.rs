use outbox::{Task, outbox_task};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "report.generate", queue = "reports", priority = 3, retry_delays = ["250ms", "1h30m"], timeout = "2m")]
struct GenerateReport {
    month: u32,
}

fn main() {
    assert_eq!(GenerateReport::TASK_TYPE, "report.generate");
    assert_eq!(GenerateReport::RETRY_DELAYS.len(), 2);
    assert_eq!(GenerateReport::TIMEOUT, Some(std::time::Duration::from_secs(120)));
    let _ = GenerateReport { month: 1 }.month;
}
