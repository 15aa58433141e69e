use outbox::outbox_task;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "a.b", unique_by = ["order"])]
struct UnknownField {
    order_id: i64,
}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "a.c", unique_states = ["pending", "completed"])]
struct PartialLiveStates {}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "a.d", unique_period = "10ms")]
struct TooShort {}

fn main() {}
