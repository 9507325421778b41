//! `twopc demo --ha` end to end, shortened: the real command starts etcd, a coordinator group
//! of two and the participants, kills the leader under load, and must exit 0 with a summary
//! that shows the follower taking over, the workload committing through it, the old leader
//! back in sync, and every invariant holding. Speed is never asserted. These fail, never skip,
//! without etcd (CI installs etcd-server).

use std::process::Command;

fn twopc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_twopc"))
}

#[test]
fn demo_ha_fails_over_to_the_follower_and_audits_clean() {
    let dir = tempfile::tempdir().unwrap();
    let output = twopc()
        .args([
            "demo",
            "--ha",
            "--seconds",
            "6",
            "--concurrency",
            "8",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "demo --ha failed ({:?}):\n{stdout}\n{stderr}\n{}",
        output.status,
        coordinator_logs(&dir.path().join("ha").join("logs"))
    );
    for expected in [
        "node-a leads at",
        "SIGKILL to the leader node-a",
        ">>> failover: node-b leads now",
        "node-a is in node-b's sync set again",
        "new leader (elected through etcd)          node-b after",
        "no answer (outcome unknown to client)      0",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
    // The workload went on through the new leader, not only before the kill.
    let through = stdout
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("orders committed through each node")
        })
        .unwrap_or_else(|| panic!("no per-node line in:\n{stdout}"));
    let after: u64 = through
        .rsplit("node-b ")
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count for node-b in {through:?}"));
    assert!(after > 0, "nothing committed through node-b: {through:?}");
    assert_eq!(stdout.matches("[ok  ]").count(), 7, "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

#[test]
fn demo_ha_without_etcd_names_the_package_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let output = twopc()
        .args(["demo", "--ha", "--data-dir"])
        .arg(dir.path())
        .env("TWOPC_ETCD", dir.path().join("no-etcd-here"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("etcd-server"), "{stderr}");
    // Nothing was started: the group's directory was never made.
    assert!(!dir.path().join("ha").exists());
}

/// The end of every coordinator's log, for a failure message (the directory goes with the test).
fn coordinator_logs(dir: &std::path::Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("coordinator") {
            continue;
        }
        let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        text.push_str(&format!("--- {name} (last 40 lines)\n{tail}\n"));
    }
    text
}
