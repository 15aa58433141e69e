use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox::outbox_task(task_type = "a.b", ordering_key = "acount")]
struct Misspelled {
    account: u32,
}

#[derive(Serialize, Deserialize)]
#[outbox::outbox_task(task_type = "a.c", ordering_key = "account", on_dead = "ignore")]
struct BadPolicy {
    account: u32,
}

#[derive(Serialize, Deserialize)]
#[outbox::outbox_task(task_type = "a.d", on_dead = "skip")]
struct PolicyWithoutKey {
    account: u32,
}

fn main() {}
