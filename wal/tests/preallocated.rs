//! Segments zero-filled ahead of their appends (`wal::PreallocatedStorage`, what `Wal::open`
//! uses), on real files: a log killed without closing leaves zeros after its last record,
//! and opening it again returns every record, reports no torn tail, gives the zeros back and
//! goes on; a roll trims the segment it closes, so no other segment ever ends in zeros.

mod support;

use std::path::Path;

use support::{payload, small_segments};
use wal::{Durability, RecordType, Wal, inspect};

fn segment_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            (name, std::fs::read(entry.path()).unwrap())
        })
        .filter(|(name, _)| name.ends_with(".wal"))
        .collect();
    files.sort();
    files
}

/// Frames back to back up to the last byte: no zeros left after the last record.
fn assert_ends_at_its_last_record(name: &str, bytes: &[u8]) {
    let mut offset = 0;
    while offset < bytes.len() {
        let frame = wal::decode_frame(&bytes[offset..])
            .unwrap_or_else(|e| panic!("{name}: at {offset} of {}: {e}", bytes.len()));
        offset += frame.frame_bytes();
    }
    assert_eq!(offset, bytes.len(), "{name}: ends at its last record");
}

fn append_forced(log: &Wal, from: u64, count: u64) {
    for i in from..from + count {
        let seq = log
            .submit(RecordType(1), payload(i, 100), Durability::Forced)
            .wait_blocking()
            .unwrap();
        assert_eq!(seq, i);
    }
}

#[test]
fn a_log_left_open_ends_in_zeros_and_reopens_with_every_record_and_no_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let live_dir = dir.path().join("live");
    let (live, _) = Wal::open(&live_dir, small_segments(4096)).unwrap();
    append_forced(&live, 1, 100);
    // As a SIGKILL leaves it (the page cache survives it): the files as they are while the log
    // is open, nothing closed or trimmed.
    let wal_dir = dir.path().join("wal");
    std::fs::create_dir(&wal_dir).unwrap();
    for entry in std::fs::read_dir(&live_dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), wal_dir.join(entry.file_name())).unwrap();
    }
    // A clean close, by contrast, trims the last segment too.
    drop(live);
    let closed = segment_files(&live_dir);
    for (name, bytes) in &closed {
        assert_ends_at_its_last_record(name, bytes);
    }

    let files = segment_files(&wal_dir);
    assert!(files.len() >= 3, "small segments rolled: {}", files.len());
    let (last, older) = files.split_last().unwrap();
    assert!(
        last.1.len() as u64 >= wal::FILL_AHEAD_BYTES,
        "the last segment is filled ahead: {} bytes",
        last.1.len()
    );
    assert!(last.1.ends_with(&[0; 64]), "and ends in zeros");
    for (name, bytes) in older {
        assert_ends_at_its_last_record(name, bytes);
    }
    // `twopc wal verify` reads it as recovery will: every record, nothing torn.
    let summary = inspect::dump(&wal_dir, |_: inspect::DumpedRecord<'_>| {}).unwrap();
    assert_eq!(summary.records, 100);
    assert_eq!(summary.torn_tail, None);

    let (log, recovery) = Wal::open(&wal_dir, small_segments(4096)).unwrap();
    assert_eq!(recovery.torn_tail, None, "zeros are not a torn tail");
    let seqs: Vec<u64> = recovery.records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
    for record in &recovery.records {
        assert_eq!(record.payload, payload(record.seq, 100));
    }
    assert!(
        !std::fs::read_dir(&wal_dir).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".broken")),
        "no .broken copy of zeros"
    );
    // Appends continue right after the last record, over the zeros given back.
    append_forced(&log, 101, 50);
    drop(log);
    let (_log, again) = Wal::open(&wal_dir, small_segments(4096)).unwrap();
    assert_eq!(again.torn_tail, None);
    let seqs: Vec<u64> = again.records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=150).collect::<Vec<_>>());
}
