//! What a workflow refuses before anything reaches the database.

use super::*;
use crate::TaskOptions;

#[derive(serde::Serialize, serde::Deserialize)]
#[crate::outbox_task(task_type = "test.workflow.step")]
struct StepTask {
    n: i64,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[crate::outbox_task(task_type = "test.workflow.unique", unique_by = ["n"])]
struct UniqueTask {
    n: i64,
}

fn refused(result: Result<()>) -> String {
    match result {
        Err(Error::InvalidWorkflow(reason)) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_cycle_is_named_step_by_step() {
    let mut w = Workflow::new("w");
    w.add_after("a", &["c"], &StepTask { n: 1 }).unwrap();
    w.add_after("b", &["a"], &StepTask { n: 2 }).unwrap();
    w.add_after("c", &["b"], &StepTask { n: 3 }).unwrap();
    w.add("d", &StepTask { n: 4 }).unwrap();
    let reason = refused(w.validate());
    assert!(reason.contains("cycle"), "{reason}");
    for name in ["a", "b", "c"] {
        assert!(reason.contains(name), "{reason}");
    }
    assert!(!reason.contains('d'), "{reason}");
}

#[test]
fn unknown_self_and_repeated_steps_are_refused() {
    let mut w = Workflow::new("w");
    w.add_after("a", &["ghost"], &StepTask { n: 1 }).unwrap();
    assert!(refused(w.validate()).contains("ghost"));

    let mut w = Workflow::new("w");
    w.add_after("a", &["a"], &StepTask { n: 1 }).unwrap();
    assert!(refused(w.validate()).contains("itself"));

    let mut w = Workflow::new("w");
    w.add("a", &StepTask { n: 1 }).unwrap();
    let again = w.add("a", &StepTask { n: 2 }).map(|_| ());
    assert!(refused(again).contains("twice"));

    assert!(refused(Workflow::new("w").validate()).contains("no step"));
    assert!(
        refused(
            Workflow::new("")
                .add("a", &StepTask { n: 1 })
                .unwrap()
                .validate()
        )
        .contains("name")
    );
}

#[test]
fn names_uniqueness_and_compensations_are_checked_when_added() {
    let mut w = Workflow::new("w");
    for bad in ["", "undo:x", "a b", &"x".repeat(MAX_NAME + 1)] {
        assert!(
            refused(w.add(bad, &StepTask { n: 1 }).map(|_| ())).contains("name"),
            "{bad:?}"
        );
    }
    // A name far too long is quoted by its start only.
    let message = refused(w.add(&"y".repeat(10_000), &StepTask { n: 1 }).map(|_| ()));
    assert!(
        message.contains("got 10000") && message.len() < 400,
        "{message}"
    );
    assert!(refused(w.add("u", &UniqueTask { n: 1 }).map(|_| ())).contains("unique"));
    let keyed = Step::new().options(TaskOptions::new().unique(crate::Unique::key("k")));
    assert!(refused(w.add_step("k", &StepTask { n: 1 }, keyed).map(|_| ())).contains("uniqueness"));
    assert!(refused(w.compensate("nope", &StepTask { n: 1 }).map(|_| ())).contains("nope"));
    w.add("a", &StepTask { n: 1 }).unwrap();
    w.compensate("a", &StepTask { n: 2 }).unwrap();
    assert!(refused(w.compensate("a", &StepTask { n: 3 }).map(|_| ())).contains("already"));
    assert_eq!(w.len(), 1);
    w.validate().unwrap();
}

#[test]
fn a_diamond_and_a_wide_chord_are_valid() {
    let mut w = Workflow::new("diamond");
    w.add("top", &StepTask { n: 0 }).unwrap();
    w.add_after("left", &["top"], &StepTask { n: 1 }).unwrap();
    w.add_after("right", &["top", "top"], &StepTask { n: 2 })
        .unwrap();
    w.add_after("bottom", &["left", "right"], &StepTask { n: 3 })
        .unwrap();
    w.validate().unwrap();

    let mut chord = Workflow::new("chord");
    let names: Vec<String> = (0..10_000).map(|i| format!("part-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        chord.add(name, &StepTask { n: i as i64 }).unwrap();
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    chord.add_after("sum", &refs, &StepTask { n: -1 }).unwrap();
    chord.validate().unwrap();
}
