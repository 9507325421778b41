//! Disk faults on temp files: each operation changes exactly the bytes asked, reports what was
//! there, and refuses ranges outside the file.

use std::fs;
use std::path::{Path, PathBuf};

use chaos_tests::disk_faults::{
    self, BitFlip, DiskFaultError, Truncation, ZeroFill, append_zeros, flip_bit, truncate_at,
    truncate_by, zero_range,
};

fn file_with(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap();
    path
}

fn sample() -> Vec<u8> {
    (1..=32u8).collect()
}

#[test]
fn finds_segments_and_snapshots_in_log_order() {
    let data = tempfile::tempdir().unwrap();
    let wal = disk_faults::wal_dir(data.path());
    assert_eq!(wal, data.path().join("wal"));
    fs::create_dir(&wal).unwrap();
    for name in [
        "00000000000000000010.wal",
        "00000000000000000002.wal",
        "00000000000000000002.wal.17.broken",
        "snapshot-00000000000000000009.snap",
        "snapshot-00000000000000000011.snap.tmp",
        "1.wal",
    ] {
        file_with(&wal, name, b"x");
    }
    fs::create_dir(wal.join("00000000000000000099.wal")).unwrap();
    let names = |paths: Vec<PathBuf>| -> Vec<String> {
        paths
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(
        names(disk_faults::segments(&wal).unwrap()),
        ["00000000000000000002.wal", "00000000000000000010.wal"]
    );
    assert_eq!(
        disk_faults::last_segment(&wal).unwrap(),
        Some(wal.join("00000000000000000010.wal"))
    );
    assert_eq!(
        names(disk_faults::snapshots(&wal).unwrap()),
        ["snapshot-00000000000000000009.snap"]
    );

    let empty = tempfile::tempdir().unwrap();
    assert_eq!(disk_faults::last_segment(empty.path()).unwrap(), None);
    assert!(matches!(
        disk_faults::segments(&empty.path().join("missing")),
        Err(DiskFaultError::Io { .. })
    ));
}

#[test]
fn truncate_cuts_exactly_and_returns_the_cut_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "a.wal", &sample());
    assert_eq!(
        truncate_by(&path, 5).unwrap(),
        Truncation {
            len_before: 32,
            len_after: 27,
            removed: sample()[27..].to_vec()
        }
    );
    assert_eq!(fs::read(&path).unwrap(), sample()[..27]);
    assert_eq!(
        truncate_at(&path, 10).unwrap(),
        Truncation {
            len_before: 27,
            len_after: 10,
            removed: sample()[10..27].to_vec()
        }
    );
    assert_eq!(fs::read(&path).unwrap(), sample()[..10]);
    assert!(matches!(
        truncate_by(&path, 11),
        Err(DiskFaultError::OutOfRange { file_len: 10, .. })
    ));
    assert!(matches!(
        truncate_at(&path, 11),
        Err(DiskFaultError::OutOfRange { .. })
    ));
    assert_eq!(
        fs::read(&path).unwrap(),
        sample()[..10],
        "a refused fault changes nothing"
    );
}

#[test]
fn zero_fills_a_tail_or_a_range() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "a.wal", &sample());
    assert_eq!(
        append_zeros(&path, 9000).unwrap(),
        ZeroFill {
            range: 32..9032,
            before: Vec::new()
        }
    );
    let mut expected = sample();
    expected.extend(std::iter::repeat_n(0u8, 9000));
    assert_eq!(fs::read(&path).unwrap(), expected);

    assert_eq!(
        zero_range(&path, 4..8).unwrap(),
        ZeroFill {
            range: 4..8,
            before: vec![5, 6, 7, 8]
        }
    );
    expected[4..8].fill(0);
    assert_eq!(fs::read(&path).unwrap(), expected);
    assert!(matches!(
        zero_range(&path, 9000..9033),
        Err(DiskFaultError::OutOfRange { .. })
    ));
    assert_eq!(fs::read(&path).unwrap(), expected);
}

#[test]
fn flips_exactly_one_bit() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(dir.path(), "a.wal", &sample());
    assert_eq!(
        flip_bit(&path, 3, 7).unwrap(),
        BitFlip {
            offset: 3,
            bit: 7,
            before: 4,
            after: 0x84
        }
    );
    let mut expected = sample();
    expected[3] = 0x84;
    assert_eq!(fs::read(&path).unwrap(), expected);
    assert_eq!(flip_bit(&path, 31, 0).unwrap().after, 32 ^ 1);
    expected[31] ^= 1;
    assert_eq!(fs::read(&path).unwrap(), expected);
    assert!(matches!(
        flip_bit(&path, 32, 0),
        Err(DiskFaultError::OutOfRange { .. })
    ));
    assert!(matches!(
        flip_bit(&path, 0, 8),
        Err(DiskFaultError::OutOfRange { .. })
    ));
    assert_eq!(fs::read(&path).unwrap(), expected);
}

#[test]
fn never_creates_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.wal");
    assert!(matches!(
        flip_bit(&missing, 0, 0),
        Err(DiskFaultError::Io { op: "open", .. })
    ));
    assert!(matches!(
        append_zeros(&missing, 1),
        Err(DiskFaultError::Io { .. })
    ));
    assert!(!missing.exists());
}
