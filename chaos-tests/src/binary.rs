//! Finding (and if needed building) the `twopc` binary that the tests start.
//!
//! Tests inside the root package get the plain binary from `CARGO_BIN_EXE_twopc`. Crash-point
//! tests need the binary built with `--features failpoints`; that build goes to its own target
//! directory so it never waits on the lock of the `cargo test` that is running us.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root (this crate sits one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The `twopc` binary with the crash points compiled in, built once per test process.
///
/// Panics (failing the test) when the build fails, with cargo's exit status.
pub fn failpoints_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| build("failpoints")).clone()
}

/// The plain `twopc` binary, built once per test process, for tests outside the root package.
pub fn plain_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| build("")).clone()
}

fn build(features: &str) -> PathBuf {
    let root = workspace_root();
    let target_dir = root.join("target").join(if features.is_empty() {
        "harness"
    } else {
        features
    });
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut command = Command::new(cargo);
    command
        .current_dir(&root)
        .args(["build", "--quiet", "--bin", "twopc", "--target-dir"])
        .arg(&target_dir);
    if !features.is_empty() {
        command.args(["--features", features]);
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("could not run cargo to build twopc: {e}"));
    assert!(
        status.success(),
        "building twopc (features {features:?}) failed: {status}"
    );
    let binary = target_dir.join("debug").join("twopc");
    assert!(binary.exists(), "{} missing after build", binary.display());
    binary
}
