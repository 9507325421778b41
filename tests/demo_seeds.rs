//! `twopc demo --write-seeds DIR`: the participants' seed files, for clusters started by other
//! means (the docker image writes its own with it).

use std::process::{Command, Stdio};

fn write_seeds(dir: &std::path::Path, stdout: Stdio) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_twopc"))
        .args(["demo", "--write-seeds"])
        .arg(dir)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .expect("run twopc")
}

fn assert_every_seed_written(dir: &std::path::Path) {
    for name in ["inventory", "payments", "shipping"] {
        let text = std::fs::read(dir.join(format!("{name}.json"))).expect(name);
        let seed: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert!(seed.is_object(), "{name}: {seed}");
    }
}

#[test]
fn every_seed_is_written_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = write_seeds(dir.path(), Stdio::piped());
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_every_seed_written(dir.path());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert!(stdout.lines().all(|l| l.starts_with("wrote ")), "{stdout}");
}

/// `twopc demo --write-seeds DIR | head -1`: the reader is gone before the names are printed.
/// Every file is still written, and the command still succeeds (it panicked after the first).
#[test]
fn a_reader_that_went_away_costs_no_seed_and_no_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = write_seeds(dir.path(), Stdio::from(writer));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_every_seed_written(dir.path());
}
