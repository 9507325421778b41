//! What `twopc wal verify --json` says of a log directory, for tests that kill a service and
//! look at the log it left.

use std::path::Path;

/// The live (last) segment's size on disk and its records' bytes: equal for plain appends,
/// the size larger by the zeros filled ahead otherwise.
pub fn last_segment_sizes(data_dir: &Path) -> (u64, u64) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_twopc"))
        .args(["wal", "verify", "--json"])
        .arg(data_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let last = summary["segments"]
        .as_array()
        .and_then(|segments| segments.last())
        .unwrap_or_else(|| panic!("no segment in {summary}"));
    (
        last["bytes"].as_u64().unwrap(),
        last["record_bytes"].as_u64().unwrap(),
    )
}
