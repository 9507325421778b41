//! Running out of file descriptors must not poison the log: a process whose descriptors are
//! all taken (by connections, say) still rolls segments, because the log holds its directory
//! handle from open and closes the old segment before it creates the new one.
//!
//! The test runs itself again as a child under `ulimit -n` (a lower limit is any process's
//! right; a test may not call setrlimit itself, unsafe code being forbidden), fills every free
//! descriptor there, and appends across several rolls.

use std::fs::File;
use std::path::Path;
use std::process::Command;

use wal::{Durability, RecordType, Wal, WalOptions};

const CHILD: &str = "TWOPC_WAL_DESCRIPTORS_CHILD";
const TEST: &str = "segments_roll_when_the_process_has_no_descriptor_left";
const RECORDS: u64 = 200;

fn options() -> WalOptions {
    WalOptions {
        // About 35 records of 100 bytes a segment: several rolls in RECORDS.
        segment_bytes_max: 4096,
        ..WalOptions::default()
    }
}

#[test]
fn segments_roll_when_the_process_has_no_descriptor_left() {
    if let Some(dir) = std::env::var_os(CHILD) {
        child(Path::new(&dir));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let output = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -n 64 && exec "$0" --exact "$1" --nocapture --test-threads=1"#)
        .arg(&exe)
        .arg(TEST)
        .env(CHILD, tmp.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the child failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let (log, recovery) = Wal::open(tmp.path(), options()).unwrap();
    assert_eq!(
        recovery.records.len() as u64,
        RECORDS,
        "every append is there"
    );
    drop(log);
    let segments = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".wal"))
        })
        .count();
    assert!(segments > 3, "the appends rolled: {segments} segments");
}

fn child(dir: &Path) {
    let (log, _) = Wal::open(dir, options()).unwrap();
    let mut taken = Vec::new();
    let exhausted = loop {
        match File::open("/dev/null") {
            Ok(file) => taken.push(file),
            Err(error) => break error,
        }
        assert!(taken.len() < 100_000, "ulimit -n did not apply");
    };
    assert_eq!(exhausted.raw_os_error(), Some(24), "EMFILE: {exhausted}");
    for i in 0..RECORDS {
        let appended = log
            .submit(RecordType(1), vec![i as u8; 100], Durability::Forced)
            .wait_blocking();
        assert!(
            appended.is_ok(),
            "append {i} with no descriptor free: {appended:?}"
        );
    }
    assert!(!log.is_poisoned());
    drop(taken);
    log.close();
}
