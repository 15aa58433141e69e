//! `workflows list`, `show` and `cancel` through the real binary against a
//! real PostgreSQL, and their refusals.

use outbox::Workflow;
use outbox_tests::TestDb;
use outbox_worker::builtin::{Noop, Sleep};
use serde_json::Value;

mod common;

use common::{cli, ok, stderr};

async fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(&cli(args).await)).expect("the command printed JSON")
}

#[tokio::test]
async fn workflows_are_listed_shown_and_cancelled_and_bad_flags_are_refused() {
    let db = TestDb::migrated().await;
    let at = ["--database-url", db.url.as_str()];
    let mut w = Workflow::new("nightly-export");
    w.add("extract", &Sleep { ms: 10 })
        .unwrap()
        .add_after("load", &["extract"], &Noop {})
        .unwrap();
    let id = w.submit(&mut *db.conn().await).await.unwrap();
    let id_text = id.to_string();

    let listed = json(&["workflows", "list", "--json", at[0], at[1]]).await;
    assert_eq!(listed[0]["id"], id.0);
    assert_eq!(listed[0]["name"], "nightly-export");
    assert_eq!(listed[0]["state"], "running");
    assert_eq!(listed[0]["open_steps"], 2);
    let none = json(&[
        "workflows",
        "list",
        "--state",
        "failed",
        "--json",
        at[0],
        at[1],
    ])
    .await;
    assert_eq!(none, serde_json::json!([]));

    let shown = ok(&cli(&["workflows", "show", &id_text, at[0], at[1]]).await);
    assert!(shown.contains("nightly-export"), "{shown}");
    let lines: Vec<&str> = shown.lines().collect();
    let extract = lines.iter().find(|l| l.starts_with("extract")).unwrap();
    let load = lines.iter().find(|l| l.starts_with("load")).unwrap();
    assert!(
        extract.contains("released") && extract.contains("pending"),
        "{extract}"
    );
    assert!(
        load.contains("waiting") && load.contains("after extract"),
        "{load}"
    );

    let report = json(&["workflows", "cancel", &id_text, "--json", at[0], at[1]]).await;
    assert_eq!(report["steps_cancelled"], 1);
    assert_eq!(report["tasks_cancelled"], 1);
    let shown = json(&["workflows", "show", &id_text, "--json", at[0], at[1]]).await;
    assert_eq!(shown["state"], "failed");
    assert_eq!(shown["step_list"][0]["state"], "dead");
    assert_eq!(shown["step_list"][1]["state"], "cancelled");
    let cancelled_at = shown["cancelled_at"].as_str().expect("cancelled_at");
    // A step's own error is labelled as its own, apart from its parents.
    let shown = ok(&cli(&["workflows", "show", &id_text, at[0], at[1]]).await);
    let extract = shown.lines().find(|l| l.starts_with("extract")).unwrap();
    assert!(
        extract.ends_with(" error: cancelled by an operator"),
        "{shown}"
    );
    let load = shown.lines().find(|l| l.starts_with("load")).unwrap();
    assert!(load.ends_with(" after extract"), "{shown}");
    assert!(
        shown.lines().any(|l| l.starts_with("cancelled ")
            && l.contains(&cancelled_at[..19].replace('T', " "))
            && l.ends_with(" UTC")),
        "{shown}"
    );
    // The list tells a cancelled workflow from one whose step died, and
    // picks the cancelled ones.
    let listed = ok(&cli(&["workflows", "list", at[0], at[1]]).await);
    assert!(listed.contains("failed (cancelled)"), "{listed}");
    let cancelled = json(&[
        "workflows",
        "list",
        "--state",
        "cancelled",
        "--json",
        at[0],
        at[1],
    ])
    .await;
    assert_eq!(cancelled[0]["id"], id.0, "{cancelled}");
    // Cancelled again, it says the workflow had ended instead of counting
    // zeros.
    let again = ok(&cli(&["workflows", "cancel", &id_text, at[0], at[1]]).await);
    assert!(
        again.contains(&format!(
            "workflow {id_text} had already ended (failed): nothing to cancel"
        )),
        "{again}"
    );

    for (args, code, needle) in [
        (
            vec!["workflows", "show", "987654"],
            1,
            "no workflow with id 987654",
        ),
        (
            vec!["workflows", "cancel", "987654"],
            1,
            "no workflow with id 987654",
        ),
        (
            vec!["workflows", "show", "twelve"],
            2,
            "invalid value 'twelve'",
        ),
        (
            vec!["workflows", "list", "--limit", "0"],
            2,
            "0 is not in 1..=10000",
        ),
        (
            vec!["workflows", "list", "--limit", "99999999999999999999"],
            2,
            "invalid value",
        ),
        (
            vec!["workflows", "list", "--state", "sleeping"],
            2,
            "possible values",
        ),
    ] {
        let mut args = args;
        args.extend(at);
        let out = cli(&args).await;
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
}
