//! `twopc wal verify|dump` against real log directories, through the real binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use wal::{Durability, RecordType, Wal, WalOptions};

fn twopc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_twopc"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run twopc")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A log of `n` records, types 1..=3 cycling, payload sizes 10 + seq.
fn make_log(dir: &Path, n: u64) -> PathBuf {
    let (log, _) = Wal::open(dir, WalOptions::default()).unwrap();
    for seq in 1..=n {
        let ticket = log.submit(
            RecordType((seq % 3 + 1) as u8),
            vec![b'p'; 10 + seq as usize],
            Durability::Forced,
        );
        assert_eq!(ticket.wait_blocking().unwrap(), seq);
    }
    drop(log);
    dir.join(wal::format::segment_name(1))
}

/// Frame size of the record with this seq in `make_log`.
fn frame_bytes(seq: u64) -> u64 {
    wal::format::FRAME_OVERHEAD_BYTES as u64 + 10 + seq
}

fn offset_of(seq: u64) -> u64 {
    (1..seq).map(frame_bytes).sum()
}

#[test]
fn verify_a_clean_log_exits_zero_with_a_summary() {
    let tmp = tempfile::tempdir().unwrap();
    make_log(tmp.path(), 5);
    let out = twopc(&["wal", "verify", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("ok: "), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "5 records (seq 1..=5) in 1 segments, {} bytes\n",
            offset_of(6)
        )),
        "{stdout}"
    );
    assert!(stdout.contains("snapshot: none"), "{stdout}");
    assert!(!stdout.contains("torn"), "{stdout}");

    let out = twopc(&["wal", "verify", "--json", tmp.path().to_str().unwrap()]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["status"], "ok");
    assert_eq!(summary["records"], 5);
    assert_eq!(summary["last_seq"], 5);
}

/// What a killed service leaves: the segment's file runs on in zeros filled ahead of its
/// appends. They are not log: the summary counts the records' bytes and names the file's size
/// apart.
#[test]
fn verify_counts_the_records_bytes_not_the_zeros_filled_ahead() {
    let tmp = tempfile::tempdir().unwrap();
    let segment = make_log(tmp.path(), 5);
    let records = offset_of(6);
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), records);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes.resize(bytes.len() + 8192, 0);
    std::fs::write(&segment, &bytes).unwrap();
    let on_disk = records + 8192;

    let out = twopc(&["wal", "verify", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "5 records (seq 1..=5) in 1 segments, {records} bytes ({on_disk} bytes on disk)"
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("torn"), "{stdout}");

    let out = twopc(&["wal", "verify", "--json", tmp.path().to_str().unwrap()]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["status"], "ok");
    assert_eq!(summary["segments"][0]["record_bytes"], records);
    assert_eq!(summary["segments"][0]["bytes"], on_disk);
    assert_eq!(
        std::fs::metadata(&segment).unwrap().len(),
        on_disk,
        "verify only reads"
    );
}

