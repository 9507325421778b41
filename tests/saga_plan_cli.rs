//! `twopc saga plan FILE` runs the planner on the documented example log and refuses bad input
//! with a message, not a panic.

use std::process::Command;

fn twopc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_twopc"))
}

#[test]
fn the_documented_example_plans_reverse_compensation_of_what_succeeded() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/saga-plan-example.json");
    let out = twopc().args(["saga", "plan", example]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["decision"], "compensate");
    // The duplicate success of reserve and the retried charge give one undo each, newest first;
    // ship failed and email never ran: neither is compensated.
    assert_eq!(plan["compensate"], serde_json::json!(["charge", "reserve"]));
    assert_eq!(plan["reconcile"], serde_json::json!([]));
}

#[test]
fn a_file_that_is_not_a_log_is_an_error_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(
        &path,
        r#"{"steps":[{"name":"a"}],"log":[{"step":"b","event":"succeeded"}]}"#,
    )
    .unwrap();
    let out = twopc().args(["saga", "plan"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"b\""));
}
