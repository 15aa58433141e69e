use outbox::outbox_task;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "a.b", priority = 12)]
struct OutOfRange {}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "a.c", retry_delays = ["5 minutes"])]
struct BadDelay {}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "a.d", retry_delays = [])]
struct NoAttempts {}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "has spaces")]
struct BadName {}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "a.e", timeout = "0s")]
struct NoTime {}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "a.f", max_attempts = 0)]
struct NoTries {}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "a.g", max_attempts = "5")]
struct TextTries {}

fn main() {}