#[test]
fn verify_reports_a_torn_tail_and_that_it_would_truncate_it_without_doing_so() {
    let tmp = tempfile::tempdir().unwrap();
    let segment = make_log(tmp.path(), 4);
    let full = std::fs::read(&segment).unwrap();
    let cut = full.len() - 5;
    std::fs::write(&segment, &full[..cut]).unwrap();

    let out = twopc(&["wal", "verify", tmp.path().to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a torn tail is what a crash leaves; the log opens"
    );
    let stdout = text(&out.stdout);
    let expected = format!(
        "torn tail: {} at offset {}: truncated record: frame of {} bytes but only {} bytes left; {} bytes would be truncated",
        segment.display(),
        offset_of(4),
        frame_bytes(4),
        frame_bytes(4) - 5,
        frame_bytes(4) - 5,
    );
    assert!(stdout.contains(&expected), "{stdout}\nexpected: {expected}");
    assert!(stdout.contains("3 records (seq 1..=3)"), "{stdout}");
    assert_eq!(
        std::fs::read(&segment).unwrap(),
        full[..cut],
        "verify must not modify the log"
    );
    let files = std::fs::read_dir(tmp.path()).unwrap().count();
    assert_eq!(files, 1, "verify must not create files");

    let out = twopc(&["wal", "verify", "--json", tmp.path().to_str().unwrap()]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["status"], "torn_tail");
    assert_eq!(summary["torn_tail"]["offset"], offset_of(4));
    assert_eq!(summary["torn_tail"]["would_truncate"], true);
}

#[test]
fn verify_refuses_a_mid_log_bit_flip_naming_file_offset_and_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let segment = make_log(tmp.path(), 6);
    let mut bytes = std::fs::read(&segment).unwrap();
    // A bit in the payload of record 3.
    bytes[(offset_of(3) + 20) as usize] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();

    let out = twopc(&["wal", "verify", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "stdout: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&segment.display().to_string()), "{stderr}");
    assert!(
        stderr.contains(&format!("at offset {}", offset_of(3))),
        "{stderr}"
    );
    assert!(stderr.contains("CRC mismatch"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "a valid record follows at offset {}",
            offset_of(4)
        )),
        "{stderr}"
    );
}

#[test]
fn dump_prints_one_json_line_per_record() {
    let tmp = tempfile::tempdir().unwrap();
    make_log(tmp.path(), 4);
    let out = twopc(&["wal", "dump", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for (i, line) in lines.iter().enumerate() {
        let seq = i as u64 + 1;
        assert_eq!(line["seq"], seq);
        assert_eq!(line["type"], seq % 3 + 1);
        assert_eq!(line["size"], 10 + seq);
        assert_eq!(line["offset"], offset_of(seq));
        assert_eq!(line["segment"], wal::format::segment_name(1));
    }
    let out = twopc(&["wal", "dump", "--payload", tmp.path().to_str().unwrap()]);
    let first: serde_json::Value =
        serde_json::from_str(text(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["payload"], "p".repeat(11));
}

#[test]
fn dump_after_a_checkpoint_starts_with_the_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Wal::open(tmp.path(), WalOptions::default()).unwrap();
    log.submit(RecordType(1), b"a".to_vec(), Durability::Forced)
        .wait_blocking()
        .unwrap();
    log.checkpoint(b"snapshot!".to_vec())
        .wait_blocking()
        .unwrap();
    log.submit(RecordType(2), b"b".to_vec(), Durability::Forced)
        .wait_blocking()
        .unwrap();
    drop(log);
    let out = twopc(&["wal", "dump", tmp.path().to_str().unwrap()]);
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["kind"], "snapshot");
    assert_eq!(lines[0]["seq"], 1);
    assert_eq!(lines[0]["size"], 9);
    assert_eq!(lines[1]["kind"], "record");
    assert_eq!(lines[1]["seq"], 2);
}

#[test]
fn a_missing_directory_is_an_error_not_an_empty_log() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let out = twopc(&["wal", "verify", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("nope"), "{}", text(&out.stderr));
    assert!(!missing.exists(), "verify must not create the directory");
}

#[test]
fn verify_refuses_a_length_flipped_over_the_maximum_in_the_last_record() {
    // The record was fsynced: a torn write cannot leave a length over the maximum followed by
    // the rest of the record, so cutting it as a torn tail could forget a commit decision.
    let tmp = tempfile::tempdir().unwrap();
    let segment = make_log(tmp.path(), 4);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[(offset_of(4) + 3) as usize] ^= 0x40;
    std::fs::write(&segment, &bytes).unwrap();

    let out = twopc(&["wal", "verify", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "stdout: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{} at offset {}: length",
            segment.display(),
            offset_of(4)
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("exceeds the maximum") && stderr.contains("a torn write cannot leave"),
        "{stderr}"
    );
    assert!(!text(&out.stdout).contains("would be truncated"));
}

/// A service data directory as a coordinator or participant leaves it: `LOCK` and `wal/`.
fn make_data_dir(data: &Path, records: u64) -> PathBuf {
    std::fs::write(data.join("LOCK"), b"").unwrap();
    make_log(&data.join("wal"), records)
}

#[test]
fn verify_on_a_data_dir_checks_the_log_inside_it() {
    let tmp = tempfile::tempdir().unwrap();
    make_data_dir(tmp.path(), 5);
    let wal_dir = tmp.path().join("wal");
    let out = twopc(&["wal", "verify", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with(&format!(
            "ok: {}: 5 records (seq 1..=5) in 1 segments",
            wal_dir.display()
        )),
        "{stdout}"
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("checking its log in {}", wal_dir.display())),
        "{stderr}"
    );

    let out = twopc(&["wal", "verify", "--json", tmp.path().to_str().unwrap()]);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["records"], 5);
    assert_eq!(summary["dir"], wal_dir.display().to_string());
}

#[test]
fn verify_on_a_data_dir_with_a_corrupt_log_exits_4_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let segment = make_data_dir(tmp.path(), 6);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[(offset_of(3) + 20) as usize] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();

    let out = twopc(&["wal", "verify", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "stdout: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "corrupt write-ahead log: {} at offset {}",
            segment.display(),
            offset_of(3)
        )),
        "{stderr}"
    );
    assert!(!text(&out.stdout).contains("ok"), "{}", text(&out.stdout));
}

#[test]
fn dump_on_a_data_dir_prints_the_records_of_the_log_inside_it() {
    let tmp = tempfile::tempdir().unwrap();
    make_data_dir(tmp.path(), 3);
    let out = twopc(&["wal", "dump", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert!(
        lines
            .iter()
            .all(|l| l["segment"] == wal::format::segment_name(1)),
        "{lines:?}"
    );
}

/// `wal verify` and `wal dump` on `dir`: both must refuse with "no log found in <dir>".
fn assert_no_log_found(dir: &Path) {
    for command in ["verify", "dump"] {
        let out = twopc(&["wal", command, dir.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(3),
            "wal {command}: {}",
            text(&out.stdout)
        );
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("no log found in {}", dir.display())),
            "wal {command}: {stderr}"
        );
        assert!(
            text(&out.stdout).is_empty(),
            "wal {command}: {}",
            text(&out.stdout)
        );
    }
}

#[test]
fn an_empty_or_unrelated_directory_is_no_log_not_an_empty_one() {
    let empty = tempfile::tempdir().unwrap();
    assert_no_log_found(empty.path());
    assert_eq!(
        std::fs::read_dir(empty.path()).unwrap().count(),
        0,
        "nothing may be created"
    );

    let unrelated = tempfile::tempdir().unwrap();
    for name in ["notes.txt", "1.wal", "00000000000000000001.wal.0.broken"] {
        std::fs::write(unrelated.path().join(name), b"not a log").unwrap();
    }
    std::fs::create_dir(unrelated.path().join("other")).unwrap();
    assert_no_log_found(unrelated.path());

    // A data directory whose wal/ holds no log file (only a leftover copy) has no log either.
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("LOCK"), b"").unwrap();
    std::fs::create_dir(data.path().join("wal")).unwrap();
    std::fs::write(
        data.path()
            .join("wal")
            .join("00000000000000000001.wal.0.broken"),
        b"x",
    )
    .unwrap();
    assert_no_log_found(data.path());
}
