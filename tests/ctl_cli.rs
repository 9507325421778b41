//! `twopc ctl` without a coordinator: the exit codes an operator's script relies on.

use std::process::Command;

fn ctl(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_twopc"))
        .arg("ctl")
        .args(args)
        .env_remove("TWOPC_COORDINATOR")
        .output()
        .expect("running twopc ctl");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn an_unreachable_coordinator_is_exit_code_3_naming_the_url() {
    // Port 9 (discard) on loopback: nothing listens there in the test environment.
    let (code, stderr) = ctl(&["--coordinator", "http://127.0.0.1:9", "audit"]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("cannot reach the coordinator at http://127.0.0.1:9"),
        "{stderr}"
    );
}

#[test]
fn bad_usage_is_exit_code_2() {
    let (code, stderr) = ctl(&["resolve", "order-1", "--decision", "maybe", "--reason", "x"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("maybe"), "{stderr}");
    let (code, stderr) = ctl(&["retry"]);
    assert_eq!(
        code,
        Some(2),
        "a retry names a transaction or a participant: {stderr}"
    );
}
