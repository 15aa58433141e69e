use outbox::{Task, outbox_task};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "invoice.send", unique_by = ["customer", "invoice"], unique_period = "1h",
              unique_states = ["pending", "processing", "retrying", "completed"])]
struct SendInvoice {
    customer: String,
    invoice: i64,
    note: String,
}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "cache.refresh", unique_period = "5m")]
struct RefreshCache {}

fn main() {
    let task = SendInvoice { customer: "c1".into(), invoice: 7, note: "ignored".into() };
    let unique = task.unique().unwrap().unwrap();
    assert_eq!(unique.key_str(), r#"["c1",7]"#);
    let _ = task.note;
    assert!(RefreshCache {}.unique().unwrap().is_some());
}
