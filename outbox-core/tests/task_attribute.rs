//! What `#[outbox_task]` generates compiles against the real `outbox` crate
//! and carries every option through. (Its error messages are checked by
//! the compile-fail tests in outbox-macros/ui-tests/.) These tests live
//! here, not in outbox-macros: a proc-macro crate's dev-dependencies are
//! built for the host with features of their own, so depending on the
//! engine there compiled it and its whole tree twice in every test build.

use outbox::{Task, outbox_task};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "report.generate", queue = "reports", priority = 3, retry_delays = ["250ms", "1h30m"], timeout = "2m")]
struct GenerateReport {
    month: u32,
}

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

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "ledger.post", ordering_key = "account", on_dead = "skip")]
struct PostEntry {
    account: u32,
}

#[test]
fn every_option_reaches_the_task_impl() {
    assert_eq!(GenerateReport::TASK_TYPE, "report.generate");
    assert_eq!(GenerateReport::QUEUE, "reports");
    assert_eq!(GenerateReport::PRIORITY, 3);
    assert_eq!(
        GenerateReport::RETRY_DELAYS,
        [
            std::time::Duration::from_millis(250),
            std::time::Duration::from_secs(90 * 60)
        ]
    );
    assert_eq!(
        GenerateReport::TIMEOUT,
        Some(std::time::Duration::from_secs(120))
    );
    let _ = GenerateReport { month: 1 }.month;
}

#[test]
fn unique_keys_come_from_the_named_fields_only() {
    let task = SendInvoice {
        customer: "c1".into(),
        invoice: 7,
        note: "ignored".into(),
    };
    let unique = task.unique().unwrap().unwrap();
    assert_eq!(unique.key_str(), r#"["c1",7]"#);
    let _ = task.note;
    assert!(RefreshCache {}.unique().unwrap().is_some());
}

#[test]
fn the_ordering_key_and_its_dead_policy_are_carried() {
    assert_eq!(
        PostEntry { account: 42 }.ordering_key().as_deref(),
        Some("42")
    );
    const { assert!(PostEntry::DEAD_SKIPS_KEY) };
    const { assert!(!GenerateReport::DEAD_SKIPS_KEY) };
    assert_eq!(GenerateReport { month: 1 }.ordering_key(), None);
}

/// The attribute's documented example (outbox-macros/src/lib.rs), verbatim:
/// that crate cannot compile it.
#[test]
fn the_documented_example_compiles_and_holds() {
    use outbox::{Task, outbox_task};
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    #[outbox_task(task_type = "report.generate", queue = "reports", priority = 3,
                  retry_delays = ["30s", "5m", "1h"])]
    struct GenerateReport {
        month: u32,
    }

    assert_eq!(GenerateReport::QUEUE, "reports");
    assert_eq!(GenerateReport::RETRY_DELAYS.len(), 3); // three attempts
    let _ = GenerateReport { month: 1 }.month;
}
