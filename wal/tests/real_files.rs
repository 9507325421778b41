//! Recovery on the real file system (the simulated disk covers the crash cases; this checks the
//! file implementation does the same repairs).

use wal::{Durability, RecordType, Wal, WalError, WalOptions};

fn make(dir: &std::path::Path, n: u64) -> std::path::PathBuf {
    let (log, _) = Wal::open(dir, WalOptions::default()).unwrap();
    for i in 1..=n {
        log.submit(RecordType(1), vec![i as u8; 100], Durability::Forced)
            .wait_blocking()
            .unwrap();
    }
    drop(log);
    dir.join(wal::format::segment_name(1))
}

#[test]
fn a_torn_tail_is_cut_and_kept_in_a_broken_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let segment = make(tmp.path(), 3);
    let mut bytes = std::fs::read(&segment).unwrap();
    let frame = 117;
    bytes.truncate(3 * frame - 40);
    std::fs::write(&segment, &bytes).unwrap();

    let (log, recovery) = Wal::open(tmp.path(), WalOptions::default()).unwrap();
    assert_eq!(recovery.records.len(), 2);
    let torn = recovery.torn_tail.unwrap();
    assert_eq!(
        (torn.file.as_path(), torn.offset, torn.bytes),
        (segment.as_path(), 2 * frame as u64, frame as u64 - 40)
    );
    let copy = torn.broken_copy.unwrap();
    assert_eq!(std::fs::read(&copy).unwrap(), bytes[2 * frame..]);
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), 2 * frame as u64);
    assert_eq!(
        log.submit(RecordType(1), vec![9], Durability::Forced)
            .wait_blocking()
            .unwrap(),
        3
    );
}

#[test]
fn a_mid_log_flip_refuses_to_open_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let segment = make(tmp.path(), 3);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[117 + 50] ^= 4;
    std::fs::write(&segment, &bytes).unwrap();
    match Wal::open(tmp.path(), WalOptions::default()) {
        Err(WalError::Corrupt {
            file,
            offset,
            reason,
        }) => {
            assert_eq!(file, segment);
            assert_eq!(offset, 117);
            assert!(reason.starts_with("CRC mismatch"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(&segment).unwrap(), bytes);
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}
