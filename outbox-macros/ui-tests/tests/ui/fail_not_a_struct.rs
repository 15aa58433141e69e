use outbox::outbox_task;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "shape.draw")]
enum Shape {
    Circle,
    Square,
}

fn main() {}
