//! `twopc demo --fencing` end to end: the real command starts its cluster and two worker
//! processes, plays the paused-holder story, and must exit 0 with a summary that shows the
//! stale write refused, a forged token (2^64-1, no proof) refused `invalid_fence_proof`, and
//! B's value stored. Speed is never asserted.

use std::process::Command;

#[test]
fn demo_fencing_shows_the_paused_holder_refused_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_twopc"))
        .args(["demo", "--fencing", "--data-dir"])
        .arg(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "demo --fencing failed ({:?}):\n{stdout}\n{stderr}",
        output.status
    );
    // A fresh data directory: the first grant is token 1, the next holder's is 2.
    for expected in [
        "A 1, B 2",
        "refused: 409 stale_token, highest 2",
        "\"worker-b-0\" (version 2)",
        "refused: 409 \"invalid_fence_proof\"",
        "the stale owner lost",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
    assert_eq!(stdout.matches("[ok  ]").count(), 7, "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}
